import Foundation
import NIOCore
import NIOPosix
import Testing
import ThaliBeacons
import ThaliSSDP
import ThaliTestSupport

@testable import ThaliConformance

/// The `thali-node` built beside the test bundle (`swift build --build-tests` builds both).
private func thaliNode() -> String? { PackagePaths.thaliNode() }

/// `thali-node conformance probe` as a user runs it: a separate process, its output and exit status.
@Suite("thali-node conformance probe", .serialized, .enabled(if: TestEnvironment.available(thaliNode() != nil)))
struct ProbeCommandTests {
    func runProbe(_ arguments: [String]) async throws -> (status: Int32, output: String) {
        let node = try #require(thaliNode())
        let process = try ChildProcess(node, ["conformance", "probe"] + arguments)
        let status = try await process.waitForExit(timeout: .seconds(60))
        // The output pipe is drained asynchronously; give the last line a moment to arrive.
        try? await process.waitForOutput(containing: status == 64 ? "error:" : "passed", timeout: .seconds(2))
        return (status, process.output)
    }

    /// A BeaconHTTPServer on loopback serving a fresh announcement, at most 10 requests per source per `window`.
    func startServer(window: Duration) async throws -> (BeaconHTTPServer, Int) {
        var limits = BeaconHTTPServerLimits()
        limits.maxRequestsPerSource = 10
        limits.sourceWindow = window
        let server = BeaconHTTPServer(host: "127.0.0.1", limits: limits, group: MultiThreadedEventLoopGroup.singleton)
        server.setBeacons(try BeaconGenerator(identity: PrivateKey()).makeAnnouncement(
            for: [PrivateKey().publicKey], validity: .seconds(600)).stream)
        return (server, try await server.start())
    }

    @Test("against BeaconHTTPServer: a verdict line per check, one note, the tally, exit 0")
    func conformingServer() async throws {
        let (server, port) = try await startServer(window: .seconds(1))
        let (status, output) = try await runProbe(["http://127.0.0.1:\(port)", "--burst", "--burst-requests", "40",
                                                   "--burst-concurrency", "8", "--max-outage-s", "10"])
        await server.stop()
        #expect(status == 0, "\(output)")
        let lines = output.split(separator: "\n").map(String.init)
        #expect(lines.first == "probe http://127.0.0.1:\(port)/NotificationBeacons")
        #expect(lines.last == "14 passed, 0 failed", "\(output)")
        // The burst is announced before it runs, after the checks before it were printed.
        let announcement = try #require(lines.firstIndex { $0.hasPrefix("NOTE burst: 40 requests, 8 at a time") }, "\(output)")
        #expect(lines[..<announcement].contains { $0.hasPrefix("PASS keep-alive") })
        #expect(lines.filter { $0.hasPrefix("NOTE ") }.last == "NOTE \(ConformanceProbe.flagsNote)")
        #expect(lines.contains { $0.hasPrefix("PASS burst: throttled after ") }, "\(output)")
        #expect(lines.contains("N/A  empty-204: status 200"))
    }

    @Test("without --burst nothing trips the target's throttling: burst and recovery are N/A, no refusal counted")
    func burstIsOptIn() async throws {
        let (server, port) = try await startServer(window: .seconds(10))
        let (status, output) = try await runProbe(["http://127.0.0.1:\(port)"])
        let rejected = server.counters.rejectedPerSource
        await server.stop()
        #expect(status == 0, "\(output)")
        #expect(rejected == 0, "the probe tripped the per-source limit \(rejected) times:\n\(output)")
        #expect(output.contains("N/A  burst: not run"), "\(output)")
        #expect(output.split(separator: "\n").last == "12 passed, 0 failed", "\(output)")
    }

    @Test("--json against a server without Cache-Control: one object, the failure in it, exit 1")
    func jsonAndFailure() async throws {
        let stream = try BeaconGenerator(identity: PrivateKey()).makeAnnouncement(
            for: [PrivateKey().publicKey], validity: .seconds(600)).stream
        try await withBrokenServer("no-cache-control", body: stream) { location in
            let (status, output) = try await runProbe(["http://\(location.host):\(location.port)", "--json", "--no-burst"])
            #expect(status == 1, "\(output)")
            let object = try #require(
                try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any], "\(output)")
            #expect(object["failed"] as? Int == 1)
            let checks = try #require(object["checks"] as? [[String: String]])
            let keys = checks.reduce(into: Set(object.keys)) { $0.formUnion($1.keys) }
            #expect(notSnakeCase(keys).isEmpty, "one JSON style with thali-node's other outputs: \(notSnakeCase(keys))")
            #expect(checks.first { $0["id"] == "cache-control" }?["verdict"] == "FAIL")
            #expect(checks.first { $0["id"] == "burst" }?["verdict"] == "N/A")
        }
    }

    @Test("a host name, or a burst beyond its bound, is refused before any traffic",
          arguments: [["http://localhost:8080"], ["http://127.0.0.1:9", "--burst", "--burst-requests", "10001"]])
    func validation(arguments: [String]) async throws {
        let (status, output) = try await runProbe(arguments)
        #expect(status == 64, "\(output)")
        #expect(output.hasPrefix("error: ") && output.split(separator: "\n").count == 1, "one line: \(output)")
    }
}
