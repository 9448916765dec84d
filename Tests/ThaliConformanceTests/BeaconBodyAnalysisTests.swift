import Foundation
import NIOCore
import NIOPosix
import Testing
import ThaliBeacons
import ThaliSSDP

@testable import ThaliConformance

/// The body judgement is a value computed from bytes: real announcements of both profiles, and the
/// ways a body can be wrong.
@Suite("Beacon body analysis")
struct BeaconBodyAnalysisTests {
    static let now: UInt64 = 1_800_000_000_000

    static func announcement(_ profile: BeaconProfile, receivers: Int = 3, now: UInt64 = now,
                             validity: Duration = .seconds(3600)) throws -> [UInt8] {
        let generator = BeaconGenerator(identity: PrivateKey(), profile: profile, clock: .fixed(now))
        return try generator.makeAnnouncement(for: (0..<receivers).map { _ in PrivateKey().publicKey },
                                              validity: validity).stream
    }

    @Test("a real announcement fits its own profile only", arguments: BeaconProfile.allCases)
    func realAnnouncementFitsOneProfile(profile: BeaconProfile) throws {
        let analysis = BeaconBodyAnalysis(body: try Self.announcement(profile, receivers: 3))
        #expect(analysis.fitting.map(\.profile) == [profile])
        let fit = try #require(analysis.fitting.first)
        #expect(fit.beaconCount == 3)
        let expiration = try #require(fit.expiration)
        #expect((Self.now + 3_600_000...Self.now + 3_600_255).contains(expiration))
        #expect(BeaconBodyAnalysis.expirationProblem(expiration, now: Self.now) == nil)
        let other = try #require(analysis.findings.first { $0.profile != profile })
        #expect(other.formatProblem?.contains("is not \(other.profile.preambleLength) + 48·N") == true)
    }

    @Test("a preamble without beacons, a cut beacon, an empty body fit neither profile")
    func badLengths() throws {
        let stream = try Self.announcement(.spec, receivers: 1)
        for body in [Array(stream.prefix(96)), Array(stream.dropLast(1)), [], Array(stream.prefix(73))] {
            let analysis = BeaconBodyAnalysis(body: body)
            #expect(analysis.fitting.isEmpty, "length \(body.count)")
            #expect(analysis.findings.allSatisfy { $0.formatProblem?.contains("length \(body.count)") == true })
        }
    }

    @Test("a spec body with a wrong SPKI prefix or a point off the curve is rejected")
    func badSpecKey() throws {
        var wrongPrefix = try Self.announcement(.spec)
        wrongPrefix[1] ^= 0x01
        #expect(BeaconBodyAnalysis(body: wrongPrefix).findings[0].formatProblem?.contains("ephemeral key rejected") == true)

        var offCurve = try Self.announcement(.spec)
        offCurve[87] ^= 0x01  // last byte of Y: (X, Y') is not on secp256k1
        let finding = BeaconBodyAnalysis(body: offCurve).findings[0]
        #expect(finding.formatProblem?.contains("not-on-curve") == true)
        #expect(!finding.fits)
    }

    @Test("a cordova body whose key is not an uncompressed point is rejected")
    func badCordovaKey() throws {
        var compressedTag = try Self.announcement(.cordova)
        compressedTag[0] = 0x02
        let finding = BeaconBodyAnalysis(body: compressedTag).findings[1]
        #expect(finding.profile == .cordova)
        #expect(finding.formatProblem?.contains("does not start with 04") == true)
    }

    @Test("expirations in the past or beyond 24 h are named, with the skew tolerance applied")
    func expirationWindow() {
        let now = Self.now
        #expect(BeaconBodyAnalysis.expirationProblem(now - 1, now: now)?.contains("expired") == true)
        #expect(BeaconBodyAnalysis.expirationProblem(now - 1, now: now, tolerance: 5) == nil)
        #expect(BeaconBodyAnalysis.expirationProblem(now, now: now) == nil)
        #expect(BeaconBodyAnalysis.expirationProblem(now + 86_400_000, now: now) == nil)
        #expect(BeaconBodyAnalysis.expirationProblem(now + 86_400_001, now: now)?.contains("more than 24 h") == true)
        #expect(BeaconBodyAnalysis.expirationProblem(.max, now: now) != nil)
    }
}

@Suite("Probe report")
struct ProbeReportTests {
    @Test("text: a line per check, notes once, and the tally last; JSON carries the same")
    func rendering() throws {
        var report = ProbeReport(target: "http://127.0.0.1:1/NotificationBeacons")
        report.record("status", .pass, "200 OK")
        report.record("content-type", .fail, "Content-Type missing")
        report.record("unknown-path", .warn, "status 200")
        report.record("empty-204", .notApplicable, "status 200")
        report.note("flags unverified")
        report.note("flags unverified")
        let lines = report.text.split(separator: "\n").map(String.init)
        #expect(lines == [
            "probe http://127.0.0.1:1/NotificationBeacons",
            "PASS status: 200 OK",
            "FAIL content-type: Content-Type missing",
            "WARN unknown-path: status 200",
            "N/A  empty-204: status 200",
            "NOTE flags unverified",
            "1 passed, 1 failed",
        ])
        let object = try #require(try JSONSerialization.jsonObject(with: Data(report.json().utf8)) as? [String: Any])
        #expect(object["passed"] as? Int == 1)
        #expect(object["failed"] as? Int == 1)
        #expect(object["warnings"] as? Int == 1)
        #expect(object["notes"] as? [String] == ["flags unverified"])
        let checks = try #require(object["checks"] as? [[String: String]])
        #expect(checks.map { $0["verdict"] } == ["PASS", "FAIL", "WARN", "N/A"])
        #expect(checks[1] == ["id": "content-type", "verdict": "FAIL", "reason": "Content-Type missing"])
    }
}

@Suite("Probe configuration")
struct ProbeConfigurationTests {
    @Test("defaults come from the suite's own client and beacon limits")
    func defaults() {
        let configuration = ProbeConfiguration()
        #expect(configuration.maxBodyBytes == BeaconHTTPClientConfiguration().maxBodyBytes)
        #expect(configuration.maxHeadBytes == BeaconHTTPClientConfiguration().maxHeadBytes)
        #expect(configuration.connectTimeout == BeaconHTTPClientConfiguration().connectTimeout)
        #expect(configuration.maxBeacons == BeaconLimits().maximumBeaconsPerAnnouncement)
        #expect(configuration.problem == nil)
    }

    @Test("bounds that do not hold give one failed check and no traffic")
    func refusedConfiguration() async {
        var configuration = ProbeConfiguration()
        configuration.burstEnabled = true  // its bounds count only when the burst runs
        configuration.burstConcurrency = ProbeConfiguration.maximumBurstConcurrency + 1
        // Port 9 on loopback: nothing is sent there anyway, the probe stops before connecting.
        let report = await ConformanceProbe(location: BeaconLocation(host: "127.0.0.1", port: 9),
                                            configuration: configuration,
                                            group: MultiThreadedEventLoopGroup.singleton).run()
        #expect(report.checks == [ProbeCheck("configuration", .fail, "burst concurrency must be 1 ... 256")])
        configuration.burstEnabled = false
        #expect(configuration.problem == nil)
        configuration.responseTimeout = .zero
        #expect(configuration.problem == "timeouts must be positive")
    }
}
