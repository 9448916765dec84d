import Foundation
import Testing
import ThaliTestSupport

/// The hall (issue 24, `spec/ssdp.md` 7.2): 1,500 simulated peers in one process, each on its own address
/// with real beacons, announcing at the foreground rate (3,000 datagrams a second), and two real
/// `thali-node run` peers among them, contacts of each other with an item each. The hall is beyond the
/// table (1,024) and the read budget (1,000 a second): discovery must narrow, not switch off, and the two
/// must still find each other and deliver. Runs the real `thali-node bench hall`.
@Suite("A hall beyond discovery's bounds", .serialized)
struct HallTests {
    @Test(.enabled(if: TestEnvironment.available(TestEnvironment.canUseNetworkNamespaces)), .timeLimit(.minutes(3)))
    func realPeersInAHallDeliverWithinTheBound() async throws {
        let executable = CommandLineTests.executable
        let result = try await Task.detached {
            try ChildProcess.run(executable, ["bench", "hall", "--simulated", "1500", "--real", "2", "--duration", "60", "--json"],
                                 timeout: .seconds(150))
        }.value
        let line = try #require(result.output.split(separator: "\n").last { $0.hasPrefix("{") }, "\(result.output)")
        let figures = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        #expect(result.status == 0, "\(result.output)")
        #expect(figures["simulated_peers"] as? Int == 1500)
        #expect(figures["delivered"] as? Int == 2, "both items, exactly once, counted from the inboxes: \(line)")
        #expect(figures["all_delivered_s"] is Double, "\(line)")
        // The bound holds, and the hall reached it: discovery narrowed rather than tracking everyone.
        let tracked = try #require(figures["tracked_peers_max"] as? Int, "\(line)")
        #expect(tracked <= 1024, "never more tracked than maxTrackedPeers: \(line)")
        #expect(tracked > 1000, "the hall filled the table: \(line)")
        // Narrowing is not a last resort: no limit but narrowing fired, and each real peer reported its
        // narrowing (once per episode, so a few times at most in a minute).
        let fired = try #require(figures["limits_fired"] as? [String: Int], "\(line)")
        #expect(Set(fired.keys) == ["narrowed"], "only narrowing reported: \(line)")
        #expect((2...20).contains(fired["narrowed"] ?? 0), "\(line)")
        // Each simulated peer's beacons are read once at most by each real peer, however often it is
        // given up and heard again (its USN is remembered as read).
        for peer in figures["per_peer"] as? [[String: Any]] ?? [] {
            let fetches = peer["fetches"] as? Int ?? -1
            #expect((1...1500).contains(fetches), "\(peer)")
        }
        #expect((figures["datagrams_per_s"] as? Double ?? 0) > 0, "\(line)")
    }
}
