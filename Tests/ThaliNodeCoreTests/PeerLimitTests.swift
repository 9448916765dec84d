import Foundation
import NIOCore
import NIOPosix
import ThaliBeacons
import ThaliPSKTLS
import ThaliSSDP
import Testing
import ThaliTestSupport
@testable import ThaliNodeCore

/// DoS limits that fire inside discovery reach the node's events and status (issue 12): an operator sees
/// that discovery went dark, why, for how long, and that it was the last resort.
@Suite("Peer limits surfaced", .serialized, .timeLimit(.minutes(1)))
struct PeerLimitTests {
    @Test("an SSDP datagram flood from another process is a limit_triggered event and counted in status")
    func datagramFloodIsReported() async throws {
        let people = try TestPeople(["alice"], label: "limits")
        let ssdpPort = randomSSDPPort()
        let alice = try loopbackPeer(people["alice"], ssdpPort: ssdpPort) {
            $0.discoveryLimits.maxDatagramsPerWindow = 20
            $0.discoveryLimits.floodWindow = .seconds(10)
            $0.discoveryLimits.discoveryCooldown = .seconds(5)
        }
        let events = alice.events()
        try await alice.start()
        // The attacker: another process multicasting 60 Thali alives from different ports on loopback.
        let flood = """
            import socket, sys
            port = int(sys.argv[1])
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
            s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
            for i in range(60):
                msg = ("NOTIFY * HTTP/1.1\\r\\nHOST: 239.255.255.250:%d\\r\\nCACHE-CONTROL: max-age=60\\r\\n"
                       "LOCATION: http://127.0.0.1:%d/NotificationBeacons\\r\\nNT: http://www.thaliproject.org/ssdp\\r\\n"
                       "NTS: ssdp:alive\\r\\nUSN: uuid:%08d-0000-4000-8000-000000000000:http://www.thaliproject.org/ssdp\\r\\n\\r\\n"
                       % (port, 10000 + i, i))
                s.sendto(msg.encode(), ("239.255.255.250", port))
            """
        let attacker = try ChildProcess("python3", ["-c", flood, "\(ssdpPort)"])
        #expect(try await attacker.waitForExit(timeout: .seconds(10)) == 0, "\(attacker.output)")

        var fired: PeerLimitReport?
        let deadline = ContinuousClock.now + .seconds(10)
        for await event in events {
            if case .limitTriggered(let report) = event {
                fired = report
                break
            }
            if ContinuousClock.now > deadline { break }
        }
        let status = await alice.status()
        await alice.stop()
        let event = try #require(fired, "no limitTriggered event")
        #expect(event.kind == .announcementFlood)
        #expect(event.effect == .discoveryOff)
        #expect(event.period == .seconds(5))
        #expect(event.detail.contains("SSDP discovery off for 5 s"))
        #expect(event.detail.contains("last resort"))
        #expect(status.limitsTriggered == [.announcementFlood: 1])
    }
}

/// Attacks on the connecting side (issue 12).
@Suite("Peer retries under attack", .serialized, .timeLimit(.minutes(1)))
struct PeerRetryAttackTests {
    @Test("a copy of a contact's announcement served where no one holds its PSK ends after one unknown_psk_identity, not six")
    func unknownIdentityStopsRetrying() async throws {
        let people = try TestPeople(["alice", "bob", "carol"], label: "unknown-identity")
        let ssdpPort = randomSSDPPort()
        // The attacker re-serves a copy of Alice's announcement for Bob from its own port, which speaks
        // PSK-TLS but holds no PSK: every handshake ends in unknown_psk_identity.
        let serverContext = try PSKTLSContext(role: .server, configuration: PSKTLSConfiguration(dhGroup: .ffdhe2048))
        let attacker = try await AnnouncementCopyHost(copying: people["alice"], for: people["bob"], ssdpPort: ssdpPort) { channel in
            channel.eventLoop.makeCompletedFuture {
                try channel.pipeline.syncOperations.addHandler(PSKTLSHandler(serverContext: serverContext, lookup: { _ in nil }))
            }
        }
        let attackerLocation = attacker.location
        // Under the same retry policy, a failure worth retrying: a copy of Carol's announcement whose port
        // closes every connection. Bob's retries to Carol show when those to Alice would have been made.
        let closing = try await AnnouncementCopyHost(copying: people["carol"], for: people["bob"], ssdpPort: ssdpPort) { channel in
            channel.close()
        }

        let bob = try loopbackPeer(people["bob"], ssdpPort: ssdpPort) {
            $0.retry.initialDelay = .milliseconds(50)
            $0.retry.maxDelay = .milliseconds(100)
            $0.retry.restAfterMaxAttempts = .milliseconds(100)
        }
        let events = bob.events()
        try await bob.start()
        var attempts = 0
        var failure: (reason: PeerConnectionError, retryIn: Duration?)?
        var carolAttemptsSinceAliceFailed = 0
        for await event in events {
            if case .connecting("alice", attackerLocation, _) = event { attempts += 1 }
            if case .connectionFailed("alice", let reason, let retryIn) = event { failure = (reason, retryIn) }
            if case .connecting("carol", _, _) = event, failure != nil { carolAttemptsSinceAliceFailed += 1 }
            // More than a round of retries to Carol (the policy's six attempts, then its rest) after Alice's
            // failure: a retry to Alice, due at most `maxDelay` (100 ms) after it, would have been made by now.
            if carolAttemptsSinceAliceFailed > 6 { break }
        }
        await bob.stop()
        await attacker.stop()
        await closing.stop()
        var rest: [PeerEvent] = []
        for await event in events { rest.append(event) }
        let failed = try #require(failure)
        #expect(failed.reason.reason == .tls(.alertReceived(.unknownPSKIdentity)))
        #expect(failed.reason.description.contains("unknown_psk_identity"))
        #expect(failed.retryIn == nil, "no retry after unknown_psk_identity")
        #expect(attempts == 1)
        #expect(!rest.contains { if case .connecting("alice", _, _) = $0 { true } else { false } })
    }
}

/// More contacts than one announcement holds (issue 12).
@Suite("Peer with many contacts", .serialized, .timeLimit(.minutes(1)))
struct PeerManyContactsTests {
    @Test("130 contacts with items are advertised in three announcements served in turn; the last one's contact receives")
    func moreThanSixtyFourContacts() async throws {
        let people = try TestPeople(["alice", "bob"], label: "many-contacts")
        let aliceStore = try people["alice"].store
        let expiry = Date().addingTimeInterval(600)
        for index in 0..<129 {
            let name = String(format: "stranger-%03d", index)
            try aliceStore.addContact(name: name, publicKey: PrivateKey().publicKey.hexString(compressed: true))
            _ = try aliceStore.enqueueText("for \(name)", to: name, expiresAt: expiry)
        }
        // Queued last: Bob's beacon is in the last announcement.
        let item = try aliceStore.enqueueText("for bob", to: "bob", expiresAt: expiry)
        let ssdpPort = randomSSDPPort()
        let alice = try loopbackPeer(people["alice"], ssdpPort: ssdpPort) { $0.announcementRotationInterval = .milliseconds(300) }
        let bob = try loopbackPeer(people["bob"], ssdpPort: ssdpPort)
        let bobsEvents = bob.events()
        try await alice.start()
        let streams = alice.state.withLockedValue { $0.advertised?.streams ?? [] }
        #expect(streams.count == 3)
        #expect(streams.allSatisfy { ($0.count - BeaconProfile.spec.preambleLength) / 48 <= 64 })
        #expect(await alice.status().advertisingFor.count == 130)
        try await bob.start()
        var received: UUID?
        for await event in bobsEvents {
            if case .delivery("alice", .received(let inbox)) = event {
                received = inbox.itemID
                break
            }
        }
        await bob.stop()
        await alice.stop()
        #expect(received == item.id)
        #expect(try people.inbox(of: "bob").map(\.id) == [item.id])
    }
}

/// Attacks on discovery from another process on its own address (issue 12): one host can lose only its
/// own announcements; discovery stays on and contacts still deliver.
@Suite("Discovery under attack from one host", .serialized, .timeLimit(.minutes(1)))
struct DiscoveryAttackTests {
    /// `python3 -c ATTACK MODE SOURCE SSDP_PORT SECONDS`: `flood` sends 2000 Thali alives per second with
    /// new USNs; `usns` announces 150 locations (ports) of its own address twice a second; `closed`
    /// announces 20 locations on closed ports twice a second.
    static let attack = """
        import socket, sys, time, uuid
        mode, source, port, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((source, 0))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(source))
        def alive(location, usn):
            return ("NOTIFY * HTTP/1.1\\r\\nHOST: 239.255.255.250:%d\\r\\nCACHE-CONTROL: max-age=60\\r\\nLOCATION: %s\\r\\n"
                    "NT: http://www.thaliproject.org/ssdp\\r\\nNTS: ssdp:alive\\r\\nUSN: uuid:%s:http://www.thaliproject.org/ssdp\\r\\n\\r\\n"
                    % (port, location, usn)).encode()
        end = time.monotonic() + seconds
        sent, started = 0, False
        while time.monotonic() < end:
            if mode == "flood":
                for i in range(20):
                    s.sendto(alive("http://%s:%d/NotificationBeacons" % (source, 1024 + sent % 60000), uuid.uuid4()), ("239.255.255.250", port))
                    sent += 1
                time.sleep(0.01)  # kept: paces the flood at its rate; nothing waits for a result
            else:
                count = 150 if mode == "usns" else 20
                for i in range(count):
                    s.sendto(alive("http://%s:%d/NotificationBeacons" % (source, 40000 + i), "%08d-0000-4000-8000-000000000000" % i), ("239.255.255.250", port))
                    sent += 1
                time.sleep(0.5)  # kept: paces the announcements at twice a second; nothing waits for a result
            if sent and not started:
                print("attacking", flush=True)
                started = True
        print("sent %d" % sent, flush=True)
        """

    @Test("a datagram flood, a USN flood or closed ports from one host: discovery stays on and a contact delivers",
          arguments: ["flood", "usns", "closed"])
    func oneHostCannotSwitchDiscoveryOff(mode: String) async throws {
        let people = try TestPeople(["alice", "bob"], label: "ssdp-attack-\(mode)")
        let ssdpPort = randomSSDPPort()
        let alice = try loopbackPeer(people["alice"], ssdpPort: ssdpPort)
        let bob = try loopbackPeer(people["bob"], ssdpPort: ssdpPort)
        let attacker = try ChildProcess("python3", ["-c", Self.attack, mode, "127.0.0.2", "\(ssdpPort)", "6"])
        defer { _ = attacker.terminate() }
        try await attacker.waitForOutput(containing: "attacking")  // the attack is on before the peers start
        let bobsEvents = bob.events()
        try await alice.start()
        try await bob.start()
        // A sleep, kept: the property under test is that the attack, running this long beside both peers, does
        // not switch discovery off before alice sends; an ignored source leaves no trace in status to wait on.
        try await Task.sleep(for: .seconds(1))
        let item = try await alice.send(text: "through the \(mode)", to: "bob")
        var received: UUID?
        for await event in bobsEvents {
            if case .delivery("alice", .received(let inbox)) = event {
                received = inbox.itemID
                break
            }
        }
        let statuses = [await alice.status(), await bob.status()]
        await bob.stop()
        await alice.stop()
        #expect(received == item.id)
        // Narrowing (reading paused by its budget) may report itself; no last resort fires.
        for status in statuses {
            #expect(status.limitsTriggered.keys.allSatisfy { $0 == .narrowed }, "no global limit fired: \(status.limitsTriggered)")
        }
    }
}
