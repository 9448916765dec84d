import ArgumentParser
import Foundation
import NIOCore
import NIOPosix
import ThaliConformance
import ThaliSSDP

/// `thali-node conformance probe http://HOST:PORT`: checks another implementation's
/// `/NotificationBeacons` endpoint and prints a verdict per check.
struct ConformanceProbeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "probe",
        abstract: "Check another implementation's /NotificationBeacons endpoint.",
        discussion: """
            Checks reachability, status (200 or 204), Content-Type and Cache-Control, the body against \
            both beacon profiles (length, ephemeral key, expiration, beacon count), the size bound, an \
            unknown path (404), a POST (rejected), persistent connections, and throttling under a burst \
            of requests followed by recovery (only with --burst: it trips the target's throttling, which \
            may refuse this address for a minute; it is announced before it starts). Prints one line per \
            check, "PASS|FAIL|WARN|N/A id: reason", as each check ends, then notes and a last line \
            "N passed, M failed"; --json prints one JSON object instead. Our own limits (throttling, the \
            beacon count) give WARN, not FAIL. Exits non-zero when any check failed. HOST must be an IPv4 \
            address; the burst goes to it only.
            """)

    @Argument(help: "The endpoint, http://IPv4:PORT (any path is replaced by /NotificationBeacons).")
    var url: String

    @Option(help: "Connect timeout, in milliseconds.")
    var connectTimeoutMs: Int64 = 1000

    @Option(help: "Response timeout (request sent to response end), in milliseconds.")
    var responseTimeoutMs: Int64 = 2000

    @Option(help: "Largest body accepted, in bytes (the probe reads at most this plus one).")
    var maxBodyBytes: Int = ProbeConfiguration().maxBodyBytes

    @Option(help: "Most beacons a body may carry.")
    var maxBeacons: Int = ProbeConfiguration().maxBeacons

    @Option(help: "Clock skew forgiven when judging the expiration, in milliseconds.")
    var clockSkewMs: UInt64 = 0

    @Option(help: "Requests in the burst (1 ... \(ProbeConfiguration.maximumBurstRequests)).")
    var burstRequests: Int = 200

    @Option(help: "Burst requests in flight at once (1 ... \(ProbeConfiguration.maximumBurstConcurrency)).")
    var burstConcurrency: Int = 16

    @Option(help: "Longest the burst may run, in seconds.")
    var burstTimeLimitS: Int64 = 20

    @Option(help: "After the burst, longest the server may stay silent before a warning, in seconds.")
    var maxOutageS: Int64 = 60

    @Option(help: "Longest Retry-After a 503 of the burst may name, in seconds (the client's bound).")
    var maxBusyRetryAfterS: Int64 = 60

    @Flag(help: "Run the burst and recovery checks (they trip the target's throttling).")
    var burst = false

    @Flag(help: "Skip the burst and recovery checks (the default; kept for old scripts).")
    var noBurst = false

    @Flag(help: "Print the report as one JSON object.")
    var json = false

    func validate() throws {
        guard BeaconLocation(parsing: url) != nil else {
            throw ValidationError("\(url) is not http://IPv4:PORT")
        }
        if let problem = probeConfiguration.problem { throw ValidationError(problem) }
    }

    var probeConfiguration: ProbeConfiguration {
        var configuration = ProbeConfiguration()
        configuration.connectTimeout = .milliseconds(connectTimeoutMs)
        configuration.responseTimeout = .milliseconds(responseTimeoutMs)
        configuration.maxBodyBytes = maxBodyBytes
        configuration.maxBeacons = maxBeacons
        configuration.clockSkewToleranceMilliseconds = clockSkewMs
        configuration.burstEnabled = burst && !noBurst
        configuration.burstRequests = burstRequests
        configuration.burstConcurrency = burstConcurrency
        configuration.burstTimeLimit = .seconds(burstTimeLimitS)
        configuration.maxOutage = .seconds(maxOutageS)
        configuration.maxBusyRetryAfter = .seconds(maxBusyRetryAfterS)
        return configuration
    }

    func run() async throws {
        guard let location = BeaconLocation(parsing: url) else { throw ValidationError("bad URL") }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let json = self.json
        if !json { printNow("probe \(location)") }
        let report = await ConformanceProbe(location: location, configuration: probeConfiguration, group: group).run(
            // Reasons quote the server's header values: escaped, so they cannot drive the terminal.
            progress: { check in
                if !json { printNow(TerminalText.escaped("\(check.verdict.rawValue.padding(toLength: 4, withPad: " ", startingAt: 0)) \(check.id): \(check.reason)")) }
            },
            notice: { text in if !json { printNow(TerminalText.escaped("NOTE \(text)")) } })
        try? await group.shutdownGracefully()
        if json {
            print(report.json())
        } else {
            for note in report.notes { print(TerminalText.escaped("NOTE \(note)")) }
            print("\(report.passed) passed, \(report.failed) failed")
        }
        if report.failed > 0 { throw ExitCode.failure }
    }
}
