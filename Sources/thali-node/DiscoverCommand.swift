import ArgumentParser
import Foundation
import Logging
import NIOCore
import NIOPosix
import ThaliBeacons
import ThaliSSDP

/// `thali-node discover`: runs SSDP discovery on one interface and prints what it sees as JSON lines.
///
/// Standard input takes commands, one per line: `beacons <hex>` (advertise a new stream: new USN,
/// byebye then alive), `beacons none`, `background on|off`, `stop`. SIGTERM and SIGINT stop cleanly
/// (byebye); the last line is `{"event":"stopped", ...}` with the counters.
struct Discover: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Discover Thali peers over SSDP and serve this peer's beacons at /NotificationBeacons.",
        discussion: """
            Prints one JSON object per line: started (our location and USN), appeared, changed, fetched, \
            beacons (with beacons_hex), fetch_failed, left (reason byebye, expired or stopped), limit, \
            advertising, stopped (with the counters). Reads commands from standard input: \
            "beacons <hex>" or "beacons none", "background on|off", "stop". SIGTERM and SIGINT stop \
            cleanly (byebye).
            """)

    @Option(help: "IPv4 address of the interface to pin discovery to (127.0.0.1 for lo).")
    var interfaceAddress: String = "127.0.0.1"

    @Option(help: "Multicast group.")
    var group: String = "239.255.255.250"

    @Option(help: "Multicast port.")
    var port: Int = 1900

    @Option(help: "TCP port of the beacon server (0: any free port).")
    var httpPort: Int = 0

    @Option(help: "Beacon stream to advertise, as hex (the app's bytes; opaque here).")
    var beaconsHex: String?

    @Option(help: "File whose bytes are the beacon stream to advertise.")
    var beaconsFile: String?

    @Option(help: "CACHE-CONTROL max-age to announce, in seconds.")
    var maxAge: Int = 60

    @Option(help: "Foreground alive interval, in milliseconds.")
    var aliveIntervalMs: Int = 500

    @Option(help: "Background alive interval, in seconds.")
    var backgroundIntervalS: Int = 60

    @Flag(help: "Start in background mode (the slow alive rate).")
    var background = false

    @Option(help: "Shortest interval between M-SEARCHes, in seconds.")
    var searchIntervalS: Int = 300

    @Option(help: "Most peers tracked before discovery switches off for the cool-down.")
    var maxPeers: Int = 100

    @Option(help: "Datagrams per second beyond which discovery switches off for the cool-down.")
    var maxDatagramsPerSecond: Int = 400

    @Option(help: "Discovery cool-down after a flood, in seconds.")
    var cooldownS: Int = 60

    @Option(help: "Stop after this many seconds (default: run until stopped).")
    var duration: Double?

    func validate() throws {
        if beaconsHex != nil && beaconsFile != nil {
            throw ValidationError("give --beacons-hex or --beacons-file, not both")
        }
        guard (1...65535).contains(port), (0...65535).contains(httpPort) else { throw ValidationError("bad port") }
        guard maxAge >= 1, aliveIntervalMs >= 10, backgroundIntervalS >= 1, searchIntervalS >= 1, maxPeers >= 1,
            maxDatagramsPerSecond >= 1, cooldownS >= 1
        else { throw ValidationError("intervals, ages and limits must be positive (alive interval at least 10 ms)") }
    }

    func run() async throws {
        var configuration = SSDPDiscoveryConfiguration(interfaceAddress: interfaceAddress)
        configuration.groupAddress = group
        configuration.port = port
        configuration.httpPort = httpPort
        configuration.maxAge = maxAge
        configuration.foregroundAliveInterval = .milliseconds(Int64(aliveIntervalMs))
        configuration.backgroundAliveInterval = .seconds(Int64(backgroundIntervalS))
        configuration.background = background
        configuration.searchInterval = .seconds(Int64(searchIntervalS))
        configuration.limits.maxTrackedPeers = maxPeers
        configuration.limits.maxDatagramsPerWindow = maxDatagramsPerSecond
        configuration.limits.discoveryCooldown = .seconds(Int64(cooldownS))

        var beacons: [UInt8]?
        if let beaconsHex {
            guard let bytes = Hex.decode(beaconsHex) else { throw ValidationError("--beacons-hex is not hex") }
            beacons = bytes
        } else if let beaconsFile {
            beacons = [UInt8](try Data(contentsOf: URL(fileURLWithPath: beaconsFile)))
        }

        let output = DiscoverJSONLines()
        let service = SSDPDiscoveryService(configuration: configuration, group: MultiThreadedEventLoopGroup.singleton) {
            peer, bytes in
            output.print(["event": "beacons", "usn": peer.uniqueServiceName, "location": peer.location.description,
                          "beacons_hex": Hex.encode(bytes)])
        }
        try await service.start(advertising: beacons)
        output.print(["event": "started", "location": (await service.location()).description,
                      "usn": await service.uniqueServiceName() ?? ""])

        let stopSignal = AsyncStream<String>.makeStream()
        let signals = [SIGTERM, SIGINT].map { number -> DispatchSourceSignal in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number)
            source.setEventHandler { stopSignal.continuation.yield("signal") }
            source.resume()
            return source
        }
        if let duration {
            Task {
                try? await Task.sleep(for: .seconds(duration))
                stopSignal.continuation.yield("duration")
            }
        }
        let stdinReader = Thread {
            while let line = readLine() {
                let words = line.split(separator: " ").map(String.init)
                switch words.first {
                case "stop": stopSignal.continuation.yield("stdin")
                case "beacons" where words.count == 2:
                    let bytes = words[1] == "none" ? nil : Hex.decode(words[1])
                    Task {
                        await service.advertise(bytes)
                        output.print(["event": "advertising", "usn": await service.uniqueServiceName() ?? ""])
                    }
                case "background" where words.count == 2:
                    Task { await service.setBackground(words[1] == "on") }
                default:
                    output.print(["event": "error", "message": "unknown command"])
                }
            }
        }
        stdinReader.start()

        let eventsTask = Task {
            for await event in service.events { output.print(Self.describe(event)) }
        }
        var reasons = stopSignal.stream.makeAsyncIterator()
        let reason = await reasons.next() ?? "end"
        await service.stop()
        await eventsTask.value
        let counters = await service.counters()
        var counts: [String: Int] = [:]
        for child in Mirror(reflecting: counters).children {
            if let label = child.label, let value = child.value as? Int { counts[snakeCased(label)] = value }
        }
        for (kind, count) in counters.beaconFetchFailuresByKind { counts["beacon_fetch_failures_\(kind.rawValue)"] = count }
        output.print(["event": "stopped", "reason": reason, "counters": counts])
        signals.forEach { $0.cancel() }
    }

    static func describe(_ event: SSDPDiscoveryEvent) -> [String: String] {
        func peer(_ peer: SSDPPeer) -> [String: String] {
            ["usn": peer.uniqueServiceName, "location": peer.location.description]
        }
        switch event {
        case .appeared(let p): return peer(p).merging(["event": "appeared"]) { $1 }
        case .changed(let p, let previous):
            return peer(p).merging(["event": "changed", "previous_usn": previous]) { $1 }
        case .beaconsFetched(let p): return peer(p).merging(["event": "fetched"]) { $1 }
        case .beaconFetchFailed(let p, let failure):
            return peer(p).merging(["event": "fetch_failed", "kind": failure.kind.rawValue, "reason": failure.detail]) { $1 }
        case .left(let p, let reason): return peer(p).merging(["event": "left", "reason": reason.rawValue]) { $1 }
        case .limitTriggered(let kind): return ["event": "limit", "kind": kind.rawValue]
        }
    }
}

/// Prints one JSON object per line, whole, from any thread (``StandardStream`` keeps lines apart).
final class DiscoverJSONLines: Sendable {
    func print(_ object: [String: Any]) {
        guard let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])
        else { return }
        StandardStream.output.write(data + Data("\n".utf8))
    }
}
