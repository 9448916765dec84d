import Foundation
import Testing
import ThaliNetLab
import ThaliSupport
import ThaliTestSupport

#if canImport(Glibc)
import Glibc
#endif

/// The wire itself between two real network namespaces (root): the delay is really added to a TCP round
/// trip, multicast loss really applies to multicast datagrams while unicast ones all arrive, and the lab
/// leaves no namespace behind.
@Suite("Lab wire between two namespaces", .serialized)
struct WireStageTests {
    static let labAvailable = TestEnvironment.available(TestEnvironment.canUseNetworkNamespaces
                                                        && FileManager.default.fileExists(atPath: "/dev/net/tun"))

    @Test("a 10 ms one-way delay makes a TCP round trip at least 20 ms", .enabled(if: labAvailable), .timeLimit(.minutes(1)))
    func delayIsAdded() async throws {
        let profile = LinkProfile(name: "test-delay", delayNanoseconds: 10_000_000)
        let lab = try NetLab(hostCount: 2, profile: profile, seed: 7)
        defer { lab.close() }
        let listener = try lab.inHost(0) { try BlockingSockets.listenTCP() }
        defer { close(listener.descriptor) }
        let echo = Thread {
            let connection = accept(listener.descriptor, nil, nil)
            guard connection >= 0 else { return }
            defer { close(connection) }
            var buffer = [UInt8](repeating: 0, count: 64)
            while BlockingSockets.receiveExactly(connection, &buffer), BlockingSockets.sendAll(connection, buffer) {}
        }
        echo.start()
        let client = try lab.inHost(1) { try BlockingSockets.connectTCP(to: lab.hosts[0].address, port: listener.port) }
        defer { close(client) }
        var times: [Double] = []
        var buffer = [UInt8](repeating: 7, count: 64)
        for _ in 0..<20 {
            let start = ContinuousClock.now
            #expect(BlockingSockets.sendAll(client, buffer))
            #expect(BlockingSockets.receiveExactly(client, &buffer))
            let elapsed = ContinuousClock.now - start
            times.append(Double(elapsed.components.attoseconds) / 1e15 + Double(elapsed.components.seconds) * 1000)
        }
        times.sort()
        #expect(times[0] >= 20, "round trips \(times) ms with 10 ms each way")
        #expect(lab.counters.passed > 40)
    }

    @Test("multicast loss applies to multicast frames only; unicast arrives whole; the lab is deleted",
          .enabled(if: labAvailable), .timeLimit(.minutes(1)))
    func multicastLoss() async throws {
        let profile = LinkProfile(name: "test-multicast", multicastLoss: 0.5)
        let lab = try NetLab(hostCount: 2, profile: profile, seed: 8)
        let namespaces = lab.hosts.map(\.namespace)
        let group = "239.255.77.77"
        let receiver = try lab.inHost(1) { try BlockingSockets.udpReceiver(group: group, interface: lab.hosts[1].address) }
        defer { close(receiver.descriptor) }
        let sender = try lab.inHost(0) { try BlockingSockets.udpSender(interface: lab.hosts[0].address) }
        defer { close(sender) }
        let count = 400
        let counts = Locked((multicast: 0, unicast: 0, done: false))
        let reader = Thread {
            var buffer = [UInt8](repeating: 0, count: 64)
            let capacity = buffer.count
            while true {
                let length = recv(receiver.descriptor, &buffer, capacity, 0)
                guard length > 0 else { return }
                if buffer[0] == 0x45 {
                    counts.withLock { $0.done = true }
                    return
                }
                counts.withLock { if buffer[0] == 1 { $0.multicast += 1 } else { $0.unicast += 1 } }
            }
        }
        reader.start()
        // In batches, each waited for at the wire, so that no device queue overflows: the wire is what is measured.
        let batch = 50
        for start in stride(from: 0, to: count, by: batch) {
            let offeredBefore = lab.counters.offered
            for _ in 0..<batch {
                #expect(BlockingSockets.sendDatagram(sender, [1], to: group, port: receiver.port))
                #expect(BlockingSockets.sendDatagram(sender, [2], to: lab.hosts[1].address, port: receiver.port))
            }
            #expect(try await waitUntil(timeout: .seconds(10)) { lab.counters.offered >= offeredBefore + 2 * batch }, "batch at \(start)")
        }
        #expect(BlockingSockets.sendDatagram(sender, [0x45], to: lab.hosts[1].address, port: receiver.port))
        #expect(try await waitUntil(timeout: .seconds(10)) { counts.withLock { $0.done } })
        let seen = counts.withLock { $0 }
        // 400 at 50 %: 200 ± 10 (one standard deviation); the bounds are 6 deviations wide each side.
        #expect((140...260).contains(seen.multicast), "\(seen.multicast) of \(count) multicast datagrams arrived")
        #expect(seen.unicast == count, "\(seen.unicast) of \(count) unicast datagrams arrived")
        #expect(lab.counters.dropped[.multicastLoss] ?? 0 >= count - seen.multicast)
        lab.close()
        let listing = try runCommand("ip", ["netns", "list"])
        for name in namespaces { #expect(!listing.contains(name), "\(name) left behind") }
    }
}

/// The wire tests' datagram sockets, beside the shared TCP ones (``BlockingSockets``).
extension BlockingSockets {
    static func udpReceiver(group: String, interface: String) throws -> (descriptor: Int32, port: Int) {
        let descriptor = socket(AF_INET, Int32(SOCK_DGRAM.rawValue), 0)
        guard descriptor >= 0 else { throw Failure(description: "socket: errno \(errno)") }
        let port = try bindAndName(descriptor, "0.0.0.0")
        var membership = ip_mreq()
        inet_pton(AF_INET, group, &membership.imr_multiaddr)
        inet_pton(AF_INET, interface, &membership.imr_interface)
        guard setsockopt(descriptor, Int32(IPPROTO_IP), IP_ADD_MEMBERSHIP, &membership, socklen_t(MemoryLayout<ip_mreq>.size)) == 0 else {
            throw Failure(description: "IP_ADD_MEMBERSHIP: errno \(errno)")
        }
        var bufferBytes: Int32 = 4 << 20
        setsockopt(descriptor, SOL_SOCKET, SO_RCVBUFFORCE, &bufferBytes, socklen_t(MemoryLayout<Int32>.size))
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        return (descriptor, port)
    }

    static func udpSender(interface: String) throws -> Int32 {
        let descriptor = socket(AF_INET, Int32(SOCK_DGRAM.rawValue), 0)
        guard descriptor >= 0 else { throw Failure(description: "socket: errno \(errno)") }
        var outgoing = in_addr()
        inet_pton(AF_INET, interface, &outgoing)
        setsockopt(descriptor, Int32(IPPROTO_IP), IP_MULTICAST_IF, &outgoing, socklen_t(MemoryLayout<in_addr>.size))
        return descriptor
    }

    static func sendDatagram(_ descriptor: Int32, _ bytes: [UInt8], to host: String, port: Int) -> Bool {
        var remote = address(host, port: port)
        let sent = withUnsafePointer(to: &remote) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                sendto(descriptor, bytes, bytes.count, 0, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        return sent == bytes.count
    }
}

/// The lab's roaming (``LinkProfile/addressChanges``) between two real namespaces.
@Suite("Lab roaming between two namespaces", .serialized)
struct NetLabRoamingTests {
    @Test("a roaming host's address is really replaced on the profile's period, and close stops the changes",
          .enabled(if: WireStageTests.labAvailable), .timeLimit(.minutes(1)))
    func addressesChange() async throws {
        var profile = LinkProfile.unshaped
        profile.addressChanges = AddressChangePattern(periodNanoseconds: 600_000_000, host: 1)
        let lab = try NetLab(hostCount: 2, profile: profile, seed: 9)
        defer { lab.close() }
        #expect(try await waitUntil(timeout: .seconds(10)) { lab.addressChanges.count >= 2 }, "\(lab.addressChangeFailures)")
        let changes = lab.addressChanges
        #expect(changes.allSatisfy { $0.host == 1 })
        #expect(changes[0].previous == "10.77.0.2" && changes[0].address == NetLab.address(ofHost: 1, afterChanges: 1))
        #expect(changes[1].previous == changes[0].address && changes[1].address == NetLab.address(ofHost: 1, afterChanges: 2))
        #expect(lab.address(ofHost: 0) == "10.77.0.1")
        // The host holds exactly its current address (read while no change is due: just after one).
        #expect(try await waitUntil(timeout: .seconds(5)) { lab.addressChanges.count >= 3 })
        let current = lab.address(ofHost: 1)
        let shown = try runCommand("ip", ["-n", lab.hosts[1].namespace, "-4", "-o", "addr", "show", "dev", NetLab.interfaceName])
        #expect(shown.contains(" \(current)/24") && !shown.contains(" 10.77.0.2/24"), "\(shown) (current \(current))")
        lab.close()
        let after = lab.addressChanges.count
        #expect(lab.addressChangeFailures.isEmpty, "\(lab.addressChangeFailures)")
        // Over two periods, no change comes after close.
        #expect(try await !waitUntil(timeout: .milliseconds(1300)) { lab.addressChanges.count != after })
    }
}
