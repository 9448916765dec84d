import Foundation

/// A report read back from its JSON (`--json-out`, format `thali-conformance-report/2` or `/1`): an
/// earlier run that a later one is compared with, case by case (`--baseline FILE`, spec/conformance.md).
///
/// Everything in it is what the earlier run wrote, which quoted the implementation under test: untrusted
/// text, to be escaped wherever it is shown.
public struct RecordedConformanceReport: Sendable, Hashable {
    /// The format prefix every version of the report's JSON has.
    public static let formatPrefix = "thali-conformance-report/"

    /// One case as the earlier run recorded it.
    public struct Result: Sendable, Hashable, Decodable {
        /// The case id (`peer/psk-tls/unknown-identity`).
        public var id: String
        /// What the case checks.
        public var title: String
        /// The requirement ids it grades.
        public var requirements: [String]
        /// Its level in that run.
        public var level: RequirementLevel
        /// Its verdict in that run.
        public var verdict: ConformanceVerdict

        /// A recorded result.
        public init(id: String, title: String, requirements: [String], level: RequirementLevel, verdict: ConformanceVerdict) {
            self.id = id
            self.title = title
            self.requirements = requirements
            self.level = level
            self.verdict = verdict
        }
    }

    /// The format the file named (`thali-conformance-report/2`).
    public var format: String
    /// What that run tested (`peer 02ab…`).
    public var target: String
    /// Its results, in the order its cases ended.
    public var results: [Result]

    /// The mode of that run: the first word of its target (`peer`, `target`, `vectors`, `bluetooth`).
    public var mode: String { ConformanceReport.mode(of: target) }

    /// The recorded form of a report in memory: what its JSON reads back as.
    public init(_ report: ConformanceReport) {
        format = ConformanceReport.format
        target = report.target
        results = report.results.map {
            Result(id: $0.testCase.id, title: $0.testCase.title, requirements: $0.testCase.requirements, level: $0.level, verdict: $0.verdict)
        }
    }

    /// Parses a report's JSON; throws unless it is a conformance report (any version) whose results carry
    /// a known verdict and level each.
    public init(json data: Data) throws(RequirementCatalogError) {
        struct Document: Decodable {
            var format: String
            var target: String
            var results: [Result]
        }
        let document: Document
        do {
            document = try JSONDecoder().decode(Document.self, from: data)
        } catch {
            throw RequirementCatalogError(description: "not a conformance report: \(error)")
        }
        guard document.format.hasPrefix(Self.formatPrefix) else {
            throw RequirementCatalogError(description: "format \(document.format), expected \(ConformanceReport.format)")
        }
        format = document.format
        target = document.target
        results = document.results
    }

    /// The result of case `id` in that run (its first, should a case have been recorded twice).
    public func result(_ id: String) -> Result? { results.first { $0.id == id } }
}

/// How a run differs from an earlier one of the same mode: the cases whose verdict changed, the cases
/// that are new, and the cases that are gone (spec/conformance.md, "HTML report").
public struct ConformanceReportDiff: Sendable, Hashable {
    /// A case that ran both times with different verdicts.
    public struct Change: Sendable, Hashable {
        /// The case id.
        public var id: String
        /// What the case checks (this run's title).
        public var title: String
        /// Its level in this run.
        public var level: RequirementLevel
        /// Its verdict in the earlier run.
        public var before: ConformanceVerdict
        /// Its verdict in this run.
        public var after: ConformanceVerdict

        /// Whether the verdict got worse: toward FAIL (PASS, N/A … INCONCLUSIVE, WARN, FAIL).
        public var isRegression: Bool { Self.rank(after) > Self.rank(before) }

        /// How bad a verdict is, for telling a regression from an improvement.
        static func rank(_ verdict: ConformanceVerdict) -> Int {
            switch verdict {
            case .pass: 0
            case .notApplicable: 1
            case .unsupported: 2
            case .inconclusive: 3
            case .warn: 4
            case .fail: 5
            }
        }
    }

    /// Cases whose verdict changed, in this run's order.
    public var changed: [Change]
    /// Cases of this run that the earlier one did not have, in this run's order.
    public var added: [ConformanceResult]
    /// Cases of the earlier run that this one did not have, in the earlier run's order.
    public var removed: [RecordedConformanceReport.Result]
    /// How many cases ran both times with the same verdict.
    public var unchanged: Int

    /// The differences from `previous` to `current`.
    public init(from previous: RecordedConformanceReport, to current: ConformanceReport) {
        var before: [String: RecordedConformanceReport.Result] = [:]
        for result in previous.results where before[result.id] == nil { before[result.id] = result }
        var seen = Set<String>()
        changed = []
        added = []
        unchanged = 0
        for result in current.results where seen.insert(result.testCase.id).inserted {
            guard let earlier = before[result.testCase.id] else {
                added.append(result)
                continue
            }
            if earlier.verdict == result.verdict {
                unchanged += 1
            } else {
                changed.append(Change(id: result.testCase.id, title: result.testCase.title, level: result.level,
                                      before: earlier.verdict, after: result.verdict))
            }
        }
        var listed = Set<String>()
        removed = previous.results.filter { !seen.contains($0.id) && listed.insert($0.id).inserted }
    }

    /// Whether nothing changed: the same cases with the same verdicts.
    public var isEmpty: Bool { changed.isEmpty && added.isEmpty && removed.isEmpty }
}
