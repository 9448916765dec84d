import Foundation
import Testing
import ThaliTestSupport
@testable import ThaliNodeCore

/// DoS limits that fire inside discovery reach the node's events and status (issue 12): an operator sees
/// that discovery went dark, why, for how long, and that it was the last resort.
@Suite("Peer limits surfaced", .serialized)
struct PeerLimitTests {
    @Test("an SSDP datagram flood from another process is a limit_triggered event and counted in status")
    func datagramFloodIsReported() async throws {
        let people = try TestPeople(["alice"], label: "limits")
        let ssdpPort = randomSSDPPort()
        var configuration = PeerConfiguration(interfaceAddress: "127.0.0.1")
        configuration.ssdpPort = ssdpPort
        configuration.discoveryLimits.maxDatagramsPerWindow = 20
        configuration.discoveryLimits.floodWindow = .seconds(10)
        configuration.discoveryLimits.discoveryCooldown = .seconds(5)
        let alice = try ThaliPeer(store: people["alice"].store, identity: people["alice"].key,
                                  configuration: configuration, logger: quietLogger)
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

        var fired: (kind: String, effect: String)?
        let deadline = ContinuousClock.now + .seconds(10)
        for await event in events {
            if case .limitTriggered(let kind, let effect) = event {
                fired = (kind, effect)
                break
            }
            if ContinuousClock.now > deadline { break }
        }
        let status = await alice.status()
        await alice.stop()
        let event = try #require(fired, "no limitTriggered event")
        #expect(event.kind == "announcementFlood")
        #expect(event.effect.contains("SSDP discovery off for 5 s"))
        #expect(event.effect.contains("last resort"))
        #expect(status.limitsTriggered == ["announcementFlood": 1])
    }
}
