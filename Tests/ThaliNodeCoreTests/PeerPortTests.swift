import Foundation
import NIOPosix
import Testing
import ThaliBeacons
import ThaliSSDP
import ThaliTestSupport
@testable import ThaliNodeCore

/// The node's single port under attack from other processes on the same segment (issue 12): the
/// admission gate filters each abusive source before any global budget, so honest peers keep the port.
/// Attackers bind loopback source addresses of their own (127.0.0.2 ...), as separate hosts would.
@Suite("Single port under attack", .serialized, .timeLimit(.minutes(1)))
struct PeerPortTests {
    /// A python attacker: `connect_flood SOURCE PORT COUNT` opens and closes COUNT connections as fast
    /// as it can and says how many connects got no answer; `stall SOURCE PORT COUNT` opens COUNT connections that each send the first bytes of a
    /// TLS record and then nothing, and reports how many the peer kept open.
    static let attacker = """
        import socket, sys, time
        mode, source, port, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        def connect():
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((source, 0))
            s.connect(("127.0.0.1", port))
            return s
        if mode == "connect_flood":
            # A loopback connect completes in the kernel within microseconds; one that takes 20 ms got
            # no answer (the peer's kernel drops this source).
            start, timed_out = time.monotonic(), 0
            for _ in range(count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.bind((source, 0))
                s.settimeout(0.02)
                try:
                    s.connect(("127.0.0.1", port))
                except socket.timeout:
                    timed_out += 1
                except OSError:
                    pass
                s.close()
            print("flood %d connections in %.3f s; timed out %d" % (count, time.monotonic() - start, timed_out), flush=True)
        else:
            held = []
            for _ in range(count):
                try:
                    s = connect()
                    s.sendall(bytes([0x16, 0x03, 0x01, 0x00, 0x2f]))
                    held.append(s)
                except OSError:
                    pass
            time.sleep(1.5)  # kept: a held connection is one the peer has not closed after this long
            alive = 0
            for s in held:
                s.setblocking(False)
                try:
                    alive += 0 if s.recv(1) == b"" else 1
                except BlockingIOError:
                    alive += 1
                except OSError:
                    pass
            print("held %d" % alive, flush=True)
            sys.stdin.read()  # holds the connections until the test ends (closes the input or exits)
        """

    private func peer(_ person: TestPeople.Person, ssdpPort: Int) throws -> ThaliPeer {
        try loopbackPeer(person, ssdpPort: ssdpPort)
    }

    @Test("one source opening 400 connections at once is refused alone, then by the kernel; the port stays open for everyone else")
    func oneSourceCannotCloseThePort() async throws {
        let people = try TestPeople(["alice"], label: "port-flood")
        let alice = try peer(people["alice"], ssdpPort: randomSSDPPort())
        try await alice.start()
        let port = try #require(alice.state.withLockedValue { $0.boundPort })
        let flood = try ChildProcess("python3", ["-c", Self.attacker, "connect_flood", "127.0.0.2", "\(port)", "400"])
        #expect(try await flood.waitForExit(timeout: .seconds(30)) == 0, "\(flood.output)")
        // Every connect that got an answer reaches the gate (a refused one right after its accept).
        let answered = 400 - (Self.timedOut(in: flood.output) ?? 400)
        func seen() async -> Int {
            let admission = await alice.status().port.admission
            return admission.admitted + admission.refused
        }
        _ = try await waitUntil(timeout: .seconds(10), every: .milliseconds(10)) { await seen() >= answered }
        let afterFlood = await alice.status().port.admission

        // The source is in its refusal period: its SYNs are dropped before an accept, the gate sees none.
        let more = try ChildProcess("python3", ["-c", Self.attacker, "connect_flood", "127.0.0.2", "\(port)", "50"])
        #expect(try await more.waitForExit(timeout: .seconds(30)) == 0, "\(more.output)")
        #expect(Self.timedOut(in: more.output) == 50, "\(more.output)")

        var client = BeaconHTTPClientConfiguration()
        client.maxAttempts = 1
        let fetched = try await BeaconHTTPClient(configuration: client, group: MultiThreadedEventLoopGroup.singleton)
            .fetch(BeaconLocation(host: "127.0.0.1", port: port))
        let status = await alice.status()
        await alice.stop()
        #expect(fetched.isEmpty, "nothing advertised: 204")
        let admission = status.port.admission
        #expect(admission.overloads == 0, "\(admission)")
        #expect(afterFlood.refusedSourceRate >= 1, "refused for the source alone: \(afterFlood)")
        #expect(afterFlood.admitted + afterFlood.refused == answered, "\(afterFlood); \(flood.output)")
        #expect(admission.admitted == afterFlood.admitted + 1 && admission.refused == afterFlood.refused,
                "only the fetch reached the gate after the flood: \(admission)")
        #expect(admission.refusedGlobalOpen + admission.refusedGlobalUnauthenticated + admission.refusedOverload == 0)
        #expect(status.limitsTriggered.isEmpty)
    }

    /// The attacker's count of connects that got no answer.
    private static func timedOut(in output: String) -> Int? {
        output.split(separator: "\n").last { $0.hasPrefix("flood ") }?.split(separator: " ").last.flatMap { Int($0) }
    }

    @Test("three sources stalling TLS handshakes hold at most their per-source slots; a contact still delivers")
    func stalledHandshakesCannotHoldThePort() async throws {
        let people = try TestPeople(["alice", "bob"], label: "port-stall")
        let ssdpPort = randomSSDPPort()
        let alice = try peer(people["alice"], ssdpPort: ssdpPort)
        let bob = try peer(people["bob"], ssdpPort: ssdpPort)
        try await alice.start()
        let port = try #require(alice.state.withLockedValue { $0.boundPort })
        var attackers: [ChildProcess] = []
        defer { for attacker in attackers { _ = attacker.terminate() } }
        for source in ["127.0.0.2", "127.0.0.3", "127.0.0.4"] {
            let attacker = try ChildProcess("python3", ["-c", Self.attacker, "stall", source, "\(port)", "30"])
            attackers.append(attacker)
        }
        for attacker in attackers { try await attacker.waitForOutput(containing: "held", timeout: .seconds(10)) }
        let held = attackers.compactMap { attacker in
            attacker.output.split(separator: "\n").first { $0.hasPrefix("held ") }.flatMap { Int($0.dropFirst(5)) }
        }
        #expect(held.count == 3 && held.allSatisfy { $0 <= 4 },
                "each source holds at most maxUnauthenticatedPerSource: \(attackers.map(\.output))")

        // With the attack still going, Alice's item reaches Bob over PSK-TLS on the same port.
        let bobsEvents = bob.events()
        let item = try await alice.send(text: "despite the stalls", to: "bob")
        try await bob.start()
        var received: UUID?
        for await event in bobsEvents {
            if case .delivery("alice", .received(let inbox)) = event {
                received = inbox.itemID
                break
            }
        }
        let status = await alice.status()
        await bob.stop()
        await alice.stop()
        #expect(received == item.id)
        #expect(status.port.admission.refusedSourceUnauthenticated >= 78, "\(status.port.admission)")
        #expect(status.port.admission.authenticated >= 1)
        #expect(status.port.admission.overloads == 0)
    }
}
