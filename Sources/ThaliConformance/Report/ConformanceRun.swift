import Foundation
import NIOConcurrencyHelpers
import NIOCore

/// A run in progress: results are recorded as each case ends (and handed to `progress` at once), so a
/// run cut short by SIGINT still has, and prints, everything it found.
public final class ConformanceRun: Sendable {
    private let state: NIOLockedValueBox<ConformanceReport>
    private let progress: @Sendable (ConformanceResult) -> Void
    private let started = NIODeadline.now()

    /// A run against `target`, judged against `baseline`, quoting rules from `catalog`.
    public init(target: String, catalog: RequirementCatalog?, baseline: ConformanceBaseline = .init(),
                progress: @escaping @Sendable (ConformanceResult) -> Void = { _ in }) {
        var report = ConformanceReport(target: target, catalog: catalog)
        report.baseline = baseline
        state = NIOLockedValueBox(report)
        self.progress = progress
    }

    /// Everything recorded so far, with the time since the run began.
    public var report: ConformanceReport {
        var report = state.withLockedValue { $0 }
        report.milliseconds = Int((NIODeadline.now() - started).nanoseconds / 1_000_000)
        return report
    }

    /// Records the verdict of `testCase`, which began at `started`, and reports it as progress.
    public func record(_ testCase: ConformanceCase, _ verdict: ConformanceVerdict, expected: String, actual: String,
                       started: NIODeadline = .now()) {
        let milliseconds = Int((NIODeadline.now() - started).nanoseconds / 1_000_000)
        let result = state.withLockedValue { report -> ConformanceResult in
            let level = report.catalog?.level(of: testCase.requirements) ?? .must
            let result = ConformanceResult(testCase: testCase, level: level, verdict: verdict, expected: expected,
                                           actual: actual, milliseconds: milliseconds)
            report.results.append(result)
            return result
        }
        progress(result)
    }

    /// Records a result whose verdict follows from whether the rule held: PASS, else FAIL for a MUST and
    /// WARN for anything weaker (a SHOULD, or a PROFILE limit of ours).
    public func grade(_ testCase: ConformanceCase, holds: Bool, expected: String, actual: String,
                      started: NIODeadline = .now()) {
        let level = state.withLockedValue { $0.catalog?.level(of: testCase.requirements) ?? .must }
        let verdict: ConformanceVerdict = holds ? .pass : (level == .must ? .fail : .warn)
        record(testCase, verdict, expected: expected, actual: actual, started: started)
    }

    /// Records every case of `cases` that has no result yet with `verdict` (for the steps an earlier
    /// failure made impossible to run).
    public func recordRemaining(_ cases: [ConformanceCase], _ verdict: ConformanceVerdict, because reason: String) {
        let done = Set(report.results.map(\.testCase.id))
        for testCase in cases where !done.contains(testCase.id) {
            record(testCase, verdict, expected: testCase.title, actual: reason)
        }
    }

    /// The verdict recorded for `testCase`, or nil while it has none.
    public func verdict(of testCase: ConformanceCase) -> ConformanceVerdict? {
        state.withLockedValue { report in report.results.last { $0.testCase.id == testCase.id }?.verdict }
    }

    /// The first case recorded as FAIL in this run, if any.
    public var firstFailure: ConformanceCase? {
        state.withLockedValue { report in report.results.first { $0.verdict == .fail }?.testCase }
    }

    /// Records every case of `dependents` that has no result yet as INCONCLUSIVE, naming `blocker`: the
    /// step each one needs did not pass, so it could not be graded. The cause stays the one FAIL (or
    /// INCONCLUSIVE) where it happened, instead of repeating on every later step.
    public func recordDependents(_ dependents: [ConformanceCase], on blocker: ConformanceCase) {
        let outcome = switch verdict(of: blocker) {
        case .fail?: "which failed"
        case .inconclusive?: "which was inconclusive"
        case .unsupported?: "which it does not support"
        case .notApplicable?: "which does not apply"
        default: "which did not pass"
        }
        recordRemaining(dependents.filter { $0.id != blocker.id }, .inconclusive, because: "not graded: it needs \(blocker.id), \(outcome)")
    }

    /// Records a step that broke: the first case of `steps` with no result yet FAILs with `actual`, and
    /// every later one is INCONCLUSIVE, naming it (``recordDependents(_:on:)``). Returns the case that
    /// failed, nil when every step had a result.
    @discardableResult
    public func failFirstOpenStep(_ steps: [ConformanceCase], actual: String, started: NIODeadline = .now()) -> ConformanceCase? {
        let done = Set(report.results.map(\.testCase.id))
        guard let step = steps.first(where: { !done.contains($0.id) }) else { return nil }
        record(step, .fail, expected: step.title, actual: actual, started: started)
        recordDependents(steps, on: step)
        return step
    }

    /// Adds a note for the whole run (once).
    public func note(_ text: String) {
        state.withLockedValue { if !$0.notes.contains(text) { $0.notes.append(text) } }
    }

    /// Marks the run as cut short.
    public func markInterrupted() { state.withLockedValue { $0.interrupted = true } }
}
