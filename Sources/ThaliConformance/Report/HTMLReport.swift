import Foundation

/// A conformance report as one self-contained HTML page (`--html-out FILE`, spec/conformance.md, "HTML
/// report"): the run's summary, a matrix of layers × verdicts, every case with its rules quoted, its
/// evidence and what to fix, failures first, and what changed since an earlier run.
///
/// The page needs nothing but itself: inline CSS, no script, no image, no link out; its
/// Content-Security-Policy forbids scripts and every fetch, so a browser loads nothing else even if the
/// page were wrong. Every string the run carries is escaped: the evidence quotes the implementation under
/// test (error reasons, answers, its name in a vector answer file), and an earlier report is a file anyone
/// may have written.
///
/// ```swift
/// let page = HTMLReport(run.report, previous: baseline.previous).html
/// try Data(page.utf8).write(to: URL(fileURLWithPath: "report.html"))
/// ```
public struct HTMLReport: Sendable {
    /// The run shown.
    public var report: ConformanceReport
    /// The earlier run it is compared with, if any.
    public var previous: RecordedConformanceReport?

    /// The order in which verdicts are shown: what needs work first, passes last.
    public static let verdictOrder: [ConformanceVerdict] = [.fail, .warn, .inconclusive, .unsupported, .notApplicable, .pass]

    /// A page for `report`, compared with `previous` when given.
    public init(_ report: ConformanceReport, previous: RecordedConformanceReport? = nil) {
        self.report = report
        self.previous = previous
    }

    /// The differences from the earlier run, when there is one.
    public var diff: ConformanceReportDiff? { previous.map { ConformanceReportDiff(from: $0, to: report) } }

    /// The layer a case belongs to: the middle part of its id (`psk-tls` of `peer/psk-tls/unknown-identity`),
    /// or its mode for a two-part id (`probe/status`).
    public static func layer(of caseID: String) -> String {
        let parts = caseID.split(separator: "/", omittingEmptySubsequences: false)
        return parts.count >= 3 ? String(parts[1]) : String(parts.first ?? "")
    }

    /// The results in the order they are shown: by verdict (``verdictOrder``), then strongest level
    /// first, then in the order the cases ended.
    public var orderedResults: [ConformanceResult] {
        let rank = Dictionary(uniqueKeysWithValues: Self.verdictOrder.enumerated().map { ($1, $0) })
        return report.results.enumerated().sorted { left, right in
            let (l, r) = (left.element, right.element)
            if l.verdict != r.verdict { return rank[l.verdict, default: 0] < rank[r.verdict, default: 0] }
            if l.level != r.level { return l.level > r.level }
            return left.offset < right.offset
        }.map(\.element)
    }

    /// The whole page.
    public var html: String {
        var page = ""
        let verdict = report.succeeded ? "conforms" : "does not conform"
        page.append("""
            <!DOCTYPE html>
            <html lang="en">
            <head>
            <meta charset="utf-8">
            <meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
            <meta name="viewport" content="width=device-width, initial-scale=1">
            <meta name="generator" content="thali-node conformance (\(Self.escape(ConformanceReport.format)))">

            """)
        page.append("<title>Thali conformance: \(Self.escape(report.mode)) — \(verdict)</title>\n")
        page.append("<style>\n\(Self.style)</style>\n</head>\n<body>\n")
        summary(into: &page)
        let ordered = orderedResults
        let groups: [(ConformanceVerdict, String, String)] = [
            (.fail, "failures", "Failures"), (.warn, "warnings", "Warnings"), (.inconclusive, "inconclusive", "Inconclusive"),
            (.unsupported, "unsupported", "Unsupported"), (.notApplicable, "not-applicable", "Not applicable"),
        ]
        var index = 0
        for (verdict, anchor, heading) in groups {
            let cases = ordered.filter { $0.verdict == verdict }
            if verdict == .inconclusive, let diff { changes(diff, into: &page) }
            guard !cases.isEmpty else { continue }
            page.append("<section id=\"\(anchor)\">\n<h2>\(heading) <span class=\"n\">\(cases.count)</span></h2>\n")
            for result in cases {
                index += 1
                caseArticle(result, index: index, into: &page)
            }
            page.append("</section>\n")
        }
        passes(ordered.filter { $0.verdict == .pass }, into: &page)
        if !report.notes.isEmpty {
            page.append("<section id=\"notes\">\n<h2>Notes</h2>\n<ul>\n")
            for note in report.notes { page.append("<li>\(Self.escape(note))</li>\n") }
            page.append("</ul>\n</section>\n")
        }
        page.append("<footer>Written by <code>thali-node conformance</code>. Levels: MUST and SHOULD as in RFC 2119; "
                 + "PROFILE is a limit or policy of this implementation's, at most a warning; the catalog is spec/requirements.json"
                 + (report.catalog.map { ", version \($0.version)" } ?? "") + ".</footer>\n</body>\n</html>\n")
        return page
    }

    // MARK: - Parts

    private func summary(into page: inout String) {
        let failedMusts = report.unexpectedMustFailures.count
        let outcome = report.succeeded
            ? "<span class=\"outcome ok\">Conforms</span>"
            : "<span class=\"outcome bad\">Does not conform</span>"
        page.append("<header>\n<h1>\(outcome) <span class=\"mode\">\(Self.escape(report.mode)) mode</span></h1>\n")
        var reasons: [String] = []
        if failedMusts > 0 { reasons.append("\(failedMusts) MUST case\(failedMusts == 1 ? "" : "s") failed") }
        let mismatches = report.baselineMismatches
        if !mismatches.isEmpty { reasons.append("\(mismatches.count) case\(mismatches.count == 1 ? "" : "s") broke the baseline") }
        if report.interrupted { reasons.append("the run was interrupted: the cases it had not reached are missing") }
        if !reasons.isEmpty { page.append("<p class=\"why\">\(Self.escape(reasons.joined(separator: "; ")))</p>\n") }
        page.append("<div class=\"top\">\n<dl class=\"summary\">\n")
        page.append("<dt>Implementation</dt><dd><code>\(Self.escape(report.target))</code></dd>\n")
        page.append("<dt>Mode</dt><dd>\(Self.escape(report.mode))</dd>\n")
        page.append("<dt>Cases</dt><dd class=\"counts\">")
        for verdict in Self.verdictOrder {
            let count = report.count(verdict)
            page.append("<span class=\"badge \(Self.verdictClass(verdict))\(count == 0 ? " zero" : "")\">\(count) \(verdict.rawValue)</span> ")
        }
        page.append("</dd>\n")
        page.append("<dt>Duration</dt><dd>\(Self.escape(duration))</dd>\n")
        if let catalog = report.catalog { page.append("<dt>Catalog</dt><dd>spec/requirements.json, version \(catalog.version)</dd>\n") }
        if let diff {
            let parts = ["\(diff.changed.count) changed", "\(diff.added.count) new", "\(diff.removed.count) gone"]
            page.append("<dt>Since the baseline</dt><dd><a href=\"#changes\">\(parts.joined(separator: ", "))</a></dd>\n")
        }
        page.append("</dl>\n")
        matrix(into: &page)
        page.append("</div>\n")
        if !mismatches.isEmpty {
            page.append("<p class=\"baseline\">Baseline broken: ")
            page.append(mismatches.map {
                "<code>\(Self.escape($0.id))</code> expected \(Self.badge($0.expected)), got \(Self.badge($0.actual))"
            }.joined(separator: "; "))
            page.append("</p>\n")
        }
        page.append("</header>\n")
    }

    /// The run's wall-clock time, or the sum of its cases' when it was not recorded.
    private var duration: String {
        if let milliseconds = report.milliseconds { return Self.seconds(milliseconds) }
        return Self.seconds(report.results.reduce(0) { $0 + $1.milliseconds }) + " (the cases' sum)"
    }

    private func matrix(into page: inout String) {
        var layers: [String] = []
        var counts: [String: [ConformanceVerdict: Int]] = [:]
        for result in report.results {
            let layer = Self.layer(of: result.testCase.id)
            if counts[layer] == nil { layers.append(layer) }
            counts[layer, default: [:]][result.verdict, default: 0] += 1
        }
        page.append("<table class=\"matrix\" id=\"matrix\">\n<caption>Layers × verdicts</caption>\n<thead><tr><th scope=\"col\">layer</th>")
        for verdict in Self.verdictOrder { page.append("<th scope=\"col\">\(verdict.rawValue)</th>") }
        page.append("</tr></thead>\n<tbody>\n")
        for layer in layers {
            page.append("<tr><th scope=\"row\">\(Self.escape(layer))</th>")
            for verdict in Self.verdictOrder {
                let count = counts[layer]?[verdict] ?? 0
                page.append(count == 0 ? "<td></td>" : "<td class=\"\(Self.verdictClass(verdict))\">\(count)</td>")
            }
            page.append("</tr>\n")
        }
        page.append("</tbody>\n</table>\n")
    }

    private func caseArticle(_ result: ConformanceResult, index: Int, into page: inout String) {
        let verdictClass = Self.verdictClass(result.verdict)
        page.append("<article class=\"case \(verdictClass)\" id=\"case-\(index)\">\n<h3>\(Self.badge(result.verdict)) ")
        page.append("<span class=\"level\">\(result.level.rawValue)</span> <code class=\"id\">\(Self.escape(result.testCase.id))</code> ")
        page.append("<span class=\"title\">\(Self.escape(result.testCase.title))</span></h3>\n")
        rules(result.testCase.requirements, into: &page)
        page.append("<dl class=\"evidence\"><dt>Expected</dt><dd>\(Self.escape(result.expected))</dd>")
        page.append("<dt>Actual</dt><dd>\(Self.escape(result.actual))</dd></dl>\n")
        page.append("<p class=\"fix\"><strong>What to fix:</strong> \(Self.escape(whatToFix(result)))</p>\n</article>\n")
    }

    private func rules(_ ids: [String], into page: inout String) {
        guard !ids.isEmpty else { return }
        page.append("<ul class=\"rules\">\n")
        for id in ids {
            if let requirement = report.catalog?[id] {
                page.append("<li><span class=\"rule-id\">\(Self.escape(id))</span> <span class=\"level\">\(requirement.level.rawValue)</span> ")
                page.append("<q class=\"rule\">\(Self.escape(requirement.rule))</q> ")
                page.append("<span class=\"where\">spec/\(Self.escape(requirement.document)) §\(Self.escape(requirement.section))</span></li>\n")
            } else {
                page.append("<li><span class=\"rule-id\">\(Self.escape(id))</span> <span class=\"where\">not in the catalog</span></li>\n")
            }
        }
        page.append("</ul>\n")
    }

    /// What to do about a result, in words.
    func whatToFix(_ result: ConformanceResult) -> String {
        let cited = result.testCase.requirements.map { id in
            report.catalog?[id].map { "\(id) (spec/\($0.document) §\($0.section))" } ?? id
        }.joined(separator: ", ")
        switch result.verdict {
        case .fail:
            let expectedByBaseline = report.baseline.expected[result.testCase.id] == .fail
            return "change the implementation so that it gives \(result.expected), as \(cited) requires; "
                + (result.level == .must
                    ? (expectedByBaseline ? "the baseline expects this failure, so it does not fail the run." : "until then it does not conform.")
                    : "this is not a MUST, so it does not fail the run.")
        case .warn:
            return result.level == .profile
                ? "\(cited) is a limit or policy of this implementation's; yours may choose differently. Review it: expected \(result.expected)."
                : "recommended, not required: meet \(cited) (expected \(result.expected)); the run conforms without it."
        case .inconclusive:
            return "nothing to fix here yet: the case could not decide. Fix the failures before it (an earlier step it needs), or run again."
        case .unsupported:
            return "the implementation lacks what the case needs; implement \(cited) to have it graded."
        case .notApplicable:
            return "nothing: the case does not apply to this run."
        case .pass:
            return "nothing."
        }
    }

    private func passes(_ results: [ConformanceResult], into page: inout String) {
        guard !results.isEmpty else { return }
        page.append("<section id=\"passes\">\n<h2>Passes <span class=\"n\">\(results.count)</span></h2>\n")
        page.append("<details>\n<summary>Show the \(results.count) passing case\(results.count == 1 ? "" : "s")</summary>\n")
        page.append("<table class=\"passes\">\n<thead><tr><th>case</th><th>level</th><th>rules</th><th>actual</th><th>ms</th></tr></thead>\n<tbody>\n")
        for result in results {
            page.append("<tr class=\"case v-pass\"><td><code class=\"id\">\(Self.escape(result.testCase.id))</code><br>")
            page.append("<span class=\"title\">\(Self.escape(result.testCase.title))</span></td>")
            page.append("<td class=\"level\">\(result.level.rawValue)</td><td>")
            for id in result.testCase.requirements {
                let requirement = report.catalog?[id]
                page.append("<div><span class=\"rule-id\">\(Self.escape(id))</span>")
                if let requirement {
                    page.append(" <span class=\"level\">\(requirement.level.rawValue)</span> <q class=\"rule\">\(Self.escape(requirement.rule))</q>")
                }
                page.append("</div>")
            }
            page.append("</td><td>\(Self.escape(result.actual))</td><td class=\"ms\">\(result.milliseconds)</td></tr>\n")
        }
        page.append("</tbody>\n</table>\n</details>\n</section>\n")
    }

    private func changes(_ diff: ConformanceReportDiff, into page: inout String) {
        page.append("<section id=\"changes\">\n<h2>Since the baseline</h2>\n")
        if let previous {
            page.append("<p>Compared with an earlier run of <code>\(Self.escape(previous.target))</code>: \(diff.unchanged) "
                     + "case\(diff.unchanged == 1 ? "" : "s") gave the same verdict.</p>\n")
        }
        if diff.isEmpty { page.append("<p>No case changed its verdict; none is new and none is gone.</p>\n") }
        if !diff.changed.isEmpty {
            page.append("<h3>Verdict changed <span class=\"n\">\(diff.changed.count)</span></h3>\n<table class=\"diff\">\n")
            page.append("<thead><tr><th>case</th><th>level</th><th>before</th><th>now</th></tr></thead>\n<tbody>\n")
            for change in diff.changed {
                page.append("<tr class=\"\(change.isRegression ? "worse" : "better")\"><td><code class=\"id\">\(Self.escape(change.id))</code> ")
                page.append("<span class=\"title\">\(Self.escape(change.title))</span></td><td class=\"level\">\(change.level.rawValue)</td>")
                page.append("<td>\(Self.badge(change.before))</td><td>\(Self.badge(change.after)) \(change.isRegression ? "worse" : "better")</td></tr>\n")
            }
            page.append("</tbody>\n</table>\n")
        }
        if !diff.added.isEmpty {
            page.append("<h3>New cases <span class=\"n\">\(diff.added.count)</span></h3>\n<ul class=\"diff\">\n")
            for result in diff.added {
                page.append("<li>\(Self.badge(result.verdict)) <code class=\"id\">\(Self.escape(result.testCase.id))</code> "
                         + "<span class=\"title\">\(Self.escape(result.testCase.title))</span></li>\n")
            }
            page.append("</ul>\n")
        }
        if !diff.removed.isEmpty {
            page.append("<h3>Gone cases <span class=\"n\">\(diff.removed.count)</span></h3>\n<ul class=\"diff\">\n")
            for result in diff.removed {
                page.append("<li>was \(Self.badge(result.verdict)) <code class=\"id\">\(Self.escape(result.id))</code> "
                         + "<span class=\"title\">\(Self.escape(result.title))</span></li>\n")
            }
            page.append("</ul>\n")
            if report.interrupted { page.append("<p>This run was interrupted: the cases it had not reached show as gone.</p>\n") }
        }
        page.append("</section>\n")
    }

    // MARK: - Text

    /// `text` for HTML element content or a quoted attribute value: `&`, `<`, `>`, `"` and `'` as
    /// character references; control characters other than newline and tab, and the bidirectional
    /// controls (which would reorder what is shown), written visibly as `\u{X}`.
    public static func escape(_ text: String) -> String {
        var out = ""
        out.reserveCapacity(text.utf8.count)
        for scalar in text.unicodeScalars {
            switch scalar {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&#39;"
            case "\n", "\t": out.unicodeScalars.append(scalar)
            default:
                if scalar.properties.generalCategory == .control || isBidirectionalControl(scalar) {
                    out += "\\u{\(String(scalar.value, radix: 16, uppercase: true))}"
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        return out
    }

    /// The embeddings, overrides and isolates (U+202A-202E, U+2066-2069) and the marks (U+200E, U+200F,
    /// U+061C).
    static func isBidirectionalControl(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x202A...0x202E, 0x2066...0x2069, 0x200E, 0x200F, 0x061C: true
        default: false
        }
    }

    static func verdictClass(_ verdict: ConformanceVerdict) -> String {
        switch verdict {
        case .pass: "v-pass"
        case .fail: "v-fail"
        case .warn: "v-warn"
        case .notApplicable: "v-na"
        case .unsupported: "v-unsupported"
        case .inconclusive: "v-inconclusive"
        }
    }

    static func badge(_ verdict: ConformanceVerdict) -> String {
        "<span class=\"verdict \(verdictClass(verdict))\">\(escape(verdict.rawValue))</span>"
    }

    static func seconds(_ milliseconds: Int) -> String {
        milliseconds < 1000 ? "\(milliseconds) ms" : String(format: "%.1f s", Double(milliseconds) / 1000)
    }

    static let style = """
        :root { --fail: #b3261e; --fail-bg: #fdecea; --warn: #8a5300; --warn-bg: #fff4d6; --inc: #5b3f8c; --inc-bg: #efe8fa;
                --uns: #3d5a80; --uns-bg: #e6eef8; --na: #5f6368; --na-bg: #f1f3f4; --pass: #1e7d32; --pass-bg: #e6f4ea; }
        body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; color: #1f1f1f; margin: 0 auto;
               max-width: 1200px; padding: 12px 20px 40px; }
        code, .id { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 0.92em; }
        h1 { font-size: 1.5em; margin: 0 0 4px; }
        h2 { font-size: 1.2em; margin: 22px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 2px; }
        h3 { font-size: 1em; margin: 0 0 6px; }
        .n { color: #666; font-weight: normal; }
        .outcome.bad { color: var(--fail); } .outcome.ok { color: var(--pass); }
        .mode { color: #555; font-weight: normal; font-size: 0.7em; }
        .why { margin: 0 0 8px; color: var(--fail); font-weight: 600; }
        .top { display: flex; flex-wrap: wrap; gap: 12px 32px; align-items: flex-start; }
        dl.summary { display: grid; grid-template-columns: max-content minmax(0, 1fr); gap: 2px 12px; margin: 0; flex: 1 1 480px; min-width: 0; }
        dl.summary dt { color: #555; } dl.summary dd { margin: 0; overflow-wrap: anywhere; }
        .badge, .verdict { display: inline-block; padding: 0 6px; border-radius: 4px; font-size: 0.85em; font-weight: 600; white-space: nowrap; }
        .badge.zero { opacity: 0.45; font-weight: normal; }
        .v-fail.badge, .verdict.v-fail, td.v-fail { color: var(--fail); background: var(--fail-bg); }
        .v-warn.badge, .verdict.v-warn, td.v-warn { color: var(--warn); background: var(--warn-bg); }
        .v-inconclusive.badge, .verdict.v-inconclusive, td.v-inconclusive { color: var(--inc); background: var(--inc-bg); }
        .v-unsupported.badge, .verdict.v-unsupported, td.v-unsupported { color: var(--uns); background: var(--uns-bg); }
        .v-na.badge, .verdict.v-na, td.v-na { color: var(--na); background: var(--na-bg); }
        .v-pass.badge, .verdict.v-pass, td.v-pass { color: var(--pass); background: var(--pass-bg); }
        table { border-collapse: collapse; }
        table.matrix { font-size: 0.88em; flex: 0 0 auto; }
        table.matrix caption { text-align: left; color: #555; }
        table.matrix th, table.matrix td { border: 1px solid #ddd; padding: 1px 8px; text-align: center; }
        table.matrix th[scope=row] { text-align: left; font-weight: normal; }
        table.matrix td { min-width: 2.2em; font-weight: 600; }
        .baseline { color: var(--fail); }
        article.case { border: 1px solid #ddd; border-left: 6px solid var(--na); border-radius: 4px; padding: 8px 12px; margin: 0 0 10px; }
        article.v-fail { border-left-color: var(--fail); } article.v-warn { border-left-color: var(--warn); }
        article.v-inconclusive { border-left-color: var(--inc); } article.v-unsupported { border-left-color: var(--uns); }
        .level { font-size: 0.8em; font-weight: 600; color: #444; border: 1px solid #bbb; border-radius: 3px; padding: 0 4px; }
        .title { color: #333; }
        ul.rules { margin: 4px 0; padding-left: 18px; }
        .rule-id { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-weight: 600; }
        q.rule { quotes: "“" "”"; } .where { color: #666; font-size: 0.9em; }
        dl.evidence { display: grid; grid-template-columns: max-content minmax(0, 1fr); gap: 2px 10px; margin: 4px 0; }
        dl.evidence dt { color: #555; } dl.evidence dd { margin: 0; white-space: pre-wrap; overflow-wrap: anywhere;
            font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 0.9em; }
        .fix { margin: 4px 0 0; }
        details summary { cursor: pointer; color: #333; }
        table.passes, table.diff { width: 100%; font-size: 0.9em; }
        table.passes th, table.passes td, table.diff th, table.diff td { border-bottom: 1px solid #eee; padding: 3px 6px;
            text-align: left; vertical-align: top; overflow-wrap: anywhere; }
        td.ms { text-align: right; color: #666; }
        tr.worse td:last-child { color: var(--fail); } tr.better td:last-child { color: var(--pass); }
        ul.diff { padding-left: 18px; }
        footer { margin-top: 28px; color: #666; font-size: 0.85em; }
        @media print { details { display: block; } }

        """
}
