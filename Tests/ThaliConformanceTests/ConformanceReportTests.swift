import Foundation
import Testing
import ThaliTestSupport

#if canImport(FoundationXML)
import FoundationXML
#endif

@testable import ThaliConformance

/// The run report: exit rule, baseline, and that its JSON and JUnit XML parse.
@Suite("Conformance report")
struct ConformanceReportTests {
    static func catalog() throws -> RequirementCatalog {
        try RequirementCatalog(version: 7, requirements: [
            Requirement(id: "T-1.1", level: .must, layer: "t", document: "t.md", section: "1", rule: "a must <rule> & more"),
            Requirement(id: "T-1.2", level: .should, layer: "t", document: "t.md", section: "1", rule: "a should rule"),
            Requirement(id: "T-1.3", level: .profile, layer: "t", document: "t.md", section: "1", rule: "our limit"),
        ])
    }

    static let mustCase = ConformanceCase("t/must", "the must", ["T-1.1"])
    static let shouldCase = ConformanceCase("t/should", "the should", ["T-1.2"])
    static let profileCase = ConformanceCase("t/profile", "the profile", ["T-1.3"])

    /// A run with one result of every verdict.
    static func report(baseline: ConformanceBaseline = .init(), mustHolds: Bool) throws -> ConformanceReport {
        let run = ConformanceRun(target: "test \"target\" <x>", catalog: try catalog(), baseline: baseline)
        run.grade(mustCase, holds: mustHolds, expected: "x", actual: "y \u{1}\"<&>")
        run.grade(shouldCase, holds: false, expected: "x", actual: "y")
        run.grade(profileCase, holds: false, expected: "x", actual: "y")
        for verdict in [ConformanceVerdict.notApplicable, .unsupported, .inconclusive] {
            run.record(ConformanceCase("t/\(verdict.rawValue)", "other", ["T-1.1"]), verdict, expected: "x", actual: "y")
        }
        run.note("a note")
        return run.report
    }

    @Test("a failed MUST fails the run; a SHOULD or a PROFILE limit not met only warns")
    func exitRule() throws {
        let failing = try Self.report(mustHolds: false)
        #expect(failing.result("t/must")?.verdict == .fail)
        #expect(failing.result("t/should")?.verdict == .warn)
        #expect(failing.result("t/profile")?.verdict == .warn)
        #expect(!failing.succeeded)
        #expect(failing.table.contains("[T-1.1] MUST a must <rule> & more (spec/t.md)"), "the rule is quoted on failure")
        #expect(try Self.report(mustHolds: true).succeeded)
    }

    @Test("the baseline: an expected failure passes the run, a case that no longer gives its expected verdict fails it")
    func baseline() throws {
        let expected = ConformanceBaseline(expected: ["t/must": .fail])
        #expect(try Self.report(baseline: expected, mustHolds: false).succeeded)
        let fixed = try Self.report(baseline: expected, mustHolds: true)
        #expect(!fixed.succeeded)
        #expect(fixed.baselineMismatches.map(\.id) == ["t/must"])
        #expect(fixed.table.contains("BASELINE t/must: expected FAIL, got PASS"))
        let file = #"{"format":"thali-conformance-baseline/1","expected":{"t/must":"FAIL","t/should":"WARN"}}"#
        #expect(try ConformanceBaseline(json: Data(file.utf8)).expected == ["t/must": .fail, "t/should": .warn])
        #expect(throws: RequirementCatalogError.self) {
            try ConformanceBaseline(json: Data(#"{"format":"x","expected":{}}"#.utf8))
        }
    }

    @Test("the JSON report parses, names its format and carries every result")
    func json() throws {
        let report = try Self.report(mustHolds: false)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(report.json().utf8)) as? [String: Any])
        #expect(object["format"] as? String == "thali-conformance-report/2")
        #expect(object["catalog_version"] as? Int == 7)
        #expect(object["baseline_mismatches"] is [Any])
        // One JSON style with thali-node's other outputs: snake_case keys (`counts` is keyed by verdict).
        var keys = Set(object.keys)
        for result in object["results"] as? [[String: Any]] ?? [] { keys.formUnion(result.keys) }
        #expect(notSnakeCase(keys).isEmpty, "keys not in snake_case: \(notSnakeCase(keys))")
        #expect(object["succeeded"] as? Bool == false)
        let results = try #require(object["results"] as? [[String: Any]])
        #expect(results.count == 6)
        #expect(results.first?["requirements"] as? [String] == ["T-1.1"])
        #expect(results.first?["level"] as? String == "MUST")
        #expect((object["counts"] as? [String: Int])?["WARN"] == 2)
    }

    @Test("the adapter's inbox items are read in snake_case; the first published fromPublicKey still reads; neither is an error")
    func adapterInboxItem() throws {
        let snake = #"[{"id":"i1","from_public_key":"02ab","kind":"text","text":"hi","received_at":"2026-01-01T00:00:00Z"}]"#
        #expect(try JSONDecoder().decode([ConformanceAdapter.InboxItem].self, from: Data(snake.utf8)).first?.fromPublicKey == "02ab")
        let first = #"[{"id":"i1","fromPublicKey":"03cd","kind":"file"}]"#
        #expect(try JSONDecoder().decode([ConformanceAdapter.InboxItem].self, from: Data(first.utf8)).first?.fromPublicKey == "03cd")
        #expect(throws: DecodingError.self) {
            try JSONDecoder().decode([ConformanceAdapter.InboxItem].self, from: Data(#"[{"id":"i1","kind":"text"}]"#.utf8))
        }
    }

    @Test("the JUnit XML parses: one testcase per result, FAIL as failure, N/A, UNSUPPORTED, INCONCLUSIVE as skipped")
    func junit() throws {
        let report = try Self.report(mustHolds: false)
        let parser = XMLParser(data: Data(report.junitXML().utf8))
        let counter = ElementCounter()
        parser.delegate = counter
        #expect(parser.parse(), "\(String(describing: parser.parserError))\n\(report.junitXML())")
        #expect(counter.counts["testcase"] == 6)
        #expect(counter.counts["failure"] == 1)
        #expect(counter.counts["skipped"] == 3)
        #expect(counter.counts["testsuite"] == 1)
    }
}

/// Counts elements by name.
final class ElementCounter: NSObject, XMLParserDelegate {
    var counts: [String: Int] = [:]
    func parser(_ parser: XMLParser, didStartElement name: String, namespaceURI: String?, qualifiedName: String?,
                attributes: [String: String] = [:]) {
        counts[name, default: 0] += 1
    }
}
