import ArgumentParser
import Foundation
import Logging
import NIOCore
import NIOPosix
import ThaliBeacons
import ThaliNodeCore
import ThaliSSDP
import ThaliSupport

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

    // The same names as `run`'s for the same things (`--interface-address`, `--group` and `--http-port`
    // still work); `--port` is the TCP port here too, as in `run`.
    @OptionGroup var options: NodeOptions

    @Option(name: [.customLong("address"), .customLong("interface-address")],
            help: ArgumentHelp("IPv4 address of the interface to pin discovery to (127.0.0.1 for lo).", valueName: "ip"))
    var address: String = "127.0.0.1"

    @Option(name: [.customLong("ssdp-group"), .customLong("group")],
            help: "SSDP multicast group (default: the configuration's ssdpMulticastAddress).")
    var ssdpGroup: String?

    @Option(help: "SSDP multicast port, UDP (default: the configuration's ssdpPort).")
    var ssdpPort: Int?

    @Option(name: [.customLong("port"), .customLong("http-port")], help: "TCP port of the beacon server (0: any free port).")
    var port: Int = 0

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

    @Flag(help: "Accepted for symmetry with the other commands: the output is always JSON lines.")
    var json = false

    func validate() throws {
        if beaconsHex != nil && beaconsFile != nil {
            throw ValidationError("give --beacons-hex or --beacons-file, not both")
        }
        if let ssdpPort, !(1...65535).contains(ssdpPort) { throw ValidationError("--ssdp-port must be in 1...65535") }
        guard (0...65535).contains(port) else { throw ValidationError("--port must be in 0...65535") }
        guard IPv4Address.isValid(address) else { throw ValidationError("--address '\(address)' is not an IPv4 address") }
        if let ssdpGroup, !IPv4Address.isMulticast(ssdpGroup) {
            throw ValidationError("--ssdp-group '\(ssdpGroup)' is not an IPv4 multicast address (224.0.0.0 to 239.255.255.255)")
        }
        guard maxAge >= 1, aliveIntervalMs >= 10, backgroundIntervalS >= 1, searchIntervalS >= 1, maxPeers >= 1,
            maxDatagramsPerSecond >= 1, cooldownS >= 1
        else { throw ValidationError("intervals, ages and limits must be positive (alive interval at least 10 ms)") }
    }

    func run() async throws {
        // Defaults from the data directory's config.json, as `run` takes them.
        let node = try NodeConfiguration.load(home: try options.checkedHome(writing: false))
        var configuration = SSDPDiscoveryConfiguration(interfaceAddress: address)
        configuration.groupAddress = ssdpGroup ?? node.ssdpMulticastAddress
        configuration.port = ssdpPort ?? node.ssdpPort
        configuration.httpPort = port
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
                switch DiscoverInput(line) {
                case .none: continue
                case .stop: stopSignal.continuation.yield("stdin")
                case .beacons(let bytes):
                    Task {
                        await service.advertise(bytes)
                        output.print(["event": "advertising", "usn": await service.uniqueServiceName() ?? ""])
                    }
                case .background(let on):
                    Task {
                        await service.setBackground(on)
                        output.print(["event": "background", "on": on])
                    }
                case .invalid(let message):
                    output.print(["event": "error", "message": message, "line": line])
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
            // The names `run`'s status uses (`worst_loop_lag_ms`, not `..._milliseconds`).
            if let label = child.label, let value = child.value as? Int {
                counts[snakeCased(label).replacingOccurrences(of: "_milliseconds", with: "_ms")] = value
            }
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

/// A line of `discover`'s standard input: `stop`, `beacons HEX`, `beacons none`, `background on|off`;
/// anything else is invalid with the reason (and changes nothing: a bad `beacons` line used to stop the
/// advertising).
enum DiscoverInput: Equatable {
    case stop
    /// Advertise these bytes (nil: nothing).
    case beacons([UInt8]?)
    case background(Bool)
    case invalid(String)

    /// Nil for a blank line.
    init?(_ line: String) {
        let words = line.split(whereSeparator: \.isWhitespace).map(String.init)
        guard let command = words.first else { return nil }
        let usage = "commands: stop, beacons HEX, beacons none, background on, background off"
        switch (command, words.count) {
        case ("stop", 1): self = .stop
        case ("beacons", 2) where words[1] == "none": self = .beacons(nil)
        case ("beacons", 2):
            guard words[1].count % 2 == 0, let bytes = Hex.decode(words[1]), !bytes.isEmpty else {
                self = .invalid("beacons: '\(words[1].prefix(64))' is not hex bytes (an even number of hex digits), nor none")
                return
            }
            self = .beacons(bytes)
        case ("background", 2) where ["on", "off"].contains(words[1]): self = .background(words[1] == "on")
        case ("background", _): self = .invalid("background takes on or off")
        case ("beacons", _): self = .invalid("beacons takes one argument: HEX or none")
        default: self = .invalid("unknown command '\(command.prefix(64))'; \(usage)")
        }
    }
}
