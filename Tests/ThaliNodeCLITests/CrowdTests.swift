import Foundation
import Testing
import ThaliTestSupport

/// A crowd on one segment (issue 12): 150 real peers, each on its own address in a network namespace
/// the benchmark creates, each with three contacts among the others and an item for each. Every item
/// must arrive exactly once, discovery must never switch off and no last-resort limit may fire. Runs the
/// real `thali-node bench crowd`.
@Suite("A crowd of 150 peers", .serialized)
struct CrowdTests {
    @Test(.enabled(if: TestEnvironment.available(TestEnvironment.canUseNetworkNamespaces)), .timeLimit(.minutes(5)))
    func crowdDeliversEverythingWithDiscoveryOn() async throws {
        let executable = CommandLineTests.executable
        let result = try await Task.detached {
            try ChildProcess.run(executable, ["bench", "crowd", "--peers", "150", "--timeout", "240", "--json"],
                                 timeout: .seconds(280))
        }.value
        let line = try #require(result.output.split(separator: "\n").last { $0.hasPrefix("{") }, "\(result.output)")
        let figures = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        #expect(result.status == 0, "\(result.output)")
        #expect(figures["peers"] as? Int == 150)
        #expect(figures["items"] as? Int == 450)
        #expect(figures["delivered"] as? Int == 450, "exactly once, counted from the inboxes: \(line)")
        #expect(figures["all_delivered_s"] is Double, "\(line)")
        #expect(figures["discovery_off_s"] as? Double == 0, "discovery never switched off: \(line)")
        // Honest peers never drive each other into a last resort (issue 24).
        #expect(figures["port_closed_s"] as? Double == 0, "no port closed: \(line)")
        #expect((figures["limits_fired"] as? [String: Int])?.isEmpty == true, "no limit fired: \(line)")
        // Each item needs its receiver to have read its sender's beacons once at least (not every pair: a
        // peer that delivered everything falls silent, and later peers never fetch it).
        #expect((figures["fetches"] as? Int ?? 0) >= 450, "the counts are reported: \(line)")
        #expect(figures["delivered_after_start_s"] is Double, "\(line)")
    }

    /// A test that times out stops the benchmark with SIGTERM; the crowd runs in a child inside the
    /// namespace, which used to inherit nothing of that and ran on (and the namespace stayed).
    @Test(.enabled(if: TestEnvironment.available(TestEnvironment.canUseNetworkNamespaces)), .timeLimit(.minutes(1)))
    func aStoppedBenchmarkLeavesNoProcessAndNoNamespace() async throws {
        let bench = try ChildProcess(CommandLineTests.executable, ["bench", "crowd", "--peers", "30", "--timeout", "60"])
        try await bench.waitForOutput(containing: "peers started", timeout: .seconds(30))
        let namespace = "thali-bench-\(bench.pid)"
        #expect(try ChildProcess.run("/usr/sbin/ip", ["netns", "list"]).output.contains(namespace))
        // The crowd's data directories live in the outer process's scratch directory while it runs.
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("\(namespace).files").path
        let during = (try? FileManager.default.contentsOfDirectory(atPath: scratch)) ?? []
        #expect(during.contains { $0.hasPrefix("thali-crowd-") }, "the crowd keeps its files in \(scratch): \(during)")
        #expect(bench.terminate() != 0, "stopped while the crowd still ran: \(bench.output)")
        let inside = try ChildProcess.run("/usr/bin/pgrep", ["-f", "bench crowd --peers 30 --contacts"])
        #expect(inside.output.isEmpty, "the crowd inside the namespace ended too")
        #expect(!(try ChildProcess.run("/usr/sbin/ip", ["netns", "list"]).output.contains(namespace)), "the namespace is gone")
        #expect(!FileManager.default.fileExists(atPath: scratch), "the crowd's data directories are gone")
    }
}
