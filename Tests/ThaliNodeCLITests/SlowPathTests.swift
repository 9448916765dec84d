import Foundation
import Testing
import ThaliNetLab
import ThaliTestSupport
@testable import ThaliNodeCore

/// Issue 38's "timeouts that scale with the measured round trip, not fixed for loopback", on the lab: a
/// path whose round trip (1.4 s) is longer than the beacon fetch's first connect wait (1 s), as a Wi-Fi
/// link behind a full upload queue has. With every wait fixed at its loopback value no fetch ever
/// connected, so the two people never found each other (`bench links --delay-ms 700` lost every item).
/// Now each attempt waits twice as long as the one before, and the round trip the kernel measured sizes
/// the next fetches' waits, so texts arrive both ways.
@Suite("The node over a path slower than its loopback timeouts", .serialized)
struct SlowPathTests {
    /// No loss, no jitter, no rate: only the delay, so that a failure is a fixed timeout's.
    static let profile = LinkProfile(name: "slow-path", delayNanoseconds: 700_000_000)

    @Test("texts arrive both ways over a 1.4 s round trip", .enabled(if: LabNodes.available), .timeLimit(.minutes(2)))
    func textsArriveOverASecondLongRoundTrip() async throws {
        let nodes = try LabNodes(profile: Self.profile, seed: 383, names: ["alice", "bob"], label: "slowpath")
        defer { nodes.close() }
        let (alice, bob) = (try nodes.people["alice"], try nodes.people["bob"])
        let expiry = Date().addingTimeInterval(600)
        let toBob = try alice.store.enqueueText("over a slow path", to: "bob", expiresAt: expiry)
        let toAlice = try bob.store.enqueueText("and back", to: "alice", expiresAt: expiry)
        let started = ContinuousClock.now
        let alicePeer = try nodes.start(0)
        let bobPeer = try nodes.start(1)
        let arrived = try await waitUntil(timeout: .seconds(60), every: .milliseconds(100)) {
            try bob.store.inbox().contains { $0.itemID == toBob.id } && alice.store.inbox().contains { $0.itemID == toAlice.id }
        }
        let seconds = (ContinuousClock.now - started) / .seconds(1)
        nodes.writeTrace()
        if !arrived { Issue.record("not delivered within 60 s\n\(nodes.report())") }
        let events = alicePeer.events + bobPeer.events
        nodes.close()
        #expect(arrived)
        #expect(try bob.store.inbox().filter { $0.itemID == toBob.id }.count == 1)
        #expect(try alice.store.inbox().filter { $0.itemID == toAlice.id }.count == 1)
        print("slow path (1.4 s round trip): both texts in \(String(format: "%.1f", seconds)) s; "
              + "\(events.filter { $0.receivedItem != nil }.count) received events")
    }

    /// A request whose first bytes come 3 s after the connection opened, as a lost first segment's
    /// retransmission does on this path (the kernel's retransmission timeout after one 1.4 s sample is
    /// 4.2 s): answered, where the fixed 2 s first-byte wait closed it. A connection that stays silent is
    /// still closed, at the wait's cap (8 s).
    @Test("the port waits for a late first segment on a slow path, and still cuts a silent connection",
          .enabled(if: LabNodes.available), .timeLimit(.minutes(1)))
    func thePortsFirstByteWaitFollowsTheConnectionsRoundTrip() async throws {
        let nodes = try LabNodes(profile: Self.profile, seed: 384, names: ["alice", "bob"], label: "slowbyte")
        defer { nodes.close() }
        let alicePeer = try nodes.start(0)
        let started = try await alicePeer.waitFor("alice started") { $0.isStarted }
        guard case .wifi(let location) = try #require(started.startedLocation) else {
            Issue.record("not a Wi-Fi location: \(started)")
            return
        }
        // Connects, waits, then asks for the beacons; prints the status line, or how the connection ended.
        let script = """
            import socket, sys, time
            s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20)
            opened = time.monotonic()
            time.sleep(float(sys.argv[3]))
            data = b""
            try:
                s.sendall(b"GET /NotificationBeacons HTTP/1.1\\r\\nHost: a\\r\\nConnection: close\\r\\n\\r\\n")
                while True:
                    chunk = s.recv(65536)
                    if not chunk: break
                    data += chunk
            except OSError as error:
                print("error", error)
            print(data.split(b"\\r\\n")[0].decode("ascii", "replace") if data else "closed unanswered",
                  "after %.1f s" % (time.monotonic() - opened))
            """
        func request(after seconds: Int) throws -> ChildProcess {
            let command = nodes.lab.command(inHost: 1, ["python3", "-c", script, location.host, String(location.port), String(seconds)])
            return try ChildProcess(command[0], Array(command.dropFirst()))
        }
        let late = try request(after: 3)
        let silent = try request(after: 14)
        _ = try await late.waitForExit(timeout: .seconds(30))
        _ = try await silent.waitForExit(timeout: .seconds(30))
        nodes.close()
        #expect(late.output.contains("HTTP/1.1 20"), "the late request: \(late.output)")
        #expect(!silent.output.contains("HTTP/1.1"), "the silent connection was held past the cap: \(silent.output)")
        print("slow path first byte: late request: \(late.output.trimmingCharacters(in: .whitespacesAndNewlines)); "
              + "silent: \(silent.output.trimmingCharacters(in: .whitespacesAndNewlines))")
    }
}
