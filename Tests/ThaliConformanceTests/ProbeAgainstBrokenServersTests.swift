import Foundation
import NIOCore
import NIOPosix
import Testing
import ThaliBeacons
import ThaliSSDP
import ThaliNodeTestSupport

@testable import ThaliConformance

/// The probe against real broken servers: each one fails exactly the check it breaks, with the reason.
@Suite("Probe against broken servers", .serialized,
       .enabled(if: TestEnvironment.available(FileManager.default.isExecutableFile(atPath: "/usr/bin/python3"))))
struct ProbeAgainstBrokenServersTests {
    let group = MultiThreadedEventLoopGroup.singleton

    /// Fast timeouts, no burst (the burst has its own test).
    static var probe: ProbeConfiguration {
        var configuration = ProbeConfiguration()
        configuration.connectTimeout = .milliseconds(500)
        configuration.responseTimeout = .milliseconds(800)
        configuration.burstEnabled = false
        return configuration
    }

    /// ``probe`` with the burst on: `requests`, `concurrency` at a time, then `maxOutage` for recovery.
    static func burst(_ requests: Int, concurrency: Int, maxOutage: Duration) -> ProbeConfiguration {
        var configuration = probe
        configuration.burstEnabled = true
        configuration.burstRequests = requests
        configuration.burstConcurrency = concurrency
        configuration.maxOutage = maxOutage
        return configuration
    }

    static func stream(_ profile: BeaconProfile = .spec, clock: BeaconClock = .system) throws -> [UInt8] {
        try BeaconGenerator(identity: PrivateKey(), profile: profile, clock: clock)
            .makeAnnouncement(for: [PrivateKey().publicKey], validity: .seconds(600)).stream
    }

    func probe(_ location: BeaconLocation, _ configuration: ProbeConfiguration = probe) async -> ProbeReport {
        await ConformanceProbe(location: location, configuration: configuration, group: group).run()
    }

    @Test("a correct body from a different server passes the body checks; HTTP/1.0 close and 501 are fine")
    func correctPythonServer() async throws {
        try await withBrokenServer("ok", body: Self.stream(.cordova)) { location in
            let report = await probe(location)
            #expect(report.failed == 0, "\(report.text)")
            #expect(report.check("body-format")?.reason.contains("profile cordova only") == true)
            #expect(report.check("keep-alive")?.reason.contains("HTTP/1.0") == true, "\(report.text)")
            #expect(report.check("method")?.reason.contains("501") == true, "\(report.text)")
            #expect(report.check("burst")?.verdict == .notApplicable)
            #expect(report.check("busy-answer")?.verdict == .notApplicable)
        }
    }

    @Test("wrong and missing Content-Type fail content-type and the client fetch",
          arguments: [("wrong-content-type", "is \"text/plain\""), ("no-content-type", "Content-Type missing")])
    func contentType(mode: String, reason: String) async throws {
        try await withBrokenServer(mode, body: Self.stream()) { location in
            let report = await probe(location)
            let check = try #require(report.check("content-type"))
            #expect(check.verdict == .fail)
            #expect(check.reason.contains(reason), "\(check.reason)")
            #expect(report.check("client-fetch")?.verdict == .fail)
            #expect(report.check("cache-control")?.verdict == .pass)
            #expect(report.check("body-format")?.verdict == .pass)
            #expect(report.failed == 2, "\(report.text)")
        }
    }

    @Test("a missing Cache-Control fails cache-control only")
    func missingCacheControl() async throws {
        try await withBrokenServer("no-cache-control", body: Self.stream()) { location in
            let report = await probe(location)
            #expect(report.check("cache-control")?.verdict == .fail)
            #expect(report.check("cache-control")?.reason == "Cache-Control missing, expected no-cache")
            #expect(report.failed == 1, "\(report.text)")
        }
    }

    @Test("a body cut short by the connection fails body-format")
    func truncatedBody() async throws {
        let stream = try Self.stream()
        try await withBrokenServer("truncated", body: stream) { location in
            let report = await probe(location)
            let check = try #require(report.check("body-format"))
            #expect(check.verdict == .fail)
            #expect(check.reason.contains("mid-body after \(stream.count / 2) bytes of Content-Length \(stream.count)"),
                    "\(check.reason)")
            #expect(report.check("expiration")?.verdict == .notApplicable)
        }
    }

    @Test("malformed bodies fail body-format with each profile's reason")
    func malformedBodies() async throws {
        let stream = try Self.stream()
        var badKey = stream
        badKey[0] = 0x31
        for (body, reason) in [(Array(stream.dropLast(5)), "spec: length \(stream.count - 5) is not 96 + 48·N"),
                               (badKey, "spec: ephemeral key rejected")] {
            try await withBrokenServer("ok", body: body) { location in
                let report = await probe(location)
                let check = try #require(report.check("body-format"))
                #expect(check.verdict == .fail)
                #expect(check.reason.contains("fits neither profile"), "\(check.reason)")
                #expect(check.reason.contains(reason), "\(check.reason)")
                #expect(check.reason.contains("cordova: length"), "\(check.reason)")
            }
        }
    }

    @Test("an expired announcement fails expiration")
    func expired() async throws {
        let hourAgo = BeaconClock.system.now() - 3_600_000
        try await withBrokenServer("ok", body: Self.stream(clock: .fixed(hourAgo))) { location in
            let report = await probe(location)
            #expect(report.check("body-format")?.verdict == .pass)
            let check = try #require(report.check("expiration"))
            #expect(check.verdict == .fail)
            #expect(check.reason.hasPrefix("expired ") && check.reason.hasSuffix(" ago"), "\(check.reason)")
        }
    }

    @Test("more beacons than our bound warn in beacon-count: the bound is our own limit (PROFILE), not a wire rule")
    func tooManyBeacons() async throws {
        var configuration = Self.probe
        configuration.maxBeacons = 2
        let stream = try BeaconGenerator(identity: PrivateKey()).makeAnnouncement(
            for: (0..<3).map { _ in PrivateKey().publicKey }, validity: .seconds(60)).stream
        try await withBrokenServer("ok", body: stream) { location in
            let report = await probe(location, configuration)
            #expect(report.check("beacon-count")?.verdict == .warn)
            #expect(report.check("beacon-count")?.reason.contains("3 beacons, more than 2") == true)
            #expect(report.failed == 0, "\(report.text)")
        }
    }

    @Test("an endless body is cut at the bound plus one byte")
    func endlessBody() async throws {
        try await withBrokenServer("endless") { location in
            let started = ContinuousClock.now
            let report = await probe(location)
            let check = try #require(report.check("size-bound"))
            #expect(check.verdict == .fail)
            #expect(check.reason == "body exceeds 65536 bytes; stopped reading at 65537", "\(check.reason)")
            #expect(report.check("body-format")?.verdict == .notApplicable)
            #expect(report.check("client-fetch")?.reason.contains("responseTooLarge") == true, "\(report.text)")
            // Cut, not timed out: the whole probe ends long before the endless body would.
            #expect(ContinuousClock.now - started < .seconds(30))
        }
    }

    @Test("a declared length over the bound is refused without reading it")
    func declaredHuge() async throws {
        try await withBrokenServer("declared-huge") { location in
            let report = await probe(location)
            #expect(report.check("size-bound")?.verdict == .fail)
            #expect(report.check("size-bound")?.reason.contains("declares Content-Length 100000000") == true)
        }
    }

    @Test("an HTTP/1.1 server keeping connections open answers two requests on one")
    func persistentConnections() async throws {
        try await withBrokenServer("http11", body: Self.stream()) { location in
            let report = await probe(location)
            #expect(report.failed == 0, "\(report.text)")
            #expect(report.check("keep-alive")?.reason == "answered two requests on one persistent connection")
        }
    }

    @Test("a persistent connection whose second request hangs fails keep-alive")
    func secondRequestHangs() async throws {
        try await withBrokenServer("hangs-second", body: Self.stream()) { location in
            let report = await probe(location)
            let check = try #require(report.check("keep-alive"))
            #expect(check.verdict == .fail)
            #expect(check.reason == "second request on a persistent connection: no answer in time")
            #expect(report.failed == 1, "\(report.text)")
        }
    }

    @Test("a server answering every path and method: unknown-path warns, method fails")
    func laxServer() async throws {
        try await withBrokenServer("lax", body: Self.stream()) { location in
            let report = await probe(location)
            #expect(report.check("unknown-path")?.verdict == .warn)
            #expect(report.check("unknown-path")?.reason.hasPrefix("status 200 for /NotificationBeacons-probe-") == true)
            #expect(report.check("method")?.verdict == .fail)
            #expect(report.check("method")?.reason == "POST accepted with 200; only GET is defined")
            #expect(report.failed == 1, "\(report.text)")
        }
    }

    @Test("429 counts as throttling; a server that keeps refusing warns in recovery")
    func throttlesWith429() async throws {
        let configuration = Self.burst(20, concurrency: 1, maxOutage: .seconds(1))
        try await withBrokenServer("throttles-429", body: Self.stream()) { location in
            let report = await probe(location, configuration)
            // Three GETs of /NotificationBeacons came before the burst (first answer, client fetch,
            // keep-alive), all answered; the fourth, the burst's first, is refused.
            let burst = try #require(report.check("burst"))
            #expect(burst.verdict == .pass)
            #expect(burst.reason.hasPrefix("throttled after 0 answered (first refusal: status 429); 20 sent"), "\(burst.reason)")
            let recovery = try #require(report.check("recovery"))
            #expect(recovery.verdict == .warn)
            #expect(recovery.reason.contains("last: status 429"), "\(recovery.reason)")
        }
    }

    @Test("each 503 of the burst is judged for its form (a SHOULD): a well-formed one passes with the Retry-After it names, a malformed one warns naming what it breaks; the burst counts each as throttling",
          arguments: [("busy-ok", ProbeVerdict.pass, "4 answered 503, Retry-After (s): 2, no body"),
                      ("busy-http-date", .warn, "Retry-After \"Fri, 27 Nov 2026 03:00:00 GMT\" is not whole seconds"),
                      ("busy-fraction", .warn, "Retry-After \"1.5\" is not whole seconds"),
                      ("busy-zero", .warn, "Retry-After 0 s is outside 1 ... 60 s"),
                      ("busy-too-long", .warn, "Retry-After 3600 s is outside 1 ... 60 s"),
                      ("busy-no-retry-after", .warn, "no Retry-After"),
                      ("busy-with-body", .warn, "a body of ")])
    func busyAnswerForm(mode: String, verdict: ProbeVerdict, reason: String) async throws {
        try await withBrokenServer(mode, body: Self.stream()) { location in
            let report = await probe(location, Self.burst(4, concurrency: 1, maxOutage: .zero))
            #expect(report.check("burst")?.verdict == .pass, "\(report.text)")
            let busy = try #require(report.check("busy-answer"))
            #expect(busy.verdict == verdict)
            #expect(busy.reason.hasPrefix(verdict == .pass ? reason : "4 of 4 503 answers malformed; the first: \(reason)"), "\(busy.reason)")
            #expect(report.failed == 0, "\(report.text)")
        }
    }

    @Test("a server that dies under the burst: recovery warns that it stopped answering")
    func crashesUnderLoad() async throws {
        let configuration = Self.burst(10, concurrency: 2, maxOutage: .seconds(1))
        try await withBrokenServer("crashes", body: Self.stream()) { location in
            let report = await probe(location, configuration)
            // A dead server refuses like a throttling one; recovery is what tells them apart.
            #expect(report.check("burst")?.verdict == .pass, "\(report.text)")
            let recovery = try #require(report.check("recovery"))
            #expect(recovery.verdict == .warn)
            #expect(recovery.reason.hasPrefix("not answering 1.0 s after the burst (last: no connection"), "\(recovery.reason)")
            #expect(report.failed == 0, "\(report.text)")
        }
    }

    @Test("a head that never ends is cut at the head bound")
    func endlessHead() async throws {
        try await withBrokenServer("endless-head") { location in
            let report = await probe(location)
            let check = try #require(report.check("reachable"))
            #expect(check.verdict == .fail)
            #expect(check.reason.hasPrefix("the response head exceeds 8192 bytes; connection cut after "), "\(report.text)")
            // Cut at the head bound plus at most one read (64 KiB), not at the connection's total bound.
            let received = try #require(Int(check.reason.split(separator: " ").dropLast().last ?? ""))
            #expect(received > 8192)
            #expect(received <= 8192 + 65536)
        }
    }

    @Test("a server that never answers fails reachability within the response timeout")
    func silentServer() async throws {
        try await withBrokenServer("silent") { location in
            let started = ContinuousClock.now
            let report = await probe(location)
            let check = try #require(report.check("reachable"))
            #expect(check.verdict == .fail)
            #expect(check.reason == "connected, but no complete response within 800 ms")
            #expect(report.failed == 1)
            #expect(ContinuousClock.now - started < .seconds(10))
        }
    }

    @Test("a server that never throttles warns in the burst: throttling is our policy (PROFILE), not a wire rule")
    func neverThrottles() async throws {
        let configuration = Self.burst(30, concurrency: 4, maxOutage: .seconds(2))
        try await withBrokenServer("ok", body: Self.stream()) { location in
            let report = await probe(location, configuration)
            let burst = try #require(report.check("burst"))
            #expect(burst.verdict == .warn)
            #expect(burst.reason.hasPrefix("never throttled; 30 sent, 4 at a time: 30 answered"), "\(burst.reason)")
            #expect(report.check("recovery")?.verdict == .pass)
            #expect(report.failed == 0, "\(report.text)")
        }
    }
}
