import Foundation
import Testing
import ThaliBeacons
import ThaliTestSupport

/// The checker behind `thali-node conformance beacons` reports tampered vectors as failures, with a
/// line that names the case, the field, the expected and the actual value.
@Suite struct ConformanceTests {
    static let specPath = PackagePaths.root() + "/spec/vectors/beacons-spec.json"
    static let cordovaPath = PackagePaths.root() + "/spec/vectors/beacons-cordova.json"

    /// The vector file as a JSON tree we can tamper with.
    func tree(_ path: String) throws -> [String: Any] {
        let data = try #require(FileManager.default.contents(atPath: path))
        return try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
    }

    func check(_ tree: [String: Any]) throws -> BeaconConformance.Report {
        BeaconConformance.check(json: try JSONSerialization.data(withJSONObject: tree), file: "tampered.json")
    }

    func tamper(_ path: String, case index: Int, _ change: (inout [String: Any]) -> Void) throws -> BeaconConformance.Report {
        var root = try tree(path)
        var cases = try #require(root["cases"] as? [[String: Any]])
        change(&cases[index])
        root["cases"] = cases
        return try check(root)
    }

    @Test func untouchedFilesPass() throws {
        let report = try check(try tree(Self.specPath))
        #expect(report.passed == 10 && report.failed == 0 && report.differences.isEmpty)
    }

    @Test func tamperedStreamByteIsReportedWithItsOffset() throws {
        let report = try tamper(Self.specPath, case: 2) { vector in
            var stream = Array((vector["stream"] as! String).utf8)
            stream[2 * 200] = stream[2 * 200] == UInt8(ascii: "0") ? UInt8(ascii: "1") : UInt8(ascii: "0")
            vector["stream"] = String(decoding: stream, as: UTF8.self)
        }
        #expect(report.failed == 1)
        #expect(report.passed == 9)
        let line = try #require(report.differences.first { $0.field == "stream" })
        #expect(line.caseId == "S03")
        #expect(line.description.hasPrefix("tampered.json S03 stream: expected 1056 bytes, "))
        #expect(line.expected.hasSuffix("at byte 200"))
        #expect(line.got.hasSuffix("at byte 200"))
    }

    @Test func tamperedPSKAndOutcomeAreReported() throws {
        let report = try tamper(Self.cordovaPath, case: 0) { vector in
            var beacons = vector["beacons"] as! [[String: Any]]
            beacons[0]["psk_secret"] = String(repeating: "00", count: 32)
            beacons[0]["psk_identity"] = "forged"
            vector["beacons"] = beacons
            var parses = vector["parses"] as! [[String: Any]]
            parses[0]["expect"] = ["reject": "expired"]
            vector["parses"] = parses
        }
        #expect(report.failed == 1)
        #expect(report.passed == 15)
        let fields = report.differences.map(\.field)
        #expect(fields.contains("beacons[0].psk_secret"))
        #expect(fields.contains("beacons[0].psk_identity"))
        let outcome = try #require(report.differences.first { $0.field.hasPrefix("parses[0].outcome") })
        #expect(outcome.expected == "reject expired")
        #expect(outcome.got.hasPrefix("match 0 from 04"))
    }

    @Test func wrongProfileFailsEveryCase() throws {
        var root = try tree(Self.cordovaPath)
        root["profile"] = "spec"
        let report = try check(root)
        #expect(report.passed == 0)
        #expect(report.failed == 16)
    }

    @Test func unreadableOrForeignFilesFail() throws {
        var report = BeaconConformance.check(contentsOf: "/nonexistent/vectors.json")
        #expect(report.failed == 1 && report.differences.first?.field == "file")
        report = BeaconConformance.check(json: Data("{".utf8), file: "broken.json")
        #expect(report.failed == 1 && report.differences.first?.file == "broken.json")
        var root = try tree(Self.specPath)
        root["format"] = "thali-beacon-vectors/2"
        report = try check(root)
        #expect(report.failed == 1 && report.passed == 0)
    }
}
