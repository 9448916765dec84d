import ArgumentParser
import Dispatch
import Foundation
import NIOCore
import NIOPosix
import ThaliBLEBinding
import ThaliBeacons
import ThaliConformance
import ThaliNodeCore
import ThaliSSDP

/// `thali-node conformance peer`: grades another implementation as its contact, layer by layer.
struct ConformancePeerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "peer",
        abstract: "Grade another implementation as its contact: SSDP, beacons, PSK-TLS, yamux, delivery both ways.",
        discussion: """
            The implementation under test must have the suite's identity (--identity) as a contact, and \
            --peer-key is its public key. The suite finds it over SSDP (or at --location), fetches and \
            matches its beacon, connects with PSK-TLS, opens a yamux stream and receives the item it has \
            queued for us; then it announces a beacon for it and delivers one item to it; then it runs \
            the negative TLS cases. With --bluetooth ADDRESS it does all of this over one Bluetooth link \
            instead (RFCOMM, or the stand-in with THALI_BLUETOOTH_STANDIN): the link's local port is the \
            implementation's location, and the implementation finds the suite by the link's 00 hello and \
            delivers over it; the SSDP cases are N/A. --adapter drives the implementation (spec/conformance.md, "Adapter \
            contract"), e.g. --adapter "thali-node --home DIR". Prints each case as it ends, then a \
            table; exits non-zero only when a MUST fails or --baseline does not hold. SIGINT prints what \
            the run has so far.
            """)

    @Option(help: "Public key of the implementation under test (SEC1 hex or base64).")
    var peerKey: String

    @Option(help: "The suite's identity key file (PEM); the implementation has its public key as a contact.")
    var identity: String

    @Option(help: "Our IPv4 address: SSDP and the suite's port are pinned to it.")
    var address = "127.0.0.1"

    @Option(help: "SSDP UDP port.")
    var ssdpPort = SSDPDiscoveryConfiguration.defaultPort

    @Option(help: "SSDP multicast group.")
    var ssdpGroup = SSDPDiscoveryConfiguration.defaultGroupAddress

    @Option(help: "The implementation's beacon location, http://IPv4:PORT (skips waiting for SSDP).")
    var location: String?

    @Option(help: ArgumentHelp("The implementation's Bluetooth address: run over one Bluetooth link to it instead of Wi-Fi (no SSDP).",
                               valueName: "address"))
    var bluetooth: String?

    @Option(help: "With --bluetooth, the RFCOMM channel it listens on.")
    var channel = BluetoothConformanceConfiguration.defaultChannel

    @Option(help: ArgumentHelp("With --bluetooth, the address our link comes from (default: the kernel's choice; with the stand-in, 02:00:00:00:C0:DE).",
                               valueName: "address"))
    var localAddress: String?

    @Option(help: "Adapter command (split at spaces) meeting spec/conformance.md's contract, e.g. \"thali-node --home DIR\".")
    var adapter: String?

    @Option(help: "The name the implementation knows the suite by (for the adapter's send).")
    var nameAtPeer = "conformance"

    @Flag(help: "Add the suite as a contact through the adapter first.")
    var addContact = false

    @Option(help: "Beacon profile: spec or cordova.")
    var profile = "spec"

    @Option(help: "Longest wait for the implementation's beacons, in seconds.")
    var discoveryTimeoutS: Int64 = 15

    @Option(help: "Longest wait for one step, in seconds.")
    var stepTimeoutS: Int64 = 10

    @Flag(help: "Do not play the sender (deliver nothing to the implementation).")
    var noSenderRole = false

    @Option(help: "Longest wait for its close_notify and close after ours (PSK-6.4), in milliseconds.")
    var closeNotifyTimeoutMs: Int64 = 2000

    @Option(help: "Longest wait for its answer to a renegotiation (PSK-1.5), in milliseconds.")
    var renegotiationTimeoutMs: Int64 = 2000

    @Option(help: "Longest wait for a second announcement after an item is queued (BCN-1.3), in milliseconds.")
    var announcementWaitMs: Int64 = 3000

    @Option(help: "Searches sent at once to grade its answer delays (SSDP-4.3).")
    var searchesAtOnce = 8

    @Option(help: "How late a search answer may come past min(MX, 5) s (SSDP-4.3), in milliseconds.")
    var searchDelayToleranceMs: Int64 = 500

    @Option(help: "How long a raw yamux case still waits for an RST or GoAway once its Ping fence is answered, in milliseconds.")
    var fenceGraceMs: Int64 = 500

    @Option(help: "How long a raw yamux case waits for an RST or GoAway before it sends its Ping fence, in milliseconds.")
    var fenceDelayMs: Int64 = 250

    @OptionGroup var report: ReportOptions

    func validate() throws {
        if let location, BeaconLocation(parsing: location) == nil { throw ValidationError("\(location) is not http://IPv4:PORT") }
        if BeaconProfile(rawValue: profile) == nil { throw ValidationError("profile must be spec or cordova") }
        if discoveryTimeoutS < 1 || stepTimeoutS < 1 { throw ValidationError("timeouts must be at least 1 s") }
        for (name, value) in [("--close-notify-timeout-ms", closeNotifyTimeoutMs), ("--renegotiation-timeout-ms", renegotiationTimeoutMs),
                              ("--announcement-wait-ms", announcementWaitMs), ("--search-delay-tolerance-ms", searchDelayToleranceMs),
                              ("--fence-grace-ms", fenceGraceMs), ("--fence-delay-ms", fenceDelayMs)]
        where !(0...600_000).contains(value) {
            throw ValidationError("\(name) must be from 0 to 600000")
        }
        if !(1...64).contains(searchesAtOnce) { throw ValidationError("--searches-at-once must be from 1 to 64") }
        if let adapter, adapter.split(separator: " ").isEmpty { throw ValidationError("empty --adapter") }
        try validateBluetooth(bluetooth, localAddress: localAddress)
        if bluetooth != nil, location != nil { throw ValidationError("--bluetooth and --location exclude each other") }
    }

    func run() async throws {
        let peer = try ContactKey.parse(peerKey)
        let key = try IdentityKeyFile.load(from: identity)
        var configuration = PeerConformanceConfiguration(peerKey: peer, identity: key, address: address)
        configuration.ssdpPort = ssdpPort
        configuration.ssdpGroup = ssdpGroup
        configuration.location = location.flatMap(BeaconLocation.init(parsing:))
        configuration.adapter = adapter.map { ConformanceAdapter(command: $0.split(separator: " ").map(String.init)) }
        configuration.nameAtPeer = nameAtPeer
        configuration.addContact = addContact
        configuration.profile = BeaconProfile(rawValue: profile) ?? .spec
        configuration.discoveryTimeout = .seconds(discoveryTimeoutS)
        configuration.stepTimeout = .seconds(stepTimeoutS)
        configuration.senderRole = !noSenderRole
        configuration.closeNotifyTimeout = .milliseconds(closeNotifyTimeoutMs)
        configuration.renegotiationTimeout = .milliseconds(renegotiationTimeoutMs)
        configuration.announcementWait = .milliseconds(announcementWaitMs)
        configuration.searchesAtOnce = searchesAtOnce
        configuration.searchDelayTolerance = .milliseconds(searchDelayToleranceMs)
        configuration.fenceGrace = .milliseconds(fenceGraceMs)
        configuration.fenceDelay = .milliseconds(fenceDelayMs)
        if let bluetooth {
            configuration.bluetooth = try suiteBluetoothTarget(bluetooth, channel: channel, localAddress: localAddress)
        }

        if !report.json { printNow("conformance peer: \(ConformancePeerCommand.announcement(configuration))") }
        let over = configuration.bluetooth.map { " over Bluetooth \($0.address) channel \($0.channel)" } ?? ""
        try await report.grade(target: "peer \(peer.hexString(compressed: true))" + over, threads: 2) { [configuration] run, group in
            await PeerConformance(configuration: configuration, group: group).run(run)
        }
    }

    static func announcement(_ configuration: PeerConformanceConfiguration) -> String {
        let finding = configuration.bluetooth.map { "over one Bluetooth link to \($0.address) channel \($0.channel) (no SSDP)" }
            ?? configuration.location.map { "at \($0)" }
            ?? "over SSDP \(configuration.ssdpGroup):\(configuration.ssdpPort) on \(configuration.address)"
        return "finding the implementation \(finding); "
            + (configuration.senderRole ? "it will also connect to the suite and receive one item" : "receiver role only")
    }
}

/// Prints `line` and flushes standard output at once: progress must show while a run goes on, also when
/// the output is a pipe (block-buffered).
func printNow(_ line: String) {
    print(line)
    fflush(nil)  // all streams: naming stdout is not concurrency-safe in Swift 6
}

/// The options of every command that grades: the catalog quoted, the expected failures, where the report goes.
struct ReportOptions: ParsableArguments {
    @Option(help: "The requirement catalog (default: spec/requirements.json of this source tree).")
    var catalog: String?

    @Option(help: "Expected failures (thali-conformance-baseline/1), or an earlier --json-out of the same mode: its FAILs are expected, and --html-out shows what changed since.")
    var baseline: String?

    @Option(help: "Also write the report as JSON to this file.")
    var jsonOut: String?

    @Option(help: "Also write the report as JUnit XML to this file.")
    var junitOut: String?

    @Option(help: "Also write the report as one self-contained HTML page to this file.")
    var htmlOut: String?

    @Flag(help: "Print the report as JSON instead of the table (progress goes to standard error).")
    var json = false

    /// The catalog given, or the source tree's.
    func loadCatalog() throws -> RequirementCatalog {
        try RequirementCatalog.load(from: catalog ?? RequirementCatalog.defaultPath)
    }

    /// The baseline given, or none. An earlier report given as the baseline must be of the mode that
    /// `target` names: another mode's cases would all show as new and gone.
    func loadBaseline(for target: String) throws -> ConformanceBaseline {
        guard let baseline else { return ConformanceBaseline() }
        let loaded = try ConformanceBaseline(json: try Data(contentsOf: URL(fileURLWithPath: baseline)))
        let mode = ConformanceReport.mode(of: target)
        if let previous = loaded.previous, previous.mode != mode {
            throw CommandFailure(exitCode: .usage, message: "--baseline \(baseline) is a report of \(previous.mode) mode, not of \(mode) mode")
        }
        return loaded
    }

    /// Where the report goes; `baseline` is the run's, whose earlier report (if any) the HTML compares with.
    func outputs(baseline: ConformanceBaseline) -> ConformanceOutputs {
        ConformanceOutputs(json: json, jsonOut: jsonOut, junitOut: junitOut, htmlOut: htmlOut, previous: baseline.previous)
    }

    /// Runs `cases` against `target` on an event loop group of `threads`, printing each result as it ends
    /// (to standard error with `--json`); SIGINT prints what the run has and exits 130. Then writes the
    /// report and fails when a MUST failed or the baseline does not hold.
    func grade(target: String, threads: Int,
               _ cases: @Sendable (ConformanceRun, MultiThreadedEventLoopGroup) async -> Void) async throws {
        let json = self.json
        let baseline = try loadBaseline(for: target)
        let run = ConformanceRun(target: target, catalog: try loadCatalog(), baseline: baseline) { result in
            let line = TerminalText.escaped(ConformanceReport.progressLine(result))
            if json { StandardStream.error.write(line + "\n") } else { printNow(line) }
        }
        let outputs = self.outputs(baseline: baseline)
        // SIGINT: print what the run has and leave; the cases still running are abandoned.
        signal(SIGINT, SIG_IGN)
        let interrupt = DispatchSource.makeSignalSource(signal: SIGINT, queue: DispatchQueue(label: "conformance.sigint"))
        interrupt.setEventHandler {
            run.markInterrupted()
            do { try outputs.write(run.report) } catch { ThaliNode.report(error) }
            Foundation.exit(130)
        }
        interrupt.resume()
        let group = MultiThreadedEventLoopGroup(numberOfThreads: threads)
        await cases(run, group)
        interrupt.cancel()
        try? await group.shutdownGracefully()
        let report = run.report
        try outputs.write(report)
        if !report.succeeded { throw ExitCode.failure }
    }
}

/// Where a report goes: the table (or JSON) on standard output, and the files asked for.
struct ConformanceOutputs: Sendable {
    var json: Bool
    var jsonOut: String?
    var junitOut: String?
    var htmlOut: String?
    /// The earlier run the HTML page compares with (a report given as `--baseline`).
    var previous: RecordedConformanceReport?

    /// Prints the report and writes the files asked for; a file that cannot be written is an error in
    /// words (`EX_IOERR`), never a report silently missing.
    func write(_ report: ConformanceReport) throws {
        // The table quotes what the implementation under test said (error reasons, answers): escaped line
        // by line, as every peer's text on a terminal is.
        print(json ? report.json() : report.table.split(separator: "\n", omittingEmptySubsequences: false)
            .map { TerminalText.escaped(String($0)) }.joined(separator: "\n"))
        // Rendered only when asked for.
        let files: [(String?, () -> String)] = [
            (jsonOut, { report.json() }), (junitOut, { report.junitXML() }), (htmlOut, { HTMLReport(report, previous: previous).html }),
        ]
        for (path, render) in files {
            guard let path else { continue }
            let text = render()
            do {
                try Data(text.utf8).write(to: URL(fileURLWithPath: path))
            } catch {
                throw CommandFailure(exitCode: .ioError, message: "cannot write the report to \(path): \(SystemErrorText.describe(error))")
            }
        }
    }
}
