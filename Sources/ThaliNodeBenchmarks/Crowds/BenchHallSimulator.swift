import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import ThaliBeacons
import ThaliSSDP

#if canImport(Glibc)
import Glibc
#endif

/// The hall of `bench hall`: many simulated Thali peers in one process, each with an address of its own
/// (an AnyIP range on the namespace's loopback: every address of it is local), announcing itself over
/// SSDP at the foreground rate and serving its own beacons at its LOCATION. One UDP socket sends every
/// NOTIFY with its peer's address as source (`IP_PKTINFO`, `IP_FREEBIND`); one TCP listener on 0.0.0.0
/// answers `/NotificationBeacons` with the beacons of the address a connection was made to.
final class HallSimulator: Sendable {
    /// The AnyIP range of the simulated peers, and its first two octets.
    static let addressRange = "10.77.0.0/16"
    private static let prefix = "10.77"
    /// Simulated peers one range holds (250 addresses in each of 256 /24s).
    static let maxPeers = 250 * 256

    /// The `index`-th simulated peer's address: 10.77.0.1 ... 10.77.0.250, 10.77.1.1 ...
    static func address(_ index: Int) -> String { "\(prefix).\(index / 250).\(1 + index % 250)" }

    /// The index of a simulated peer's address (nil: not one).
    static func index(of address: String) -> Int? {
        let parts = address.split(separator: ".")
        guard parts.count == 4, "\(parts[0]).\(parts[1])" == prefix, let high = Int(parts[2]), let low = Int(parts[3]),
              (0..<256).contains(high), (1...250).contains(low) else { return nil }
        return high * 250 + low - 1
    }

    let peers: Int
    /// Each simulated peer's beacon stream, as `/NotificationBeacons` serves it.
    private let streams: [[UInt8]]
    /// Beacon fetches served, by the fetching address (a real peer's).
    private let fetches = NIOLockedValueBox<[String: Int]>([:])
    private let server = NIOLockedValueBox<Channel?>(nil)
    private let stopped = NIOLockedValueBox(false)
    /// Datagrams sent, and the seconds they took.
    private let sending = NIOLockedValueBox((sent: 0, seconds: 0.0))

    /// A hall of `peers`, each advertising for 1 to `maxBeaconsPerPeer` receivers drawn from a pool of
    /// random keys, with an identity of its own: real beacons, generated once here on every core.
    init(peers: Int, maxBeaconsPerPeer: Int = 4) throws {
        precondition((1...Self.maxPeers).contains(peers))
        self.peers = peers
        let receivers = (0..<256).map { _ in PrivateKey().publicKey }
        let chunks = ProcessInfo.processInfo.activeProcessorCount * 4
        let made = NIOLockedValueBox<[Int: [[UInt8]]]>([:])
        let failure = NIOLockedValueBox<Error?>(nil)
        DispatchQueue.concurrentPerform(iterations: chunks) { chunk in
            let range = stride(from: chunk, to: peers, by: chunks)
            var streams: [[UInt8]] = []
            do {
                for _ in range {
                    let generator = BeaconGenerator(identity: PrivateKey())
                    let count = Int.random(in: 1...maxBeaconsPerPeer)
                    let announcement = try generator.makeAnnouncement(for: (0..<count).map { _ in receivers.randomElement()! },
                                                                      validity: .seconds(3600))
                    streams.append(announcement.stream)
                }
            } catch {
                failure.withLockedValue { $0 = error }
            }
            made.withLockedValue { $0[chunk] = streams }
        }
        if let error = failure.withLockedValue({ $0 }) { throw error }
        let byChunk = made.withLockedValue { $0 }
        // Peer i is the (i / chunks)-th of chunk i % chunks.
        streams = (0..<peers).map { byChunk[$0 % chunks]![$0 / chunks] }
    }

    /// Bytes of beacon streams the hall serves, in all.
    var beaconBytes: Int { streams.reduce(0) { $0 + $1.count } }

    /// Beacon fetches served so far, by fetching address.
    var fetchesByClient: [String: Int] { fetches.withLockedValue { $0 } }

    /// Datagrams sent so far and the rate they were sent at.
    var sent: (datagrams: Int, perSecond: Double) {
        let (sent, seconds) = sending.withLockedValue { $0 }
        return (sent, seconds > 0 ? Double(sent) / seconds : 0)
    }

    /// Makes every address of ``addressRange`` local to this namespace's loopback (root in the namespace).
    static func addAnyIPRange() throws {
        guard let ip = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"].first(where: FileManager.default.isExecutableFile)
        else { throw BenchNamespace.Failure(description: "this benchmark needs ip (iproute2)") }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: ip)
        process.arguments = ["route", "add", "local", addressRange, "dev", "lo"]
        try process.run()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw BenchNamespace.Failure(description: "ip route add local \(addressRange) dev lo failed")
        }
    }

    /// Starts the beacon server on 0.0.0.0 (every simulated address) and returns its port.
    func startServer(group: EventLoopGroup) async throws -> Int {
        let streams = self.streams
        let fetches = self.fetches
        let channel = try await ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 1024)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                let index = channel.localAddress?.ipAddress.flatMap(Self.index(of:))
                if let client = channel.remoteAddress?.ipAddress { fetches.withLockedValue { $0[client, default: 0] += 1 } }
                return channel.eventLoop.makeCompletedFuture {
                    try BeaconHTTPServer.configureRequestHandling(on: channel, beacons: {
                        index.flatMap { streams.indices.contains($0) ? streams[$0] : nil }
                    })
                }
            }
            .bind(host: "0.0.0.0", port: 0).get()
        server.withLockedValue { $0 = channel }
        return channel.localAddress?.port ?? 0
    }

    /// Starts announcing on a thread of its own: every peer an alive each `interval` (staggered evenly),
    /// to `group:ssdpPort` from its own address, LOCATION on `httpPort`. Falls behind rather than bursts:
    /// what the machine cannot send in time is skipped, and ``sent`` says the rate reached.
    func startAnnouncing(ssdpPort: Int, httpPort: Int, interval: Duration,
                         groupAddress: String = SSDPDiscoveryConfiguration.defaultGroupAddress) throws {
        let datagrams = (0..<peers).map { index -> [UInt8] in
            let address = Self.address(index)
            return SSDPMessage.notification(.alive(
                host: "\(groupAddress):\(ssdpPort)", notificationType: ThaliServiceName.notificationType,
                uniqueServiceName: ThaliServiceName.makeUniqueServiceName(),
                location: "http://\(address):\(httpPort)/NotificationBeacons", maxAge: 60,
                server: "Linux UPnP/1.1 thali-hall/1.0")).serialize()
        }
        let sources = (0..<peers).map { index -> in_addr in
            var address = in_addr()
            _ = inet_pton(AF_INET, Self.address(index), &address)
            return address
        }
        let socket = try MulticastSender(group: groupAddress, port: ssdpPort)
        let perSecond = Double(peers) / interval.seconds
        let thread = Thread { [self] in
            let clock = ContinuousClock()
            let start = clock.now
            var scheduled = 0  // datagrams due so far, sent or skipped
            var sent = 0
            while !stopped.withLockedValue({ $0 }) {
                let elapsed = (clock.now - start).seconds
                let due = Int(elapsed * perSecond)
                // More than a second behind: skip, do not burst.
                if due - scheduled > Int(perSecond) { scheduled = due - Int(perSecond) }
                while scheduled < due {
                    let index = scheduled % datagrams.count
                    if socket.send(datagrams[index], from: sources[index]) { sent += 1 }
                    scheduled += 1
                }
                sending.withLockedValue { $0 = (sent, elapsed) }
                usleep(5_000)
            }
            socket.close()
        }
        thread.name = "hall: announce"
        thread.start()
    }

    /// Stops announcing and serving.
    func stop() async {
        stopped.withLockedValue { $0 = true }
        try? await server.withLockedValue({ $0 })?.close()
    }
}

/// One UDP socket that sends multicast datagrams from any address of an AnyIP range: the source of
/// each is set by its `IP_PKTINFO` control message (`ipi_spec_dst`), which `IP_FREEBIND` allows for
/// an address not configured on an interface.
private final class MulticastSender: @unchecked Sendable {
    private let descriptor: Int32
    private var destination = sockaddr_in()
    private let loopbackIndex: Int32

    init(group: String, port: Int) throws {
        descriptor = socket(AF_INET, Int32(SOCK_DGRAM.rawValue), 0)
        guard descriptor >= 0 else { throw BenchNamespace.Failure(description: "socket: errno \(errno)") }
        loopbackIndex = Int32(if_nametoindex("lo"))
        var on: Int32 = 1
        var ttl: UInt8 = 1
        var interface = in_addr()
        _ = inet_pton(AF_INET, "127.0.0.1", &interface)
        guard setsockopt(descriptor, Int32(IPPROTO_IP), IP_FREEBIND, &on, socklen_t(MemoryLayout<Int32>.size)) == 0,
              setsockopt(descriptor, Int32(IPPROTO_IP), IP_MULTICAST_LOOP, &on, socklen_t(MemoryLayout<Int32>.size)) == 0,
              setsockopt(descriptor, Int32(IPPROTO_IP), IP_MULTICAST_TTL, &ttl, 1) == 0,
              setsockopt(descriptor, Int32(IPPROTO_IP), IP_MULTICAST_IF, &interface, socklen_t(MemoryLayout<in_addr>.size)) == 0
        else {
            let code = errno
            Glibc.close(descriptor)
            throw BenchNamespace.Failure(description: "setsockopt: errno \(code)")
        }
        var sendBuffer: Int32 = 4 << 20
        _ = setsockopt(descriptor, SOL_SOCKET, SO_SNDBUF, &sendBuffer, socklen_t(MemoryLayout<Int32>.size))
        destination.sin_family = sa_family_t(AF_INET)
        destination.sin_port = in_port_t(UInt16(port).bigEndian)
        _ = inet_pton(AF_INET, group, &destination.sin_addr)
    }

    /// Sends `datagram` to the group from `source`; false if the kernel refused it.
    func send(_ datagram: [UInt8], from source: in_addr) -> Bool {
        // cmsghdr (length, level, type) then in_pktinfo (ifindex, spec_dst, addr): CMSG_SPACE(12) bytes.
        let headerLength = MemoryLayout<Int>.size + 2 * MemoryLayout<Int32>.size
        let pktinfoLength = 12
        var control = [UInt8](repeating: 0, count: headerLength + 16)
        control.withUnsafeMutableBytes { raw in
            raw.storeBytes(of: headerLength + pktinfoLength, toByteOffset: 0, as: Int.self)
            raw.storeBytes(of: Int32(IPPROTO_IP), toByteOffset: MemoryLayout<Int>.size, as: Int32.self)
            raw.storeBytes(of: Int32(IP_PKTINFO), toByteOffset: MemoryLayout<Int>.size + 4, as: Int32.self)
            raw.storeBytes(of: loopbackIndex, toByteOffset: headerLength, as: Int32.self)
            raw.storeBytes(of: source.s_addr, toByteOffset: headerLength + 4, as: UInt32.self)
        }
        var destination = self.destination
        var datagram = datagram
        let result = datagram.withUnsafeMutableBytes { payload in
            control.withUnsafeMutableBytes { control in
                withUnsafeMutablePointer(to: &destination) { address in
                    var vector = iovec(iov_base: payload.baseAddress, iov_len: payload.count)
                    return withUnsafeMutablePointer(to: &vector) { vector in
                        var message = msghdr()
                        message.msg_name = UnsafeMutableRawPointer(address)
                        message.msg_namelen = socklen_t(MemoryLayout<sockaddr_in>.size)
                        message.msg_iov = vector
                        message.msg_iovlen = 1
                        message.msg_control = control.baseAddress
                        message.msg_controllen = control.count
                        return sendmsg(descriptor, &message, 0)
                    }
                }
            }
        }
        return result == datagram.count
    }

    func close() { Glibc.close(descriptor) }
}
