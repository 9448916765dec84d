import Foundation
import Testing
import ThaliTestSupport

/// `thali-node bench links --json` (issue 38) in its short form: one profile (home-wifi), small sizes, two
/// hosts in network namespaces joined by the lab's wire, two real `run` processes, and texts sent one at a time
/// with `thali-node send` to the running nodes. Figures are printed, never asserted as speeds; what is
/// asserted is that every item arrived exactly once (the texts sent one at a time among them), that every key
/// scripts read is there, and that the figures are sane for the link (a round trip cannot beat twice the
/// one-way delay less the jitter; nothing moves faster than the link's rate).
@Suite("thali-node bench links", .serialized)
struct BenchLinksTests {
    static let labAvailable = TestEnvironment.available(TestEnvironment.canUseNetworkNamespaces
                                                        && FileManager.default.fileExists(atPath: "/dev/net/tun"))

    @Test("a short home-wifi run: items arrive exactly once, every key present, figures within the link's bounds",
          .enabled(if: labAvailable), .timeLimit(.minutes(2)))
    func shortHomeWifiRun() async throws {
        let executable = CommandLineTests.executable
        let arguments = ["bench", "links", "--profile", "home-wifi", "--json", "--tcp-mib", "2", "--file-mib", "1", "--texts", "200",
                         "--relay-mib", "1", "--requests", "40", "--text-requests", "10", "--timeout", "40", "--seed", "38"]
        let result = try await Task.detached { try ChildProcess.run(executable, arguments, timeout: .seconds(110)) }.value
        #expect(result.status == 0, "\(result.output)")
        let line = try #require(result.output.split(separator: "\n").last)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any], "\(result.output)")
        for key in ["profile", "tcp_mb_s", "tcp_rtt_ms", "file_mb_s", "texts_per_s", "relay_mb_s", "relay_rtt_ms", "relay_rtt_p99_ms",
                    "first_delivery_s", "lost_items", "duplicated_items", "address_changes", "file_resumes", "file_restarts",
                    "text_requests", "text_rtt_ms", "text_rtt_p99_ms", "text_rtt_count", "text_unannounced_count", "text_send_ms", "text_notice_ms",
                    "text_announced_rtt_ms"] {
            #expect(object.keys.contains(key), "\(key) missing: \(line)")
        }
        #expect(object["profile"] as? String == "home-wifi")
        #expect(object["lost_items"] as? Int == 0, "\(line)")
        #expect(object["duplicated_items"] as? Int == 0, "\(line)")
        #expect(object["file_restarts"] as? Int == 0, "\(line)")
        // The 10 texts sent one at a time: each reported delivered to its sender, and (lost_items and
        // duplicated_items above count them too) each in the receiver's inbox once.
        #expect(object["text_requests"] as? Int == 10, "\(line)")
        #expect(object["text_rtt_count"] as? Int == 10, "\(line)")
        let textRTT = try #require(object["text_rtt_ms"] as? Double, "text_rtt_ms: \(line)")
        #expect(textRTT >= 6, "text_rtt_ms \(textRTT) ms on a link of 4 ± 1 ms each way")
        #expect((object["text_rtt_p99_ms"] as? Double ?? 0) >= textRTT)
        // The texts goal ("no more than one link round trip above plain TCP's") is a timing, printed and not
        // asserted; what makes it reachable is: a text for a contact that is connected goes on the delivery
        // session that lingers, with no announcement, fetch, match or new stream (delivery version 5).
        // Before, every one of them was announced. The first may find the linger over (30 s after the
        // previous phase's last delivery, on a slow machine), and then opens the session the rest go on.
        let unannounced = try #require(object["text_unannounced_count"] as? Int, "text_unannounced_count: \(line)")
        #expect(unannounced >= 9, "only \(unannounced) of 10 texts went on the lingering session: \(line)")
        // 4 ms each way with 1 ms of jitter: no round trip under 6 ms, through the relay or not.
        for key in ["tcp_rtt_ms", "relay_rtt_ms"] {
            let value = try #require(object[key] as? Double, "\(key): \(line)")
            #expect(value >= 6, "\(key) \(value) ms on a link of 4 ± 1 ms each way")
        }
        #expect((object["relay_rtt_p99_ms"] as? Double ?? 0) >= (object["relay_rtt_ms"] as? Double ?? .infinity))
        // 40 Mbit/s is 5 MB/s: no transfer beats it; every one moved something.
        for key in ["tcp_mb_s", "file_mb_s", "relay_mb_s"] {
            let value = try #require(object[key] as? Double, "\(key): \(line)")
            #expect(value > 0 && value <= 5.0, "\(key) \(value) MB/s on a 40 Mbit/s link")
        }
        #expect((object["texts_per_s"] as? Double ?? 0) > 0)
        let firstDelivery = try #require(object["first_delivery_s"] as? Double, "\(line)")
        #expect(firstDelivery > 0 && firstDelivery < 40)
        // The lab is gone: every lab namespace left belongs to a process still running (another lab).
        let listing = try runCommand("ip", ["netns", "list"])
        #expect(Self.leftoversBelongToLiveProcesses(listing), "\(listing)")
    }

    /// Whether every lab namespace listed belongs to a process still running (another test's lab).
    static func leftoversBelongToLiveProcesses(_ listing: String) -> Bool {
        listing.split(separator: "\n").allSatisfy { line in
            guard line.hasPrefix("tlab-"), let pid = Int32(line.dropFirst(5).prefix { $0 != "-" }) else { return true }
            return kill(pid, 0) == 0
        }
    }
}
