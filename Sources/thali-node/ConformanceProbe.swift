import ArgumentParser
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
            of requests followed by recovery. Prints one line per check, "PASS|FAIL|WARN|N/A id: reason", \
            then notes and a last line "N passed, M failed"; --json prints one JSON object instead. Exits \
            non-zero when any check failed. HOST must be an IPv4 address; the burst goes to it only.
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

    @Flag(help: "Skip the burst and recovery checks.")
    var noBurst = false

    @Flag(help: "Report a server that never throttles the burst as a warning, not a failure.")
    var neverThrottlingIsWarning = false

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
        configuration.burstEnabled = !noBurst
        configuration.burstRequests = burstRequests
        configuration.burstConcurrency = burstConcurrency
        configuration.burstTimeLimit = .seconds(burstTimeLimitS)
        configuration.maxOutage = .seconds(maxOutageS)
        configuration.neverThrottlingIsWarning = neverThrottlingIsWarning
        return configuration
    }

    func run() async throws {
        guard let location = BeaconLocation(parsing: url) else { throw ValidationError("bad URL") }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let report = await ConformanceProbe(location: location, configuration: probeConfiguration, group: group).run()
        try? await group.shutdownGracefully()
        print(json ? report.json() : report.text)
        if report.failed > 0 { throw ExitCode.failure }
    }
}
