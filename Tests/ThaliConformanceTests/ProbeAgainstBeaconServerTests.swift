import NIOCore
import NIOPosix
import Testing
import ThaliBeacons
import ThaliSSDP

@testable import ThaliConformance

/// The probe against this suite's own `BeaconHTTPServer`: a conforming endpoint must pass every check,
/// throttling included (its limits are set low so that a short burst trips them).
@Suite("Probe against BeaconHTTPServer", .serialized)
struct ProbeAgainstBeaconServerTests {
    let group = MultiThreadedEventLoopGroup.singleton

    /// Per-source limit low enough for a 40-request burst, windows short enough to recover at once.
    static var lowLimits: BeaconHTTPServerLimits {
        var limits = BeaconHTTPServerLimits()
        limits.maxRequestsPerSource = 10
        limits.sourceWindow = .seconds(1)
        limits.overloadClosePeriod = .milliseconds(500)
        return limits
    }

    static var fastProbe: ProbeConfiguration {
        var configuration = ProbeConfiguration()
        // Generous for loopback: a busy CI machine must not turn refusals into timeouts.
        configuration.connectTimeout = .seconds(1)
        configuration.responseTimeout = .seconds(2)
        configuration.burstEnabled = true  // opt-in: it trips throttling
        configuration.burstRequests = 40
        configuration.burstConcurrency = 8
        configuration.burstTimeLimit = .seconds(10)
        configuration.maxOutage = .seconds(5)
        return configuration
    }

    func withServer(limits: BeaconHTTPServerLimits = lowLimits, beacons: [UInt8]?,
                    _ body: (BeaconHTTPServer, BeaconLocation) async throws -> Void) async throws {
        let server = BeaconHTTPServer(host: "127.0.0.1", limits: limits, group: group)
        server.setBeacons(beacons)
        let port = try await server.start()
        do {
            try await body(server, BeaconLocation(host: "127.0.0.1", port: port))
        } catch {
            await server.stop()
            throw error
        }
        await server.stop()
    }

    @Test("a real announcement of either profile passes every check, the burst is throttled",
          arguments: BeaconProfile.allCases)
    func conformingServerPasses(profile: BeaconProfile) async throws {
        let stream = try BeaconGenerator(identity: PrivateKey(), profile: profile)
            .makeAnnouncement(for: [PrivateKey().publicKey, PrivateKey().publicKey], validity: .seconds(600)).stream
        try await withServer(beacons: stream) { server, location in
            let report = await ConformanceProbe(location: location, configuration: Self.fastProbe, group: group).run()
            #expect(report.failed == 0, "\(report.text)")
            #expect(report.warnings == 0, "\(report.text)")
            for id in ["reachable", "status", "content-type", "cache-control", "size-bound", "body-format",
                       "expiration", "beacon-count", "client-fetch", "unknown-path", "method", "keep-alive",
                       "burst", "recovery"] {
                #expect(report.check(id)?.verdict == .pass, "\(id): \(report.text)")
            }
            #expect(report.check("empty-204")?.verdict == .notApplicable)
            #expect(report.check("body-format")?.reason.contains("profile \(profile) only") == true)
            #expect(report.check("body-format")?.reason.contains("2 beacon(s)") == true)
            #expect(report.check("method")?.reason.contains("405") == true)
            #expect(report.check("keep-alive")?.reason.contains("announced close") == true)
            #expect(report.notes == [ConformanceProbe.flagsNote])
            // The server really did refuse the probe: its own counter agrees with the verdict.
            #expect(server.counters.rejectedPerSource > 0)
            let burst = try #require(report.check("burst")?.reason)
            #expect(burst.contains("40 sent"))
            // A connection the server closed before the request went out is a refusal, not a timeout. Once
            // refused, the source's SYNs are dropped by the server's kernel for the rest of its window
            // (ListenerSourceFilter), so later requests time out instead; each request is one of the three.
            let numbers = burst.split(separator: " ").compactMap { Int($0) }  // before, sent, at a time, answered, refused, timed out
            #expect(numbers.count == 6 && numbers[4] >= 1 && numbers[3] + numbers[4] + numbers[5] == numbers[1], "\(burst)")
            // Ten connections per source and second: before the first refusal, at most the rest of one
            // window and (on a slow machine) one more window were answered.
            let answered = try #require(Int(burst.split(separator: " ")[2]))
            #expect(answered <= 20)
        }
    }

    @Test("nothing advertised: 204 passes, the body checks are not applicable")
    func emptyServer() async throws {
        try await withServer(beacons: nil) { _, location in
            let report = await ConformanceProbe(location: location, configuration: Self.fastProbe, group: group).run()
            #expect(report.failed == 0, "\(report.text)")
            #expect(report.check("status")?.reason.contains("204") == true)
            #expect(report.check("empty-204")?.verdict == .pass)
            for id in ["content-type", "cache-control", "size-bound", "body-format", "expiration", "beacon-count"] {
                #expect(report.check(id)?.verdict == .notApplicable, "\(id)")
            }
            #expect(report.check("client-fetch")?.reason.contains("fetched 0 bytes") == true)
            #expect(report.check("burst")?.verdict == .pass)
        }
    }

    @Test("a global overload closes the port: the burst sees refusals, recovery waits for the reopening")
    func overloadClosesThePort() async throws {
        var limits = Self.lowLimits
        limits.maxRequestsPerSource = 1000
        limits.maxRequestsGlobal = 15
        limits.globalWindow = .seconds(1)
        limits.overloadClosePeriod = .milliseconds(1500)
        let stream = try BeaconGenerator(identity: PrivateKey()).makeAnnouncement(
            for: [PrivateKey().publicKey], validity: .seconds(60)).stream
        try await withServer(limits: limits, beacons: stream) { server, location in
            let report = await ConformanceProbe(location: location, configuration: Self.fastProbe, group: group).run()
            #expect(report.failed == 0, "\(report.text)")
            #expect(server.counters.overloadShutdowns >= 1)
            #expect(report.check("burst")?.verdict == .pass)
            let recovery = try #require(report.check("recovery"))
            #expect(recovery.verdict == .pass, "\(report.text)")
            #expect(recovery.reason.contains("answering again"), "\(recovery.reason)")
        }
    }

    @Test("nearly out of its budget, the server answers 503 with a Retry-After of whole seconds within its bound: busy-answer passes")
    func busyAnswersPass() async throws {
        var limits = Self.lowLimits
        limits.maxRequestsPerSource = 1000
        limits.busyRequestsGlobal = 5
        limits.maxRequestsGlobal = 1000
        limits.globalWindow = .seconds(1)
        let stream = try BeaconGenerator(identity: PrivateKey()).makeAnnouncement(
            for: [PrivateKey().publicKey], validity: .seconds(60)).stream
        try await withServer(limits: limits, beacons: stream) { server, location in
            let report = await ConformanceProbe(location: location, configuration: Self.fastProbe, group: group).run()
            #expect(server.counters.answeredBusy >= 1)
            #expect(report.check("burst")?.verdict == .pass, "\(report.text)")
            let busy = try #require(report.check("busy-answer"))
            #expect(busy.verdict == .pass, "\(report.text)")
            // The server draws each Retry-After from 1 to its maxBusyRetryAfter (2 s).
            let values = busy.reason.split(separator: ": ").last?.split(separator: ",").compactMap { Int($0.trimmingCharacters(in: .whitespaces)) } ?? []
            #expect(!values.isEmpty && values.allSatisfy { (1...2).contains($0) }, "\(busy.reason)")
            #expect(report.failed == 0 && report.warnings == 0, "\(report.text)")
        }
    }

    @Test("a port that stays closed longer than the allowed outage is a warning")
    func outageLongerThanAllowed() async throws {
        var limits = Self.lowLimits
        limits.maxRequestsPerSource = 1000
        limits.maxRequestsGlobal = 20
        limits.globalWindow = .seconds(5)
        limits.overloadClosePeriod = .seconds(30)
        var configuration = Self.fastProbe
        configuration.maxOutage = .seconds(1)
        try await withServer(limits: limits, beacons: nil) { _, location in
            let report = await ConformanceProbe(location: location, configuration: configuration, group: group).run()
            let recovery = try #require(report.check("recovery"))
            #expect(recovery.verdict == .warn)
            #expect(recovery.reason.contains("not answering 1.0 s after the burst"), "\(recovery.reason)")
        }
    }

    @Test("nobody listening: reachability fails, everything else is not applicable")
    func unreachable() async throws {
        // Bind and close to get a port nobody listens on.
        let server = BeaconHTTPServer(host: "127.0.0.1", group: group)
        let port = try await server.start()
        await server.stop()
        let report = await ConformanceProbe(location: BeaconLocation(host: "127.0.0.1", port: port),
                                            configuration: Self.fastProbe, group: group).run()
        #expect(report.check("reachable")?.verdict == .fail)
        #expect(report.check("reachable")?.reason == "no TCP connection: Connection refused")
        #expect(report.failed == 1)
        #expect(report.checks.dropFirst().allSatisfy { $0.verdict == .notApplicable })
    }
}
