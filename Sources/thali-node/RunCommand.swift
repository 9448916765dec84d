import ArgumentParser
import Foundation
import Logging
import NIOCore
import NIOPosix
import ServiceLifecycle
import UnixSignals
import Synchronization
import ThaliBLEBinding
import ThaliBeacons
import ThaliNodeBluetooth
import ThaliNodeCore

/// `thali-node run`: keeps the peer on the network — advertises for contacts it holds items for, finds
/// contacts that hold items for it, delivers and receives — until SIGINT/SIGTERM or `--duration`.
struct Run: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Keep the peer on the network: discover contacts, deliver the outbox, receive into the inbox.",
        discussion: """
            Human-readable lines by default; --json prints one JSON object per line (event: started, \
            location_changed, advertising, peer_appeared, peer_left, matched, connecting, connected, connection_failed, \
            offered, transfer_started, progress, delivered, refused, deferred, refused_offer, rejected, discarded, received, duplicate, \
            session_ended, disconnected, relay_listening, relay_reopened, relay_closed, relay_port_unavailable, \
            relay_app_unreachable, limit_triggered, binding_unavailable, expired, status, stopped). \
            One run at a time per data directory: it holds run.lock there until it exits. Logs go to standard error at the \
            configuration's logLevel. SIGINT and SIGTERM stop cleanly (byebye) and exit 0.
            """)

    /// Names a scope in the environment to replace RFCOMM with ``CrossProcessBluetoothTransport``: host
    /// tests of several `run` processes, with BlueZ played by python-dbusmock (`DBUS_SYSTEM_BUS_ADDRESS`).
    static let standInEnvironmentKey = "THALI_BLUETOOTH_STANDIN"

    @OptionGroup var options: NodeOptions
    @Option(help: ArgumentHelp("Network interface to use, following its IPv4 address as it changes (default: the configuration's, else the first up with IPv4).", valueName: "name"))
    var interface: String?
    @Option(help: ArgumentHelp("IPv4 address to pin to instead, kept fixed (127.0.0.1 for loopback).", valueName: "ip"))
    var address: String?
    @Option(help: "SSDP multicast port (default: the configuration's ssdpPort).") var ssdpPort: Int?
    @Option(help: "SSDP multicast group (default: the configuration's ssdpMulticastAddress).") var ssdpGroup: String?
    @Option(help: "The one TCP port for beacons and PSK-TLS (default: the configuration's deliveryPort; 0: any).")
    var port: Int?
    @Option(help: "SSDP max-age announced, in seconds.") var maxAge: Int = 60
    @Option(help: ArgumentHelp("Relay mode: forward authenticated streams to this local TCP port.", valueName: "port"))
    var appPort: Int?
    @Option(name: .customLong("relay-port"), parsing: .singleValue,
            help: ArgumentHelp("Relay mode: the local port of a contact's relay listener, as NAME=PORT (repeatable; default: a free port, kept across reconnects). Needs no --app-port: a node whose apps only connect out gives just this.",
                               valueName: "contact=port"))
    var relayPorts: [String] = []
    @Flag(help: "Also use Bluetooth: BLE discovery through BlueZ (bluetoothd), RFCOMM to the peers found.")
    var bluetooth = false
    @Option(help: ArgumentHelp("The Bluetooth adapter (default: the first powered one).", valueName: "name"))
    var adapter: String?
    @Argument(help: ArgumentHelp("With --bluetooth, the adapter may follow it: `run --bluetooth hci1` (as --adapter).",
                                 valueName: "adapter"))
    var bluetoothAdapter: String?
    @Flag(help: "Bluetooth only: no SSDP; the single port listens on 127.0.0.1, reached through the relay.")
    var noWifi = false
    @Flag(help: "Print one JSON object per line instead of readable lines.") var json = false
    // `.unconditional`: a negative number is a value to refuse in words, not a missing one.
    @Option(parsing: .unconditional, help: ArgumentHelp("Print a compact status every this many seconds (0: never).", valueName: "seconds"))
    var statusInterval: Double = 0
    @Option(parsing: .unconditional, help: ArgumentHelp("Stop after this many seconds.", valueName: "seconds")) var duration: Double?
    @Option(help: ArgumentHelp("Connections accepted per source address per 10 s (all peers on one host share 127.0.0.1).", valueName: "n"))
    var perSourceLimit: Int?
    @Option(help: ArgumentHelp("Testing aid: cap each delivery stream this peer sends on to this many bytes per second.", valueName: "bytes"))
    var throttle: Int?

    func validate() throws {
        if interface != nil && address != nil { throw ValidationError("give --interface or --address, not both") }
        for (name, value, range) in [("--ssdp-port", ssdpPort, 1...65535), ("--port", port, 0...65535),
                                     ("--app-port", appPort, 1...65535)] {
            if let value, !range.contains(value) { throw ValidationError("\(name) must be in \(range)") }
        }
        if maxAge < 1 { throw ValidationError("--max-age must be at least 1") }
        if let address, !IPv4Address.isValid(address) {
            throw ValidationError("--address '\(address)' is not an IPv4 address (such as 127.0.0.1 or 192.168.1.20)")
        }
        if let ssdpGroup, !IPv4Address.isMulticast(ssdpGroup) {
            throw ValidationError("--ssdp-group '\(ssdpGroup)' is not an IPv4 multicast address (224.0.0.0 to 239.255.255.255; SSDP's is 239.255.255.250)")
        }
        _ = try Self.parseRelayPorts(relayPorts)
        if let perSourceLimit, perSourceLimit < 1 { throw ValidationError("--per-source-limit must be at least 1") }
        if let throttle, throttle < 1 { throw ValidationError("--throttle must be at least 1") }
        if let duration, duration <= 0 { throw ValidationError("--duration must be positive") }
        if statusInterval < 0 { throw ValidationError("--status-interval must not be negative") }
        if let bluetoothAdapter {
            guard bluetooth else {
                // The word is more often the value of a mistyped option (`--adress 127.0.0.1`): name that.
                if let unknown = Self.unknownOption(before: bluetoothAdapter, in: Array(CommandLine.arguments.dropFirst())) {
                    throw ValidationError(unknown)
                }
                throw ValidationError("unexpected argument '\(bluetoothAdapter)': an adapter name follows --bluetooth")
            }
            if let adapter, adapter != bluetoothAdapter {
                throw ValidationError("two adapters given: '\(bluetoothAdapter)' and --adapter '\(adapter)'")
            }
        }
    }

    /// `--relay-port` values (`NAME=PORT`) by contact name; a malformed one, a port out of range or a
    /// contact named twice is a usage error.
    static func parseRelayPorts(_ values: [String]) throws -> [String: Int] {
        var ports: [String: Int] = [:]
        for value in values {
            guard let equals = value.lastIndex(of: "="), let port = Int(value[value.index(after: equals)...]),
                  !value[..<equals].isEmpty else {
                throw ValidationError("--relay-port '\(value)': give a contact and a port, as NAME=PORT (alice=5984)")
            }
            guard (1...65535).contains(port) else { throw ValidationError("--relay-port '\(value)': the port must be in 1...65535") }
            let name = String(value[..<equals])
            guard ports.updateValue(port, forKey: name) == nil else {
                throw ValidationError("--relay-port: two ports given for \(name)")
            }
        }
        return ports
    }

    /// Refuses at start what can be known at start of the pinned relay ports: one port for two contacts,
    /// a pin equal to the node's own port, a port another process holds now (a run that accepted it
    /// used to close every session with that contact later, texts too).
    static func checkRelayPortsFree(_ ports: [String: Int], nodePort: Int) throws {
        let byPort = Dictionary(grouping: ports.keys.sorted()) { ports[$0] ?? 0 }
        for (port, names) in byPort.sorted(by: { $0.key < $1.key }) {
            if names.count > 1 {
                throw ValidationError("--relay-port: port \(port) is pinned for \(names.joined(separator: " and ")); give each contact its own port")
            }
            if port == nodePort {
                throw ValidationError("--relay-port \(names[0])=\(port): \(port) is this node's own port (--port); give another")
            }
            if let reason = TCPPortProbe.unavailableReason(host: "127.0.0.1", port: port) {
                throw CommandFailure(exitCode: .unavailable,
                                     message: "--relay-port \(names[0])=\(port): port \(port) on 127.0.0.1 cannot be used: \(reason); free it or pin another port")
            }
        }
    }

    /// When `value` follows an option `run` does not have, the complaint about that option, with the
    /// nearest known one (as ArgumentParser words it).
    static func unknownOption(before value: String, in arguments: [String]) -> String? {
        guard let index = arguments.firstIndex(of: value), index > 0, arguments[index - 1].hasPrefix("--") else { return nil }
        let option = arguments[index - 1]
        let known = Set(helpMessage().matches(of: /--[a-z][a-z-]*/).map { String($0.output) })
        guard !known.contains(option) else { return nil }
        let closest = known.map { ($0, CommandLineArguments.editDistance($0, option)) }.min { $0.1 < $1.1 }
        return "Unknown option '\(option)'" + (closest.flatMap { $0.1 < 4 ? ". Did you mean '\($0.0)'?" : nil } ?? "")
    }

    func run() async throws {
        let home = try options.checkedHome(writing: true)
        // Before anything is created: a run that cannot start leaves no half-made data directory behind.
        let identity = try NodeIdentity.load(from: home)
        let (store, nodeConfiguration) = try options.openStore()
        let level = nodeConfiguration.logLevel
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        var overrides = PeerConfiguration.NodeOverrides()
        (overrides.interface, overrides.address) = (interface, address)
        (overrides.ssdpPort, overrides.ssdpGroup, overrides.port, overrides.maxAge) = (ssdpPort, ssdpGroup, port, maxAge)
        (overrides.appPort, overrides.sendThrottleBytesPerSecond) = (appPort, throttle)
        overrides.maxConnectionsPerSource = perSourceLimit
        // The flags add to config.json's wifi, bluetooth and bluetoothAdapter.
        (overrides.bluetooth, overrides.noWiFi, overrides.bluetoothAdapter) = (bluetooth, noWifi, adapter ?? bluetoothAdapter)
        var configuration: PeerConfiguration
        do {
            configuration = try PeerConfiguration(node: nodeConfiguration, configurationPath: home.configurationPath,
                                                  overrides: overrides, bluetooth: BluetoothPeerConfiguration.init)
        } catch let error as PeerConfiguration.NodeResolutionError {
            throw ValidationError(error.description)
        }
        configuration.relayPorts = try Self.parseRelayPorts(relayPorts)
        if !configuration.relayPorts.isEmpty {
            for name in configuration.relayPorts.keys.sorted() where (try? store.contact(named: name)) == nil {
                throw NodeError.unknownContact(name)
            }
            try Self.checkRelayPortsFree(configuration.relayPorts, nodePort: configuration.port)
        }
        if var bluetoothConfiguration = configuration.bluetooth {
            let environment = ProcessInfo.processInfo.environment
            if let bus = environment["DBUS_SYSTEM_BUS_ADDRESS"] { bluetoothConfiguration.busAddress = bus }
            // Test configuration only: host tests of whole processes, where there is no radio.
            if let scope = environment[Self.standInEnvironmentKey], !scope.isEmpty {
                guard scope.utf8.count <= CrossProcessBluetoothTransport.maxScopeLength else {
                    throw ValidationError("\(Self.standInEnvironmentKey) is longer than \(CrossProcessBluetoothTransport.maxScopeLength) bytes")
                }
                StandardStream.error.write("thali-node: Bluetooth streams use the cross-process stand-in (scope \(scope)), not RFCOMM: a test configuration\n")
                bluetoothConfiguration.transport = { CrossProcessBluetoothTransport(scope: scope, localAddress: $0) }
            }
            configuration.bluetooth = bluetoothConfiguration
        }

        // One run per data directory (two would advertise and deliver the same items); held until exit.
        // Taken once the options are known to be valid, so that a refused command line changes nothing.
        let lock = try RunLock(home: home)
        // Followers (`thali-node events`, a conformance adapter) read the events from the data directory;
        // `thali-node send` in another process nudges the peer through it to read the store at once.
        let nudgeTarget = NudgeTarget()
        let feed: NodeEventFeed?
        do {
            feed = try await NodeEventFeed.start(at: home.eventsSocketPath, group: MultiThreadedEventLoopGroup.singleton,
                                                 nudged: { nudgeTarget.nudge() })
        } catch {
            feed = nil
            StandardStream.error.write("thali-node: events cannot be followed (`thali-node events`): \(error)\n")
        }
        let output = RunOutput(json: json, feed: feed)
        store.observeExpiry { items in
            for item in items { output.expired(item) }
        }
        let peer = try ThaliPeer(store: store, identity: identity, configuration: configuration,
                                 logger: Logger(label: "thali.node"), runLock: lock, events: { output.report($0) })
        nudgeTarget.set(peer)
        // The peer runs as a swift-service-lifecycle service: SIGTERM and SIGINT shut the group down
        // gracefully (byebye, connections closed); `--duration` does the same from a timer.
        let reason = StopReason()
        // Services shut down in reverse order: the signal's name is recorded last, once it surely arrived.
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = [
            .init(service: SignalNamer(reason: reason), successTerminationBehavior: .ignore),
            .init(service: peer),
        ]
        if statusInterval > 0 {
            services.append(.init(service: StatusTicker(peer: peer, output: output, interval: statusInterval),
                                  successTerminationBehavior: .ignore))
        }
        if let duration {
            services.append(.init(service: DurationLimit(seconds: duration, reason: reason),
                                  successTerminationBehavior: .gracefullyShutdownGroup))
        }
        var group = ServiceGroupConfiguration(services: services, logger: Logger(label: "thali.node.lifecycle"))
        group.gracefulShutdownSignals = [.sigterm, .sigint]
        let serviceGroup = ServiceGroup(configuration: group)
        // Output that goes away (`run | head -1`, a `tee` stopped by Ctrl-C, `> /dev/full`) stops the peer as
        // SIGTERM does: byebye, connections closed, the lock and events.sock released.
        StandardStream.output.onFailure { failure in
            reason.set(failure == .closed ? "output_closed" : "output_failed")
            Task { await serviceGroup.triggerGracefulShutdown() }
        }
        StandardStream.output.watchForClosedReader()
        try await serviceGroup.run()
        output.status(await peer.status())
        let stopReason = reason.value ?? "end"
        var stopped = NodeEvent.stopped(reason: stopReason).record
        stopped.summary = "stopped (\(stopReason))"
        output.print(stopped)
        await feed?.close()
        withExtendedLifetime(lock) {}
        // A reader that went away is how `| head` ends: exit 0. Any other failure lost lines: say so.
        if case .failed(let number, let why) = StandardStream.output.failure {
            throw CommandFailure(exitCode: .ioError, message: "standard output failed (\(why), errno \(number)); the node stopped cleanly")
        }
    }
}

/// The peer a nudge on the event feed reaches, once it exists (the feed starts first, so that followers
/// see the peer's first events).
final class NudgeTarget: Sendable {
    private let peer = Mutex<ThaliPeer?>(nil)
    func set(_ peer: ThaliPeer) { self.peer.withLock { $0 = peer } }
    func nudge() { peer.withLock { $0 }?.storeChanged() }
}

/// Why `run` stopped: the signal's name, or `duration`; the first one set wins.
final class StopReason: Sendable {
    private let reason = Mutex<String?>(nil)
    var value: String? { reason.withLock { $0 } }
    func set(_ value: String) { reason.withLock { if $0 == nil { $0 = value } } }
}

/// Names the signal that stops the peer (the `ServiceGroup` itself handles it: graceful shutdown).
struct SignalNamer: Service {
    let reason: StopReason

    func run() async throws {
        let signals = await UnixSignalsSequence(trapping: .sigterm, .sigint)
        // Keeps listening until its own turn to shut down: a service that ends early during a graceful
        // shutdown is an error to the group.
        for await signal in signals.cancelOnGracefulShutdown() {
            reason.set(signal == .sigterm ? "SIGTERM" : "SIGINT")
        }
    }
}

/// `--status-interval`: prints the peer's status periodically until shutdown.
struct StatusTicker: Service {
    let peer: ThaliPeer
    let output: RunOutput
    let interval: Double

    func run() async throws {
        // Ends quietly on shutdown: the final status is printed once the peer stopped.
        try? await cancelWhenGracefulShutdown { [peer, output, interval] in
            while true {
                try await Task.sleep(for: .seconds(interval))
                output.status(await peer.status())
            }
        }
    }
}

/// `--duration`: returns after the given time, which shuts the group down gracefully.
struct DurationLimit: Service {
    let seconds: Double
    let reason: StopReason

    func run() async throws {
        // Returns early on graceful shutdown (a signal came first): then the signal names the reason.
        let elapsed = (try? await cancelWhenGracefulShutdown { [seconds] in
            try await Task.sleep(for: .seconds(seconds))
            return true
        }) ?? false
        if elapsed { reason.set("duration") }
    }
}

/// Prints the peer's events: readable lines, or one JSON object per line; flushed, from any thread.
/// Progress: with `--json` at most every 250 ms per item (and always at its end); on a terminal one line
/// per transfer redrawn in place (rate, time left), which the next event's line replaces; elsewhere (a
/// file, a pipe) a plain line at most every ``plainProgressInterval``.
final class RunOutput: Sendable {
    private let json: Bool
    private let feed: NodeEventFeed?
    private let start = Date()
    /// Whether readable lines go to a terminal (progress redraws in place).
    private let terminal: Bool
    private struct Transfer {
        var first: (time: Date, bytes: UInt64)
        var lastShown: Date
    }
    private struct Screen {
        var transfers: [UUID: Transfer] = [:]
        /// A progress line is on the terminal without its newline: the next line replaces it.
        var progressShown = false
    }
    private let screen = Mutex(Screen())

    /// How often a transfer's progress is printed as a plain line when standard output is no terminal.
    static let plainProgressInterval: TimeInterval = 2
    /// How often it is redrawn on a terminal, and printed with `--json`.
    static let progressInterval: TimeInterval = 0.25

    /// Prints readable lines, or JSON lines with `json`; every record also goes to `feed`'s followers as
    /// a JSON line.
    init(json: Bool, feed: NodeEventFeed? = nil) {
        self.json = json
        self.feed = feed
        terminal = !json && isatty(STDOUT_FILENO) == 1
    }

    /// Prints `record`, stamped with the time since the start.
    func print(_ record: PeerEventRecord) {
        print(record, readable: record.summary, inPlace: false)
    }

    /// Prints `record` (as `readable` in readable mode, where nil prints nothing: the feed and `--json`
    /// still get it); `inPlace`: a progress line to redraw on a terminal.
    private func print(_ record: PeerEventRecord, readable: String?, inPlace: Bool) {
        let elapsed = Date().timeIntervalSince(start)
        var stamped = record
        stamped.t = (elapsed * 1000).rounded() / 1000
        let line = try? stamped.jsonLine() + Data("\n".utf8)
        if let line { feed?.publish(line) }
        if json {
            guard let line else { return }
            StandardStream.output.write(line)
            return
        }
        guard let readable else { return }
        // Summaries carry texts, names and reasons from other peers: escaped for the terminal.
        let text = String(format: "%8.3fs  ", elapsed) + TerminalText.escaped(Self.roundingDurations(readable))
        screen.withLock { screen in
            let clear = screen.progressShown ? "\r\u{1B}[K" : ""
            screen.progressShown = inPlace
            StandardStream.output.write(clear + text + (inPlace ? "" : "\n"))
        }
    }

    /// `text` with the durations Swift prints in full (`0.22570350109114892 seconds`) rounded for people
    /// (`0.23 s`); `--json` keeps exact milliseconds.
    static func roundingDurations(_ text: String) -> String {
        text.replacing(/(\d+\.\d+) seconds/) { match in
            let seconds = Double(match.output.1) ?? 0
            return String(format: seconds < 10 ? "%.2f s" : "%.0f s", seconds)
        }
    }

    /// Reports an item dropped undelivered because it expired (`expired`, with its id and kind).
    func expired(_ item: OutboxItem) {
        var record = NodeEvent.expired(NodeEvent.Item(id: item.id, kind: item.kind, size: item.size, fileName: item.fileName)).record
        record.summary = "\(item.id.uuidString.prefix(8)) expired undelivered and was deleted "
            + "(\(item.kind == .text ? "a text" : "file \(item.fileName ?? "?")"), \(item.size) bytes)"
        print(record)
    }

    func status(_ status: PeerStatus) {
        print(PeerEventRecord(status))
    }

    func report(_ event: PeerEvent) {
        guard case .delivery(let contact, .progress(let id, let bytes, let total)) = event else {
            guard let record = PeerEventRecord(event) else { return }
            // One line per event that matters: a delivery session that ended cleanly follows the
            // `delivered` and `received` lines that said what it did (JSON and followers still get it).
            if case .sessionEnded(_, _, nil) = event {
                print(record, readable: nil, inPlace: false)
            } else {
                print(record)
            }
            return
        }
        let now = Date()
        let ended = bytes >= total
        let interval = terminal || json ? Self.progressInterval : Self.plainProgressInterval
        let transfer = screen.withLock { screen -> Transfer? in
            guard var transfer = screen.transfers[id] else {
                let first = Transfer(first: (now, bytes), lastShown: now)
                screen.transfers[id] = ended ? nil : first
                return first
            }
            if !ended && now.timeIntervalSince(transfer.lastShown) < interval { return nil }
            transfer.lastShown = now
            screen.transfers[id] = ended ? nil : transfer
            return transfer
        }
        guard let transfer, let record = PeerEventRecord(event) else { return }
        print(record, readable: Self.progressLine(id: id, contact: "\(contact)", bytes: bytes, total: total, since: transfer.first, now: now),
              inPlace: terminal && !ended)
    }

    /// `  7A1B2C3D with bob: 45 %, 230.1 MB of 512.0 MB, 120.3 MB/s, 2 s left`: the rate since the
    /// transfer's first report in this run.
    static func progressLine(id: UUID, contact: String, bytes: UInt64, total: UInt64, since first: (time: Date, bytes: UInt64),
                             now: Date) -> String {
        let percent = total == 0 ? 100 : bytes * 100 / total
        var line = "  \(id.uuidString.prefix(8)) with \(contact): \(percent) %, \(ByteCount.format(Int64(clamping: bytes))) of "
            + ByteCount.format(Int64(clamping: total))
        let seconds = now.timeIntervalSince(first.time)
        if seconds > 0.1, bytes > first.bytes {
            let rate = Double(bytes - first.bytes) / seconds
            line += ", \(ByteCount.format(Int64(rate)))/s"
            if bytes < total {
                let left = Double(total - bytes) / rate
                line += left < 60 ? String(format: ", %.0f s left", left.rounded(.up)) : String(format: ", %.0f min left", (left / 60).rounded(.up))
            }
        }
        return line
    }
}
