import NIOCore
import NIOHTTP1
import ThaliBeacons
import ThaliSSDP

/// Checks another implementation's `GET /NotificationBeacons` endpoint against the seed and this suite's
/// bounds: reachability, status and headers, the body under both beacon profiles, the size bound, HTTP
/// behaviour (unknown path, other methods, persistent connections) and throttling under a burst.
///
/// Every exchange is bounded by the configuration's timeouts and size bounds, and the probe talks only to
/// the one location it was given.
public struct ConformanceProbe: Sendable {
    /// The endpoint probed (the path is always `/NotificationBeacons`).
    public let location: BeaconLocation
    /// Bounds and options.
    public let configuration: ProbeConfiguration
    let group: EventLoopGroup
    let clock: BeaconClock

    /// Said once in every report: what a probe without keys cannot check.
    public static let flagsNote =
        "beacon flags and HMACs are not verified: that needs a receiver's private key (use `conformance beacons` with vectors)"

    /// A probe of `location` whose connections run on `group`; `clock` judges expirations.
    public init(location: BeaconLocation, configuration: ProbeConfiguration = .init(), group: EventLoopGroup,
                clock: BeaconClock = .system) {
        self.location = location
        self.configuration = configuration
        self.group = group
        self.clock = clock
    }

    /// Every check as a conformance case (`probe/<check id>`) with the requirements it grades.
    public static let cases: [ConformanceCase] = [
        ConformanceCase("probe/reachable", "the first GET /NotificationBeacons is answered", ["SSDP-6.2"]),
        ConformanceCase("probe/status", "200, or 204 when nothing is advertised", ["SSDP-6.1", "SSDP-6.2"]),
        ConformanceCase("probe/content-type", "200 with application/octet-stream", ["SSDP-6.2"]),
        ConformanceCase("probe/cache-control", "200 with Cache-Control: no-cache", ["SSDP-6.2"]),
        ConformanceCase("probe/empty-204", "204 without a body", ["SSDP-6.1"]),
        ConformanceCase("probe/size-bound", "the body within our client's bound", ["SSDP-6.7"]),
        ConformanceCase("probe/body-format", "the body is an announcement of one profile",
                        ["BCN-1.1", "BCN-2.1", "BCN-3.1", "BCN-4.1", "BCN-4.2"]),
        ConformanceCase("probe/expiration", "the expiration is ahead, at most 24 h", ["BCN-4.3", "BCN-4.4"]),
        ConformanceCase("probe/beacon-count", "at most our beacon bound", ["BCN-5.1"]),
        ConformanceCase("probe/client-fetch", "ThaliSSDP's client accepts the answer", ["SSDP-6.6"]),
        ConformanceCase("probe/unknown-path", "404 for another path", ["SSDP-6.4"]),
        ConformanceCase("probe/method", "POST is refused, 405", ["SSDP-6.3"]),
        ConformanceCase("probe/keep-alive", "one request per connection, then close", ["SSDP-6.5"]),
        ConformanceCase("probe/burst", "a burst is throttled (opt-in)", ["SSDP-7.1"]),
        ConformanceCase("probe/busy-answer", "each 503 of the burst names a Retry-After of whole seconds, 1 to the client's bound, and serves no body (opt-in)",
                        ["SSDP-6.9"]),
        ConformanceCase("probe/recovery", "answering again after the burst (opt-in)", ["SSDP-7.1"]),
    ]

    /// Check ids that depend on a first answer, in report order.
    static let answerDependentChecks = ["status", "content-type", "cache-control", "empty-204", "size-bound",
                                        "body-format", "expiration", "beacon-count", "client-fetch"]
    /// Check ids of the HTTP behaviour and load phases, in report order.
    static let laterChecks = ["unknown-path", "method", "keep-alive", "burst", "busy-answer", "recovery"]

    /// Runs every check and returns the report (the probe itself never throws: failures are verdicts).
    /// A configuration whose `problem` is not nil gives a single failed `configuration` check and no traffic.
    public func run() async -> ProbeReport {
        await run(progress: { _ in }, notice: { _ in })
    }

    /// Runs every check like ``run()``, handing each check to `progress` as soon as it ends and saying
    /// through `notice` what is about to happen before a check that may trip the target's throttling.
    public func run(progress: @escaping @Sendable (ProbeCheck) -> Void,
                    notice: @escaping @Sendable (String) -> Void) async -> ProbeReport {
        var reported = 0
        func flush(_ report: ProbeReport) {
            for check in report.checks.dropFirst(reported) { progress(check) }
            reported = report.checks.count
        }
        var report = ProbeReport(target: location.description)
        defer { flush(report) }
        if let problem = configuration.problem {
            report.record("configuration", .fail, problem)  // no traffic with bounds that do not hold
            return report
        }
        report.note(Self.flagsNote)
        let start = NIODeadline.now()
        let first = await oneShot(.GET, BeaconLocation.notificationBeaconsPath)
        let elapsed = NIODeadline.now() - start
        guard let response = reachability(first, elapsed: elapsed, into: &report) else {
            for id in Self.answerDependentChecks + Self.laterChecks {
                report.record(id, .notApplicable, "no answer to the first request")
            }
            return report
        }
        checkAnswer(response, into: &report)
        flush(report)
        await checkClientFetch(into: &report)
        flush(report)
        await checkUnknownPath(into: &report)
        flush(report)
        await checkMethod(into: &report)
        flush(report)
        await checkKeepAlive(into: &report)
        flush(report)
        if configuration.burstEnabled {
            notice("burst: \(configuration.burstRequests) requests, \(configuration.burstConcurrency) at a time, to "
                   + "\(location.host); the target may refuse this address for a while (its throttling)")
            await checkBurst(into: &report)
            flush(report)
            await checkRecovery(into: &report)
        } else {
            for id in ["burst", "busy-answer", "recovery"] {
                report.record(id, .notApplicable, "not run (it trips throttling; ask for it with --burst)")
            }
        }
        return report
    }

    // MARK: First answer

    /// Records `reachable`; returns the response when there is one to judge further.
    func reachability(_ outcome: ProbeOutcome, elapsed: TimeAmount, into report: inout ProbeReport) -> ProbeResponse? {
        switch outcome {
        case .response(let response):
            report.record("reachable", .pass, "answered in \(Self.text(elapsed))")
            return response
        case .connectFailed(let detail):
            report.record("reachable", .fail, "no TCP connection: \(detail)")
        case .connectTimedOut:
            report.record("reachable", .fail, "no TCP connection within \(Self.text(configuration.connectTimeout))")
        case .timedOut:
            report.record("reachable", .fail, "connected, but no complete response within \(Self.text(configuration.responseTimeout))")
        case .closedWithoutResponse:
            report.record("reachable", .fail, "the server closed the connection without a response")
        case .tooLarge(let received):
            report.record("reachable", .fail,
                          "the response head exceeds \(configuration.maxHeadBytes) bytes; connection cut after \(received) bytes")
        case .malformed(let detail):
            report.record("reachable", .fail, "the answer is not an HTTP/1.x response: \(detail)")
        }
        return nil
    }

    func checkAnswer(_ response: ProbeResponse, into report: inout ProbeReport) {
        let status = response.head.status
        let headers = response.head.headers
        switch status {
        case .ok:
            report.record("status", .pass, "200 OK")
        case .noContent:
            report.record("status", .pass, "204 No Content (nothing advertised)")
            report.record("content-type", .notApplicable, "204 carries no body")
            report.record("cache-control", .notApplicable, "204 carries no body")
            let declared = headers.first(name: "Content-Length")
            if let declared, declared != "0" {
                report.record("empty-204", .fail, "204 declares Content-Length \(declared.prefix(20))")
            } else {
                report.record("empty-204", .pass, "no body")
            }
            for id in ["size-bound", "body-format", "expiration", "beacon-count"] {
                report.record(id, .notApplicable, "204: nothing advertised")
            }
            return
        default:
            report.record("status", .fail, "status \(status.code), expected 200 or 204")
            for id in ["content-type", "cache-control", "empty-204", "size-bound", "body-format", "expiration", "beacon-count"] {
                report.record(id, .notApplicable, "status \(status.code)")
            }
            return
        }

        let contentType = headers.first(name: "Content-Type")
        if let contentType {
            let mediaType = contentType.split(separator: ";").first.map { $0.trimmingSpaces.lowercased() }
            if mediaType == "application/octet-stream" {
                report.record("content-type", .pass, "application/octet-stream")
            } else {
                report.record("content-type", .fail, "Content-Type is \(Self.quoted(contentType)), expected application/octet-stream")
            }
        } else {
            report.record("content-type", .fail, "Content-Type missing, expected application/octet-stream")
        }

        let cacheControl = headers[canonicalForm: "Cache-Control"]
        if cacheControl.isEmpty {
            report.record("cache-control", .fail, "Cache-Control missing, expected no-cache")
        } else if cacheControl.contains(where: { $0.trimmingSpaces.lowercased() == "no-cache" }) {
            report.record("cache-control", .pass, "no-cache")
        } else {
            report.record("cache-control", .fail,
                          "Cache-Control is \(Self.quoted(cacheControl.joined(separator: ", "))), expected no-cache")
        }
        report.record("empty-204", .notApplicable, "status 200")

        guard !response.exceededBodyLimit else {
            let declared = headers.first(name: "Content-Length").flatMap { Int($0) }
            if let declared, declared > configuration.maxBodyBytes {
                report.record("size-bound", .fail,
                              "declares Content-Length \(declared), more than the bound of \(configuration.maxBodyBytes) bytes; not read")
            } else {
                report.record("size-bound", .fail,
                              "body exceeds \(configuration.maxBodyBytes) bytes; stopped reading at \(response.body.count)")
            }
            for id in ["body-format", "expiration", "beacon-count"] {
                report.record(id, .notApplicable, "body over the size bound")
            }
            return
        }
        report.record("size-bound", .pass, "\(response.body.count) bytes ≤ \(configuration.maxBodyBytes)")
        checkBody(response, into: &report)
    }

    func checkBody(_ response: ProbeResponse, into report: inout ProbeReport) {
        guard response.complete else {
            let declared = response.head.headers.first(name: "Content-Length").map { " of Content-Length \($0.prefix(20))" } ?? ""
            report.record("body-format", .fail, "the connection ended mid-body after \(response.body.count) bytes\(declared)")
            report.record("expiration", .notApplicable, "truncated body")
            report.record("beacon-count", .notApplicable, "truncated body")
            return
        }
        let analysis = BeaconBodyAnalysis(body: response.body)
        guard let fit = analysis.fitting.first else {
            let reasons = analysis.findings.map { "\($0.profile): \($0.formatProblem ?? "?")" }
            report.record("body-format", .fail, "fits neither profile (\(reasons.joined(separator: "; ")))")
            report.record("expiration", .notApplicable, "body fits no profile")
            report.record("beacon-count", .notApplicable, "body fits no profile")
            return
        }
        let others = analysis.findings.filter { $0.profile != fit.profile }
            .map { "not \($0.profile): \($0.formatProblem ?? "fits too")" }
        let keyText = fit.profile == .spec ? "88-byte SPKI key" : "65-byte raw key"
        report.record("body-format", .pass,
                      "profile \(fit.profile) only: \(keyText) on secp256k1, \(fit.beaconCount ?? 0) beacon(s); \(others.joined(separator: "; "))")

        let now = clock.now()
        if let expiration = fit.expiration {
            if let problem = BeaconBodyAnalysis.expirationProblem(
                expiration, now: now, tolerance: configuration.clockSkewToleranceMilliseconds)
            {
                report.record("expiration", .fail, problem)
            } else {
                let ahead = expiration >= now ? BeaconBodyAnalysis.duration(expiration - now) : "0s"
                report.record("expiration", .pass, "expires in \(ahead) (≤ 24 h)")
            }
        }
        if let count = fit.beaconCount {
            if count <= configuration.maxBeacons {
                report.record("beacon-count", .pass, "\(count) ≤ \(configuration.maxBeacons)")
            } else {
                // The bound is this suite's own limit (PROFILE, BCN-5.1), not a wire rule.
                report.record("beacon-count", .warn,
                              "\(count) beacons, more than \(configuration.maxBeacons): this suite's receivers reject it as malformed")
            }
        }
    }

    /// Whether ThaliSSDP's own client, with the probe's bounds and no retries, accepts the endpoint.
    func checkClientFetch(into report: inout ProbeReport) async {
        var client = BeaconHTTPClientConfiguration()
        client.connectTimeout = configuration.connectTimeout
        client.responseTimeout = configuration.responseTimeout
        client.maxBodyBytes = configuration.maxBodyBytes
        client.maxHeadBytes = configuration.maxHeadBytes
        client.maxAttempts = 1
        do {
            let bytes = try await BeaconHTTPClient(configuration: client, group: group).fetch(location)
            report.record("client-fetch", .pass, "ThaliSSDP's client fetched \(bytes.count) bytes")
        } catch {
            report.record("client-fetch", .fail, "ThaliSSDP's client refused it: \(error.reason)")
        }
    }

    // MARK: HTTP behaviour

    func checkUnknownPath(into report: inout ProbeReport) async {
        let path = BeaconLocation.notificationBeaconsPath + "-probe-\(UInt32.random(in: .min ... .max))"
        switch await oneShot(.GET, path) {
        case .response(let response) where response.head.status == .notFound:
            report.record("unknown-path", .pass, "404 for \(path)")
        case .response(let response):
            report.record("unknown-path", .warn, "status \(response.head.status.code) for \(path), expected 404")
        case let other:
            report.record("unknown-path", .warn, "no answer for \(path): \(Self.text(other))")
        }
    }

    func checkMethod(into report: inout ProbeReport) async {
        switch await oneShot(.POST, BeaconLocation.notificationBeaconsPath) {
        case .response(let response):
            let code = response.head.status.code
            switch code {
            case 405: report.record("method", .pass, "POST rejected with 405 Method Not Allowed")
            case 400..<500, 501: report.record("method", .pass, "POST rejected with \(code) (405 is the usual answer)")
            case 200..<300: report.record("method", .fail, "POST accepted with \(code); only GET is defined")
            default: report.record("method", .warn, "POST answered with \(code), expected 405")
            }
        case let other:
            report.record("method", .warn, "POST got no answer: \(Self.text(other))")
        }
    }

    /// HTTP/1.1 keeps connections open unless a side says `Connection: close` (HTTP/1.0: unless it says
    /// keep-alive). Either is fine; answering neither way, or hanging on the second request, is not.
    func checkKeepAlive(into report: inout ProbeReport) async {
        let connection: ProbeConnection
        switch await ProbeConnection.open(host: location.host, port: location.port,
                                          configuration: configuration, group: group) {
        case .failure(let error):
            report.record("keep-alive", .warn, "could not connect: \(Self.text(error.outcome))")
            return
        case .success(let opened):
            connection = opened
        }
        let (verdict, reason) = await keepAliveVerdict(on: connection)
        await connection.close()
        report.record("keep-alive", verdict, reason)
    }

    func keepAliveVerdict(on connection: ProbeConnection) async -> (ProbeVerdict, String) {
        let first = await connection.exchange(.GET, BeaconLocation.notificationBeaconsPath, keepAlive: true)
        guard case .response(let response) = first, response.complete else {
            return (.fail, "a request with Connection: keep-alive got no complete answer: \(Self.text(first))")
        }
        if !response.head.isKeepAlive {
            if await connection.waitForClose(within: TimeAmount(configuration.responseTimeout)) {
                return (.pass, "answered, announced close (\(response.head.version)) and closed")
            } else {
                return (.warn, "announced close but left the connection open")
            }
        }
        switch await connection.exchange(.GET, BeaconLocation.notificationBeaconsPath, keepAlive: false) {
        case .response(let second) where second.complete:
            return (.pass, "answered two requests on one persistent connection")
        case .closedWithoutResponse:
            return (.warn, "closed a persistent connection without announcing Connection: close")
        case let other:
            return (.fail, "second request on a persistent connection: \(Self.text(other))")
        }
    }

    // MARK: Helpers

    func oneShot(_ method: HTTPMethod, _ path: String) async -> ProbeOutcome {
        await ProbeConnection.oneShot(method, path, host: location.host, port: location.port,
                                      configuration: configuration, group: group)
    }

    static func text(_ amount: TimeAmount) -> String {
        let milliseconds = amount.nanoseconds / 1_000_000
        return milliseconds < 1000 ? "\(milliseconds) ms" : "\(Double(milliseconds) / 1000) s"
    }

    static func text(_ amount: Duration) -> String { text(TimeAmount(amount)) }

    static func text(_ outcome: ProbeOutcome) -> String {
        switch outcome {
        case .response(let response):
            "status \(response.head.status.code)\(response.complete ? "" : ", incomplete")"
        case .connectFailed(let detail): "no connection (\(detail))"
        case .connectTimedOut: "connect timed out"
        case .timedOut: "no answer in time"
        case .closedWithoutResponse: "closed without answer"
        case .tooLarge(let received): "response head too large (cut after \(received) bytes)"
        case .malformed(let detail): "malformed (\(detail))"
        }
    }

    /// A header value for a one-line reason: quoted, cut at 64 characters.
    static func quoted(_ value: String) -> String { "\"\(value.prefix(64))\"" }
}

extension StringProtocol {
    /// The text without leading or trailing spaces and tabs (HTTP optional whitespace).
    var trimmingSpaces: String {
        String(drop(while: { $0 == " " || $0 == "\t" }).reversed().drop(while: { $0 == " " || $0 == "\t" }).reversed())
    }
}
