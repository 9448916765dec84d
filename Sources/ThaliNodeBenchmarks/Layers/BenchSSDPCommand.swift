import ArgumentParser
import Foundation
import Logging
import NIOCore
import NIOPosix
import ThaliSSDP

#if canImport(Glibc)
import Glibc
#endif

/// `thali-node bench ssdp`: SSDP parse speed, and what a conference-hall flood costs a peer.
///
/// The flood: a separate sender process plays `--peers` peers (default 10,000), each announcing
/// `--rate-per-peer` times a second (default 2) on loopback for `--seconds` (default 10), from distinct
/// 127.x.y.z source addresses with matching LOCATIONs and distinct USNs. This process runs one discovery
/// service with the library's default limits and reports its own CPU time over the flood, how many peers
/// it tracked, and whether its beacon server stayed responsive.
struct BenchSSDP: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ssdp", abstract: "SSDP datagrams parsed per second; CPU cost of a 10,000-peer flood.")

    @Flag(help: "Print one JSON object (parse_per_s, flood_cpu_s, flood_peers_tracked, ...).")
    var json = false

    @Option(help: "Simulated peers in the flood.")
    var peers: Int = 10_000

    @Option(help: "Announcements per second per simulated peer.")
    var ratePerPeer: Int = 2

    @Option(help: "Flood duration in seconds.")
    var seconds: Int = 10

    @Option(help: "Override the flood limit (datagrams per second) of the peer under test.")
    var maxDatagramsPerSecond: Int?

    @Option(help: "Override the peer cap of the peer under test.")
    var maxPeers: Int?

    @Option(help: .hidden)
    var floodSenderPort: Int?

    func validate() throws {
        guard peers >= 1, ratePerPeer >= 1, seconds >= 1 else {
            throw ValidationError("--peers, --rate-per-peer and --seconds must be positive")
        }
    }

    func run() async throws {
        if let port = floodSenderPort {
            return try FloodSender(port: port, peers: peers, ratePerPeer: ratePerPeer, seconds: seconds).run()
        }
        let parse = Self.measureParse()
        let flood = try await measureFlood()
        if json {
            let object: [String: Any] = [
                "parse_per_s": Int(parse), "flood_cpu_s": flood.cpuSeconds, "flood_peers_tracked": flood.peersTracked,
                "flood_datagrams_sent": flood.sent, "flood_datagrams_processed": flood.processed,
                "flood_shutdowns": flood.floodShutdowns, "peer_cap_narrowings": flood.capNarrowings,
                "beacon_fetch_max_ms": flood.maxFetchMilliseconds, "beacon_fetch_failures": flood.fetchFailures,
            ]
            let data = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
            print(String(decoding: data, as: UTF8.self))
        } else {
            print("SSDP parse: \(Int(parse)) datagrams/s")
            print("flood: \(peers) peers x \(ratePerPeer)/s for \(seconds) s = \(flood.sent) datagrams sent")
            print("  peer CPU during the flood: \(String(format: "%.3f", flood.cpuSeconds)) s")
            print("  datagrams the peer read: \(flood.processed); flood shutdowns: \(flood.floodShutdowns); "
                  + "peer-cap narrowings: \(flood.capNarrowings)")
            print("  peers tracked at the end: \(flood.peersTracked)")
            print("  own /NotificationBeacons during the flood: slowest \(flood.maxFetchMilliseconds) ms, "
                  + "\(flood.fetchFailures) failures")
            print("(release build for meaningful figures; a shared machine makes them noisy)")
        }
    }

    /// Parses a mix of Thali, deployed-Thali and foreign datagrams for about a second.
    static func measureParse() -> Double {
        let samples: [[UInt8]] = [
            "NOTIFY * HTTP/1.1\r\nHOST: 239.255.255.250:1900\r\nNT: http://www.thaliproject.org/ssdp\r\nNTS: ssdp:alive\r\nUSN: uuid:3f2c1a9e-6b7d-4e21-9c3a-0d5e8f7a6b10\r\nLOCATION: http://192.168.1.23:49152/NotificationBeacons\r\nCACHE-CONTROL: max-age=60\r\nSERVER: Linux UPnP/1.1 thali-swift/1.0\r\n\r\n",
            "NOTIFY * HTTP/1.1\r\nHOST: 228.227.226.225:1900\r\nNT: http://www.thaliproject.org/ssdp\r\nNTS: ssdp:byebye\r\nUSN: data:3f2c1a9e-6b7d-4e21-9c3a-0d5e8f7a6b10:0\r\n\r\n",
            "M-SEARCH * HTTP/1.1\r\nHOST: 239.255.255.250:1900\r\nMAN: \"ssdp:discover\"\r\nMX: 3\r\nST: http://www.thaliproject.org/ssdp\r\nS: uuid:3f2c1a9e-6b7d-4e21-9c3a-0d5e8f7a6b10\r\n\r\n",
            "HTTP/1.1 200 OK\r\nCACHE-CONTROL: max-age=60\r\nDATE: Sat, 21 Nov 2026 10:00:00 GMT\r\nEXT: \r\nLOCATION: http://192.168.1.23:49152/NotificationBeacons\r\nSERVER: x\r\nST: http://www.thaliproject.org/ssdp\r\nUSN: uuid:3f2c1a9e-6b7d-4e21-9c3a-0d5e8f7a6b10\r\n\r\n",
        ].map { Array($0.utf8) }
        var parsed = 0
        let clock = ContinuousClock()
        let start = clock.now
        var elapsed: Duration = .zero
        while elapsed < .seconds(1) {
            for _ in 0..<1000 {
                for sample in samples where (try? SSDPMessage.parse(sample)) != nil { parsed += 1 }
            }
            elapsed = clock.now - start
        }
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        return Double(parsed) / seconds
    }

    struct FloodResult {
        var cpuSeconds: Double
        var peersTracked: Int
        var sent: Int
        var processed: Int
        var floodShutdowns: Int
        var capNarrowings: Int
        var maxFetchMilliseconds: Int
        var fetchFailures: Int
    }

    func measureFlood() async throws -> FloodResult {
        let port = try await Self.freeUDPPort()
        var configuration = SSDPDiscoveryConfiguration(interfaceAddress: "127.0.0.1")
        configuration.port = port
        if let maxDatagramsPerSecond { configuration.limits.maxDatagramsPerWindow = maxDatagramsPerSecond }
        if let maxPeers { configuration.limits.maxTrackedPeers = maxPeers }
        configuration.client.maxAttempts = 1
        let group = MultiThreadedEventLoopGroup.singleton
        var logger = Logger(label: "thali.bench.ssdp")
        logger.logLevel = .error  // the flood trips limits on purpose; their warnings are the expected outcome
        let service = SSDPDiscoveryService(configuration: configuration, group: group, logger: logger)
        try await service.start(advertising: Array(repeating: 0xAB, count: 256))
        let location = await service.location()
        let client = BeaconHTTPClient(group: group)

        let executable = Bundle.main.executablePath ?? CommandLine.arguments[0]
        let sender = Process()
        sender.executableURL = URL(fileURLWithPath: executable)
        sender.arguments = ["bench", "ssdp", "--flood-sender-port", String(port), "--peers", String(peers),
                            "--rate-per-peer", String(ratePerPeer), "--seconds", String(seconds)]
        let senderOutput = Pipe()
        sender.standardOutput = senderOutput
        let cpuBefore = Self.cpuSeconds()
        try sender.run()

        // Probe our own beacon server once a second while the flood runs.
        var slowest: Duration = .zero
        var failures = 0
        for _ in 0..<seconds {
            try await Task.sleep(for: .seconds(1))
            let started = ContinuousClock.now
            do { _ = try await client.fetch(location) } catch { failures += 1 }
            slowest = max(slowest, ContinuousClock.now - started)
        }
        sender.waitUntilExit()
        let cpu = Self.cpuSeconds() - cpuBefore
        let sent = Int(String(decoding: senderOutput.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            .trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0
        let counters = await service.counters()
        let tracked = await service.peers().count
        await service.stop()
        let milliseconds = Int(slowest.components.seconds * 1000 + slowest.components.attoseconds / 1_000_000_000_000_000)
        return FloodResult(cpuSeconds: cpu, peersTracked: tracked, sent: sent, processed: counters.datagramsReceived,
                           floodShutdowns: counters.floodShutdowns, capNarrowings: counters.peerCapNarrowings,
                           maxFetchMilliseconds: milliseconds, fetchFailures: failures)
    }

    static func cpuSeconds() -> Double {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        return Double(usage.ru_utime.tv_sec) + Double(usage.ru_utime.tv_usec) / 1e6
            + Double(usage.ru_stime.tv_sec) + Double(usage.ru_stime.tv_usec) / 1e6
    }

    static func freeUDPPort() async throws -> Int {
        let channel = try await DatagramBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .bind(host: "127.0.0.1", port: 0).get()
        defer { channel.close(promise: nil) }
        return channel.localAddress?.port ?? 0
    }
}

/// The flood's sender: plain POSIX UDP sockets bound to 127.1.x.y sources, paced in 10 ms batches.
/// Prints the number of datagrams sent.
struct FloodSender {
    let port: Int
    let peers: Int
    let ratePerPeer: Int
    let seconds: Int
    /// Source addresses used (each a socket); peers share them with distinct ports in their LOCATION.
    let sourceCount = 250

    func run() throws {
        var sockets: [Int32] = []
        var sources: [String] = []
        defer { sockets.forEach { close($0) } }
        for index in 0..<sourceCount {
            let source = "127.1.\(index / 250).\(index % 250 + 1)"
            let fd = socket(AF_INET, Int32(SOCK_DGRAM.rawValue), 0)
            guard fd >= 0 else { throw POSIXFailure(call: "socket") }
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            inet_pton(AF_INET, source, &address.sin_addr)
            let bound = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            guard bound == 0 else { close(fd); throw POSIXFailure(call: "bind \(source)") }
            var interface = in_addr()
            inet_pton(AF_INET, "127.0.0.1", &interface)
            setsockopt(fd, Int32(IPPROTO_IP), IP_MULTICAST_IF, &interface, socklen_t(MemoryLayout<in_addr>.size))
            sockets.append(fd)
            sources.append(source)
        }
        let datagrams: [[UInt8]] = (0..<peers).map { peer in
            let source = sources[peer % sourceCount]
            let usn = String(format: "uuid:00000000-0000-4000-8000-%012x", peer)
            return Array(("NOTIFY * HTTP/1.1\r\nHOST: 239.255.255.250:\(port)\r\nNT: http://www.thaliproject.org/ssdp\r\n"
                + "NTS: ssdp:alive\r\nUSN: \(usn)\r\nLOCATION: http://\(source):\(10_000 + peer / sourceCount)/NotificationBeacons\r\n"
                + "CACHE-CONTROL: max-age=60\r\nSERVER: flood/1\r\n\r\n").utf8)
        }
        var group = sockaddr_in()
        group.sin_family = sa_family_t(AF_INET)
        group.sin_port = in_port_t(UInt16(port).bigEndian)
        inet_pton(AF_INET, "239.255.255.250", &group.sin_addr)

        let perBatch = max(1, peers * ratePerPeer / 100)  // 100 batches a second
        let clock = ContinuousClock()
        let start = clock.now
        var sent = 0
        var next = 0
        for batch in 0..<(seconds * 100) {
            for _ in 0..<perBatch {
                let peer = next % peers
                next += 1
                let result = datagrams[peer].withUnsafeBytes { bytes in
                    withUnsafePointer(to: &group) {
                        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                            sendto(sockets[peer % sourceCount], bytes.baseAddress, bytes.count, 0, $0,
                                   socklen_t(MemoryLayout<sockaddr_in>.size))
                        }
                    }
                }
                if result > 0 { sent += 1 }
            }
            let due = start + .milliseconds(10 * (batch + 1))
            if clock.now < due { try? sleepUntil(until: due, clock: clock) }
        }
        print(sent)
    }

    private func sleepUntil(until deadline: ContinuousClock.Instant, clock: ContinuousClock) throws {
        let remaining = deadline - clock.now
        let micros = remaining.components.seconds * 1_000_000 + remaining.components.attoseconds / 1_000_000_000_000
        if micros > 0 { usleep(useconds_t(micros)) }
    }
}

struct POSIXFailure: Error, CustomStringConvertible {
    let call: String
    var description: String { "\(call) failed: errno \(errno)" }
}
