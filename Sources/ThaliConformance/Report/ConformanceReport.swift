import Foundation

/// The verdict of one conformance case (spec/conformance.md, "Verdicts").
public enum ConformanceVerdict: String, Sendable, Hashable, Codable, CaseIterable {
    /// The implementation does what the rule asks.
    case pass = "PASS"
    /// It breaks the rule.
    case fail = "FAIL"
    /// Allowed but weaker than recommended (a SHOULD or a PROFILE limit not met).
    case warn = "WARN"
    /// The case does not apply to this run (for example no adapter to read the inbox with).
    case notApplicable = "N/A"
    /// The implementation says it does not support the feature the case needs.
    case unsupported = "UNSUPPORTED"
    /// The case could not decide: an earlier step failed or the run was interrupted.
    case inconclusive = "INCONCLUSIVE"
}

/// A conformance case: what it checks and the requirements it grades.
public struct ConformanceCase: Sendable, Hashable, Codable {
    /// A stable id, `mode/layer/name` (`peer/psk-tls/unknown-identity`); select cases by prefix.
    public var id: String
    /// What the case checks, in a few words.
    public var title: String
    /// The ids in `spec/requirements.json` it grades.
    public var requirements: [String]

    /// A case.
    public init(_ id: String, _ title: String, _ requirements: [String]) {
        self.id = id
        self.title = title
        self.requirements = requirements
    }
}

/// What one case found.
public struct ConformanceResult: Sendable, Hashable, Codable {
    /// The case.
    public var testCase: ConformanceCase
    /// The strongest level among its requirements.
    public var level: RequirementLevel
    /// The verdict.
    public var verdict: ConformanceVerdict
    /// What the rule expects.
    public var expected: String
    /// What happened.
    public var actual: String
    /// How long the case took, in milliseconds.
    public var milliseconds: Int

    /// A result.
    public init(testCase: ConformanceCase, level: RequirementLevel, verdict: ConformanceVerdict, expected: String,
                actual: String, milliseconds: Int) {
        self.testCase = testCase
        self.level = level
        self.verdict = verdict
        self.expected = expected
        self.actual = actual
        self.milliseconds = milliseconds
    }

    /// A failure of a MUST: the only thing that makes a run fail (besides a broken baseline).
    public var isMustFailure: Bool { verdict == .fail && level == .must }
}

/// Expected failures: case ids and the verdict each is expected to give (tlsfuzzer's `-x`, TLS-Anvil's
/// baseline). A case listed here that gives another verdict breaks the baseline, so a fixed bug is noticed.
///
/// File format (spec/conformance.md): JSON `{"format": "thali-conformance-baseline/1", "expected":
/// {"case id": "FAIL", ...}}`, or a report an earlier run wrote (`--json-out`, format
/// `thali-conformance-report/2`): then its FAILs are the expected failures, and the earlier run is kept
/// (``previous``) to show what changed since.
public struct ConformanceBaseline: Sendable, Hashable {
    /// The format name.
    public static let format = "thali-conformance-baseline/1"
    /// Case id → the verdict it is expected to give.
    public var expected: [String: ConformanceVerdict]
    /// The earlier run, when the baseline was read from its report.
    public var previous: RecordedConformanceReport?

    /// A baseline.
    public init(expected: [String: ConformanceVerdict] = [:]) { self.expected = expected }

    /// The baseline an earlier run's report makes: every case it failed is expected to fail again.
    public init(previous: RecordedConformanceReport) {
        var expected: [String: ConformanceVerdict] = [:]
        for result in previous.results where result.verdict == .fail { expected[result.id] = .fail }
        self.expected = expected
        self.previous = previous
    }

    /// Parses a baseline document, or a report an earlier run wrote.
    public init(json data: Data) throws(RequirementCatalogError) {
        struct Format: Decodable { var format: String }
        struct Document: Decodable {
            var format: String
            var expected: [String: ConformanceVerdict]
        }
        if let format = try? JSONDecoder().decode(Format.self, from: data).format, format.hasPrefix(RecordedConformanceReport.formatPrefix) {
            self.init(previous: try RecordedConformanceReport(json: data))
            return
        }
        let document: Document
        do {
            document = try JSONDecoder().decode(Document.self, from: data)
        } catch {
            throw RequirementCatalogError(description: "not a baseline: \(error)")
        }
        guard document.format == Self.format else {
            throw RequirementCatalogError(description: "baseline format \(document.format), expected \(Self.format) or a report (\(ConformanceReport.format))")
        }
        self.init(expected: document.expected)
    }
}

/// Everything a conformance run found, and its outputs: a table for people, versioned JSON, JUnit XML.
public struct ConformanceReport: Sendable, Hashable {
    /// The JSON format name and version. 2: snake_case keys (`catalog_version`, `baseline_mismatches`),
    /// as every other `--json` output of thali-node (spec/node.md, "JSON output"); 1 had camelCase ones.
    public static let format = "thali-conformance-report/2"
    /// What was tested (`peer 127.0.0.1:4321`).
    public var target: String
    /// Results in the order the cases ended.
    public var results: [ConformanceResult] = []
    /// Remarks about the whole run.
    public var notes: [String] = []
    /// Whether the run was cut short (SIGINT, a deadline): the results are what it had.
    public var interrupted = false
    /// The expected failures the run is judged against.
    public var baseline = ConformanceBaseline()
    /// Requirement texts, for quoting a rule when its case fails.
    public var catalog: RequirementCatalog?
    /// How long the run took, in milliseconds (wall-clock, from its start to this report), when known.
    public var milliseconds: Int?

    /// The mode of the run: the first word of its target (`peer`, `target`, `vectors`, `bluetooth`).
    public var mode: String { Self.mode(of: target) }

    /// The mode a target names: its first word, without a trailing colon.
    public static func mode(of target: String) -> String {
        let word = target.split(separator: " ", maxSplits: 1).first.map(String.init) ?? ""
        return word.hasSuffix(":") ? String(word.dropLast()) : word
    }

    /// An empty report.
    public init(target: String, catalog: RequirementCatalog?) {
        self.target = target
        self.catalog = catalog
    }

    /// Number of results with `verdict`.
    public func count(_ verdict: ConformanceVerdict) -> Int { results.count { $0.verdict == verdict } }

    /// The result of case `id`, if it ran.
    public func result(_ id: String) -> ConformanceResult? { results.first { $0.testCase.id == id } }

    /// Cases in the baseline whose verdict differs from the expected one (a case that did not run at all
    /// in an interrupted run is not counted).
    public var baselineMismatches: [(id: String, expected: ConformanceVerdict, actual: ConformanceVerdict)] {
        baseline.expected.keys.sorted().compactMap { id in
            guard let expected = baseline.expected[id], let actual = result(id)?.verdict, actual != expected else { return nil }
            return (id, expected, actual)
        }
    }

    /// MUST failures that the baseline does not expect.
    public var unexpectedMustFailures: [ConformanceResult] {
        results.filter { $0.isMustFailure && baseline.expected[$0.testCase.id] != .fail }
    }

    /// Whether the run passes: no MUST fails unless expected, and the baseline holds.
    public var succeeded: Bool { unexpectedMustFailures.isEmpty && baselineMismatches.isEmpty }

    /// One progress line for a result, as printed when the case ends.
    public static func progressLine(_ result: ConformanceResult) -> String {
        "\(result.verdict.rawValue.padded(12)) \(result.level.rawValue.padded(7)) \(result.testCase.id): \(result.actual)"
    }

    /// The human table: id, level, verdict, expected and actual; on a failure or warning the rules quoted.
    public var table: String {
        var lines = ["conformance \(target)" + (interrupted ? " (interrupted)" : "")]
        let idWidth = max(4, results.map(\.testCase.id.count).max() ?? 0)
        lines.append("\("case".padded(idWidth))  \("level".padded(7))  \("verdict".padded(12))  expected / actual")
        for result in results {
            lines.append("\(result.testCase.id.padded(idWidth))  \(result.level.rawValue.padded(7))  "
                         + "\(result.verdict.rawValue.padded(12))  expected: \(result.expected)")
            lines.append("\(String(repeating: " ", count: idWidth + 25))actual:   \(result.actual)")
            if result.verdict == .fail || result.verdict == .warn {
                for id in result.testCase.requirements {
                    let rule = catalog?[id].map { "\($0.level.rawValue) \($0.rule) (spec/\($0.document))" } ?? "not in the catalog"
                    lines.append("\(String(repeating: " ", count: idWidth + 25))[\(id)] \(rule)")
                }
            }
        }
        for note in notes { lines.append("NOTE \(note)") }
        for mismatch in baselineMismatches {
            lines.append("BASELINE \(mismatch.id): expected \(mismatch.expected.rawValue), got \(mismatch.actual.rawValue)")
        }
        let tally = ConformanceVerdict.allCases.map { "\(count($0)) \($0.rawValue)" }.joined(separator: ", ")
        lines.append("\(tally); \(succeeded ? "conforms" : "does not conform")"
                     + (unexpectedMustFailures.isEmpty ? "" : " (\(unexpectedMustFailures.count) MUST failed)"))
        return lines.joined(separator: "\n")
    }

    /// The report as one JSON object (format `thali-conformance-report/2`, snake_case keys, sorted).
    public func json() -> String {
        struct Result: Encodable {
            var id: String, title: String, requirements: [String], level: String, verdict: String
            var expected: String, actual: String, milliseconds: Int
        }
        struct Mismatch: Encodable { var id: String, expected: String, actual: String }
        struct Document: Encodable {
            var format: String, catalogVersion: Int?, target: String, interrupted: Bool, succeeded: Bool
            var milliseconds: Int?
            var counts: [String: Int], results: [Result], notes: [String], baselineMismatches: [Mismatch]

            enum CodingKeys: String, CodingKey {
                case format, target, interrupted, succeeded, milliseconds, counts, results, notes
                case catalogVersion = "catalog_version", baselineMismatches = "baseline_mismatches"
            }
        }
        let document = Document(
            format: Self.format, catalogVersion: catalog?.version, target: target, interrupted: interrupted,
            succeeded: succeeded, milliseconds: milliseconds,
            counts: Dictionary(uniqueKeysWithValues: ConformanceVerdict.allCases.map { ($0.rawValue, count($0)) }),
            results: results.map {
                Result(id: $0.testCase.id, title: $0.testCase.title, requirements: $0.testCase.requirements,
                       level: $0.level.rawValue, verdict: $0.verdict.rawValue, expected: $0.expected,
                       actual: $0.actual, milliseconds: $0.milliseconds)
            },
            notes: notes,
            baselineMismatches: baselineMismatches.map { Mismatch(id: $0.id, expected: $0.expected.rawValue, actual: $0.actual.rawValue) })
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes, .prettyPrinted]
        // Strings, integers and booleans always encode.
        return (try? encoder.encode(document)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
    }

    /// The report as JUnit XML: one `testcase` per case; FAIL is a `failure` (an `error` for a MUST),
    /// N/A, UNSUPPORTED and INCONCLUSIVE are `skipped`, WARN passes with its text in `system-out`.
    public func junitXML() -> String {
        let failures = results.count { $0.verdict == .fail }
        let skipped = results.count { [.notApplicable, .unsupported, .inconclusive].contains($0.verdict) }
        let seconds = Double(results.reduce(0) { $0 + $1.milliseconds }) / 1000
        var xml = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
        xml += "<testsuites name=\"thali-conformance\" tests=\"\(results.count)\" failures=\"\(failures)\">\n"
        xml += "  <testsuite name=\"\(escape(target))\" tests=\"\(results.count)\" failures=\"\(failures)\" "
            + "errors=\"0\" skipped=\"\(skipped)\" time=\"\(seconds)\">\n"
        for result in results {
            let name = escape(result.testCase.id)
            let time = Double(result.milliseconds) / 1000
            xml += "    <testcase classname=\"\(escape(result.level.rawValue))\" name=\"\(name)\" time=\"\(time)\">\n"
            let message = escape("\(result.testCase.requirements.joined(separator: ", ")): expected \(result.expected); actual \(result.actual)")
            switch result.verdict {
            case .fail:
                xml += "      <failure message=\"\(message)\" type=\"\(result.level.rawValue)\"/>\n"
            case .notApplicable, .unsupported, .inconclusive:
                xml += "      <skipped message=\"\(escape(result.verdict.rawValue)): \(message)\"/>\n"
            case .warn:
                xml += "      <system-out>WARN \(message)</system-out>\n"
            case .pass:
                break
            }
            xml += "    </testcase>\n"
        }
        xml += "  </testsuite>\n</testsuites>\n"
        return xml
    }

    private func escape(_ text: String) -> String {
        var out = ""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&apos;"
            // XML 1.0 cannot carry most control characters, even escaped.
            case _ where scalar.value < 0x20 && scalar != "\n" && scalar != "\t": out += "?"
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out
    }
}

extension String {
    func padded(_ width: Int) -> String {
        count >= width ? self : self + String(repeating: " ", count: width - count)
    }
}
