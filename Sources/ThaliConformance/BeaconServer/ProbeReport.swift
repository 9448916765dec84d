import Foundation

/// The outcome of one probe check: the suite's verdicts (the probe gives PASS, FAIL, WARN and N/A).
public typealias ProbeVerdict = ConformanceVerdict

/// What one check of the probe found.
public struct ProbeCheck: Sendable, Hashable, Codable {
    /// A stable name for scripts (`status`, `content-type`, `burst`, ...).
    public var id: String
    /// The verdict.
    public var verdict: ProbeVerdict
    /// One line saying why.
    public var reason: String

    /// A check result.
    public init(_ id: String, _ verdict: ProbeVerdict, _ reason: String) {
        self.id = id
        self.verdict = verdict
        self.reason = reason
    }
}

/// Everything a probe of one endpoint found: the checks in the order they ran and notes that apply to
/// the whole run (such as what a probe cannot verify). A value, apart from the I/O that produced it.
public struct ProbeReport: Sendable, Hashable, Codable {
    /// The probed endpoint, `http://host:port/NotificationBeacons`.
    public var target: String
    /// The checks in the order they ran.
    public var checks: [ProbeCheck] = []
    /// Remarks about the run as a whole, each printed once.
    public var notes: [String] = []

    /// An empty report for `target`.
    public init(target: String) { self.target = target }

    /// Checks that passed.
    public var passed: Int { checks.count { $0.verdict == .pass } }
    /// Checks that failed.
    public var failed: Int { checks.count { $0.verdict == .fail } }
    /// Checks that warned.
    public var warnings: Int { checks.count { $0.verdict == .warn } }

    /// The check named `id`, if it ran.
    public func check(_ id: String) -> ProbeCheck? { checks.first { $0.id == id } }

    /// Appends a check.
    public mutating func record(_ id: String, _ verdict: ProbeVerdict, _ reason: String) {
        checks.append(ProbeCheck(id, verdict, reason))
    }

    /// Adds a note unless it is already there.
    public mutating func note(_ text: String) {
        if !notes.contains(text) { notes.append(text) }
    }

    /// The human-readable report: one line per check (`VERDICT id: reason`), the notes, and a last
    /// line `N passed, M failed`.
    public var text: String {
        var lines = ["probe \(target)"]
        for check in checks {
            lines.append("\(check.verdict.rawValue.padding(4)) \(check.id): \(check.reason)")
        }
        for note in notes { lines.append("NOTE \(note)") }
        lines.append("\(passed) passed, \(failed) failed")
        return lines.joined(separator: "\n")
    }
}

extension String {
    fileprivate func padding(_ width: Int) -> String {
        count >= width ? self : self + String(repeating: " ", count: width - count)
    }
}

extension ProbeReport {
    /// The report as one JSON object: `target`, `checks` (each `id`, `verdict`, `reason`), `notes`,
    /// `passed`, `failed`, `warnings`; keys sorted so that output is stable.
    public func json() -> String {
        struct Document: Encodable {
            var target: String
            var checks: [ProbeCheck]
            var notes: [String]
            var passed: Int
            var failed: Int
            var warnings: Int
        }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let document = Document(target: target, checks: checks, notes: notes, passed: passed, failed: failed,
                                warnings: warnings)
        // Strings, integers and arrays of them always encode.
        return (try? encoder.encode(document)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
    }
}
