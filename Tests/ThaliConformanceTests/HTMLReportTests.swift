import Foundation
import Testing
import ThaliMutants
import ThaliTestSupport

@testable import ThaliConformance

/// The HTML report (`--html-out`): escaping of everything the implementation under test said, the order a
/// person reads it in, the comparison with an earlier run, and the page as headless Chromium shows it.
@Suite("Conformance HTML report")
struct HTMLReportTests {
    static let hostile = "<script>document.title='owned'</script><img src=x onerror=alert(1)>\" onmouseover=\"x"

    /// A run with one result of every verdict, whose evidence, target, titles and notes are hostile.
    static func hostileReport() throws -> ConformanceReport {
        let catalog = try RequirementCatalog(version: 3, requirements: [
            Requirement(id: "T-1.1", level: .must, layer: "t", document: "t.md", section: "1", rule: "a <b>must</b> rule & more"),
            Requirement(id: "T-1.2", level: .should, layer: "t", document: "t.md", section: "1", rule: "a should rule"),
        ])
        let run = ConformanceRun(target: "peer \(hostile)", catalog: catalog)
        run.grade(ConformanceCase("peer/t/pass", "passes \(hostile)", ["T-1.1"]), holds: true, expected: "x", actual: "fine")
        run.grade(ConformanceCase("peer/t/must", "the must", ["T-1.1"]), holds: false, expected: "x",
                  actual: "it said \(hostile)\u{1}\u{202E}gpj.exe")
        run.grade(ConformanceCase("peer/t/should", "the should", ["T-1.2"]), holds: false, expected: hostile, actual: "y")
        run.record(ConformanceCase("peer/u/na", "n/a", ["T-9.9"]), .notApplicable, expected: "x", actual: "no adapter")
        run.record(ConformanceCase("peer/u/inconclusive", "inconclusive", ["T-1.1"]), .inconclusive, expected: "x", actual: "earlier step")
        run.note("note \(hostile)")
        return run.report
    }

    @Test("every string from the implementation renders as text: no element, attribute or control character gets through")
    func escapesEverything() throws {
        let page = HTMLReport(try Self.hostileReport()).html
        #expect(!page.lowercased().contains("<script"), "a script element")
        #expect(!page.lowercased().contains("<img"), "an img element")
        #expect(!page.contains("\" onmouseover"), "an attribute broke out of its quotes")
        #expect(page.contains("&lt;script&gt;document.title=&#39;owned&#39;&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;&quot; onmouseover=&quot;x"))
        #expect(page.contains("a &lt;b&gt;must&lt;/b&gt; rule &amp; more"), "the rule's text is escaped too")
        #expect(page.contains("\\u{1}\\u{202E}gpj.exe"), "control and bidirectional characters are shown, not obeyed")
        #expect(!page.unicodeScalars.contains { $0.value == 1 || $0.value == 0x202E })
        // Nothing is fetched, nothing runs: no link out, and the policy forbids both.
        #expect(page.contains("default-src 'none'; style-src 'unsafe-inline'"))
        #expect(!page.contains("http://") && !page.contains("https://"))
        #expect(HTMLReport.escape("a<b>&\"c'") == "a&lt;b&gt;&amp;&quot;c&#39;")
    }

    @Test("failures come first with their rules quoted, then warnings, inconclusive, N/A; passes last, collapsed")
    func readingOrder() throws {
        let report = try Self.hostileReport()
        let page = HTMLReport(report).html
        let order = ["id=\"failures\"", "peer/t/must", "T-1.1", "a &lt;b&gt;must", "id=\"warnings\"",
                     "id=\"inconclusive\"", "id=\"not-applicable\"", "id=\"passes\"", "<details>", "peer/t/pass"]
            .map { page.range(of: $0)?.lowerBound }
        #expect(!order.contains(nil), "\(order)")
        #expect(order.compactMap { $0 } == order.compactMap { $0 }.sorted(), "out of order")
        #expect(HTMLReport(report).orderedResults.map(\.verdict) == [.fail, .warn, .inconclusive, .notApplicable, .pass])
        // The summary: mode, counts per verdict, duration, and the matrix of layers × verdicts.
        #expect(page.contains("<span class=\"outcome bad\">Does not conform</span>"))
        #expect(page.contains("1 FAIL</span>") && page.contains("1 WARN</span>") && page.contains("0 UNSUPPORTED</span>"))
        #expect(page.contains("<dt>Duration</dt>"))
        #expect(page.contains("<tr><th scope=\"row\">t</th><td class=\"v-fail\">1</td><td class=\"v-warn\">1</td><td></td><td></td><td></td><td class=\"v-pass\">1</td></tr>"))
        #expect(page.contains("<tr><th scope=\"row\">u</th><td></td><td></td><td class=\"v-inconclusive\">1</td><td></td><td class=\"v-na\">1</td><td></td></tr>"))
        #expect(page.contains("T-9.9</span> <span class=\"where\">not in the catalog"))
        #expect(page.contains("What to fix:</strong> change the implementation so that it gives x, as T-1.1 (spec/t.md §1) requires"))
    }

    @Test("compared with an earlier run's JSON: changed verdicts, new and gone cases; its FAILs are the expected failures")
    func baselineDiff() throws {
        let catalog = try RequirementCatalog(version: 1, requirements: [
            Requirement(id: "T-1.1", level: .must, layer: "t", document: "t.md", section: "1", rule: "a rule"),
        ])
        let cases = (1...5).map { ConformanceCase("peer/t/c\($0)", "case \($0)", ["T-1.1"]) }
        let before = ConformanceRun(target: "peer 02ab", catalog: catalog)
        before.grade(cases[0], holds: true, expected: "x", actual: "y")  // stays PASS
        before.grade(cases[1], holds: true, expected: "x", actual: "y")  // PASS → FAIL
        before.grade(cases[2], holds: false, expected: "x", actual: "y")  // FAIL → PASS
        before.grade(cases[3], holds: true, expected: "x", actual: "y")  // gone
        let baseline = try ConformanceBaseline(json: Data(before.report.json().utf8))
        let previous = try #require(baseline.previous)
        #expect(previous.mode == "peer" && previous.results.count == 4)
        #expect(baseline.expected == ["peer/t/c3": .fail], "the earlier FAILs are expected")

        let after = ConformanceRun(target: "peer 02ab", catalog: catalog, baseline: baseline)
        after.grade(cases[0], holds: true, expected: "x", actual: "y")
        after.grade(cases[1], holds: false, expected: "x", actual: "y")
        after.grade(cases[2], holds: true, expected: "x", actual: "y")
        after.record(cases[4], .notApplicable, expected: "x", actual: "y")  // new
        let report = after.report
        let diff = ConformanceReportDiff(from: previous, to: report)
        #expect(diff.changed.map(\.id) == ["peer/t/c2", "peer/t/c3"])
        #expect(diff.changed.map(\.isRegression) == [true, false])
        #expect(diff.changed.first?.before == .pass && diff.changed.first?.after == .fail)
        #expect(diff.added.map(\.testCase.id) == ["peer/t/c5"])
        #expect(diff.removed.map(\.id) == ["peer/t/c4"])
        #expect(diff.unchanged == 1 && !diff.isEmpty)
        #expect(ConformanceReportDiff(from: RecordedConformanceReport(report), to: report).isEmpty)
        // The fixed failure breaks the baseline, as an expected failure that passes always did.
        #expect(report.baselineMismatches.map(\.id) == ["peer/t/c3"] && !report.succeeded)

        let page = HTMLReport(report, previous: previous).html
        #expect(page.contains("<a href=\"#changes\">2 changed, 1 new, 1 gone</a>"))
        let changes = try #require(page.range(of: "<section id=\"changes\">").map { page[$0.lowerBound...] })
        #expect(changes.contains("<tr class=\"worse\"><td><code class=\"id\">peer/t/c2</code>"))
        #expect(changes.contains("<tr class=\"better\"><td><code class=\"id\">peer/t/c3</code>"))
        #expect(changes.contains("<h3>New cases <span class=\"n\">1</span></h3>") && changes.contains("peer/t/c5"))
        #expect(changes.contains("<h3>Gone cases <span class=\"n\">1</span></h3>") && changes.contains("peer/t/c4"))
        #expect(page.contains("Baseline broken: <code>peer/t/c3</code>"))
        // Without an earlier run there is no comparison.
        #expect(!HTMLReport(report).html.contains("id=\"changes\""))
    }

    @Test("an earlier report of format 1 reads too; a file that is neither a report nor a baseline does not")
    func recordedFormats() throws {
        let first = #"{"format":"thali-conformance-report/1","catalogVersion":1,"target":"vectors yamux: x","interrupted":false,"#
            + #""succeeded":true,"counts":{},"results":[{"id":"vectors/yamux/Y-1","title":"t","requirements":["MUX-2.1"],"#
            + #""level":"MUST","verdict":"FAIL","expected":"a","actual":"b","milliseconds":0}],"notes":[],"baselineMismatches":[]}"#
        let recorded = try RecordedConformanceReport(json: Data(first.utf8))
        #expect(recorded.mode == "vectors" && recorded.result("vectors/yamux/Y-1")?.verdict == .fail)
        #expect(throws: RequirementCatalogError.self) {
            try RecordedConformanceReport(json: Data(first.replacingOccurrences(of: "\"FAIL\"", with: "\"MAYBE\"").utf8))
        }
        #expect(throws: RequirementCatalogError.self) {
            try ConformanceBaseline(json: Data(#"{"format":"thali-conformance-report/2","target":"x"}"#.utf8))
        }
    }
}

/// The page of a real run, as a person sees it in headless Chromium.
@Suite("Conformance HTML report in a browser", .serialized,
       .enabled(if: TestEnvironment.available(PackagePaths.thaliNode() != nil && ChildProcess.which("chromium") != nil)))
struct HTMLReportBrowserTests {
    static func chromiumPath() -> String? { ChildProcess.which("chromium") }

    /// Headless Chromium at 1280×900 on `page` with `arguments` (`--dump-dom`, `--screenshot=...`), in a
    /// profile of its own, bounded by `timeout` (which ends Chromium's whole process group); returns its
    /// standard output.
    static func chromium(_ arguments: [String], page: String, scratch: String) async throws -> String {
        let profile = scratch + "/profile-\(UUID().uuidString)"
        let errors = scratch + "/chromium-errors.txt"
        let sandbox = geteuid() == 0 ? ["--no-sandbox"] : []
        let browser = try ChildProcess("timeout", ["-k", "5", "60", try #require(chromiumPath()), "--headless", "--disable-gpu"] + sandbox + [
            "--user-data-dir=\(profile)", "--window-size=1280,900", "--hide-scrollbars", "--no-first-run", "--disable-extensions",
        ] + arguments + ["file://\(page)"], standardErrorPath: errors)
        defer {
            _ = browser.terminate()
            try? FileManager.default.removeItem(atPath: profile)
        }
        let status = try await browser.waitForExit(timeout: .seconds(90))
        let log = (try? String(contentsOfFile: errors, encoding: .utf8)) ?? ""
        #expect(status == 0, "chromium \(arguments): \(status)\n\(log.suffix(2000))")
        return browser.output
    }

    /// Width and height from a PNG's IHDR.
    static func pngSize(_ data: Data) -> (Int, Int)? {
        let bytes = [UInt8](data.prefix(24))
        guard bytes.count == 24, bytes.prefix(8) == [0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A] else { return nil }
        func int(_ at: Int) -> Int { bytes[at..<at + 4].reduce(0) { $0 << 8 | Int($1) } }
        return (int(16), int(20))
    }

    @Test("a mutant's vectors: the failing case and its rule are on the first screen, before any pass; hostile text stays text")
    func mutantRunInChromium() async throws {
        let node = try #require(PackagePaths.thaliNode())
        let scratch = try PeerModeTests.scratchDirectory("html")
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let vectors = PackagePaths.root() + "/spec/vectors/frames-delivery.json"

        // The clean answers, graded: the earlier run.
        let clean = try ChildProcess(node, ["conformance", "vectors", "answer", vectors], standardErrorPath: scratch + "/answer-errors.txt")
        #expect(try await clean.waitForExit(timeout: .seconds(60)) == 0)
        try? await clean.waitForOutput(containing: "\n}", timeout: .seconds(2))
        try Data(clean.output.utf8).write(to: URL(fileURLWithPath: scratch + "/clean-answers.json"))
        let first = try ChildProcess(node, ["conformance", "vectors", "check", vectors, "--answers", scratch + "/clean-answers.json",
                                            "--json-out", scratch + "/clean.json"])
        #expect(try await first.waitForExit(timeout: .seconds(60)) == 0, "\(first.output)")

        // A mutant's answers, under a name that tries to be markup.
        let mutant = "delivery-ignores-trailing-bytes"
        let answer = try ChildProcess(node, ["conformance", "vectors", "answer", vectors], environment: [Mutant.environmentVariable: mutant],
                                      standardErrorPath: scratch + "/answer-errors.txt")
        #expect(try await answer.waitForExit(timeout: .seconds(60)) == 0)
        try? await answer.waitForOutput(containing: "\n}", timeout: .seconds(2))
        var answers = try #require(try JSONSerialization.jsonObject(with: Data(answer.output.utf8)) as? [String: Any])
        answers["implementation"] = "mutant \(HTMLReportTests.hostile)"
        try JSONSerialization.data(withJSONObject: answers).write(to: URL(fileURLWithPath: scratch + "/answers.json"))
        let html = scratch + "/report.html"
        let check = try ChildProcess(node, ["conformance", "vectors", "check", vectors, "--answers", scratch + "/answers.json",
                                            "--baseline", scratch + "/clean.json", "--html-out", html])
        #expect(try await check.waitForExit(timeout: .seconds(60)) == 1, "a MUST fails: \(check.output)")
        let page = try String(contentsOfFile: html, encoding: .utf8)
        #expect(page.contains("<a href=\"#changes\">3 changed, 0 new, 0 gone</a>"), "the three caught vectors changed since the clean run")

        // What the browser lays out: a copy of the page with a script that measures it (the page itself
        // runs none, and its policy would forbid this one).
        let probe = page.replacingOccurrences(of: #"<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">"#,
                                              with: "")
            .replacingOccurrences(of: "</body>", with: """
                <script>
                const pageTop = e => e ? e.getBoundingClientRect().top + window.scrollY : -1;
                const fail = document.querySelector('article.case.v-fail');
                const rule = fail && fail.querySelector('q.rule');
                const pass = document.querySelector('.case.v-pass');
                document.body.setAttribute('data-layout', JSON.stringify({
                  screen: window.innerHeight, width: window.innerWidth,
                  failTop: pageTop(fail), ruleBottom: rule ? rule.getBoundingClientRect().bottom + window.scrollY : -1,
                  ruleText: rule ? rule.textContent : '', failID: fail ? fail.querySelector('code.id').textContent : '',
                  failBeforePass: !!(fail && pass && (fail.compareDocumentPosition(pass) & Node.DOCUMENT_POSITION_FOLLOWING)),
                  passShown: pass ? (pass.checkVisibility ? pass.checkVisibility() : pass.getClientRects().length > 0) : null,
                  passesSummaryTop: pageTop(document.querySelector('#passes summary')),
                  scripts: document.querySelectorAll('script').length, images: document.querySelectorAll('img').length,
                  title: document.title, implementation: document.querySelector('dl.summary code').textContent }));
                </script>
                </body>
                """)
        let probePath = scratch + "/probe.html"
        try probe.write(toFile: probePath, atomically: true, encoding: .utf8)
        let dom = try await Self.chromium(["--dump-dom"], page: probePath, scratch: scratch)
        let match = dom.firstMatch(of: /data-layout="([^"]*)"/)
        #expect(match != nil, "no layout in:\n\(dom.prefix(3000))")
        let json = String(try #require(match?.output.1)).replacingOccurrences(of: "&quot;", with: "\"").replacingOccurrences(of: "&amp;", with: "&")
            .replacingOccurrences(of: "&lt;", with: "<").replacingOccurrences(of: "&gt;", with: ">")
        let layout = try #require(try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any], "\(json)")
        func number(_ key: String) -> Double? { (layout[key] as? NSNumber)?.doubleValue }
        // The viewport is the window less what headless Chromium keeps for itself (757 of 900 pixels high
        // when dumping the DOM): the first screen is measured, not assumed.
        let screen = try #require(number("screen"))
        #expect(screen > 600 && number("width") == 1280, "\(layout)")
        let failTop = try #require(number("failTop")), ruleBottom = try #require(number("ruleBottom"))
        #expect(failTop > 0 && ruleBottom > failTop && ruleBottom <= screen, "the failing case and its rule within the first screen: \(layout)")
        #expect((layout["failID"] as? String)?.hasPrefix("vectors/delivery/D-") == true, "\(layout)")
        #expect((layout["ruleText"] as? String)?.isEmpty == false, "\(layout)")
        #expect(layout["failBeforePass"] as? Bool == true, "\(layout)")
        #expect(layout["passShown"] as? Bool == false, "passes are collapsed: \(layout)")
        #expect(number("passesSummaryTop") ?? 0 > ruleBottom, "\(layout)")
        // The implementation's name is shown as it is, and made nothing: the probe is the one script.
        #expect(number("scripts") == 1 && number("images") == 0, "\(layout)")
        #expect((layout["title"] as? String)?.hasPrefix("Thali conformance: vectors") == true, "\(layout)")
        #expect((layout["implementation"] as? String)?.contains("<script>document.title='owned'</script>") == true, "\(layout)")

        // The page itself, as a person sees its first screen.
        let screenshot = scratch + "/report.png"
        _ = try await Self.chromium(["--screenshot=\(screenshot)"], page: html, scratch: scratch)
        let png = try Data(contentsOf: URL(fileURLWithPath: screenshot))
        if let keep = ProcessInfo.processInfo.environment["THALI_KEEP_REPORT_SCREENSHOT"] { try png.write(to: URL(fileURLWithPath: keep)) }
        #expect(Self.pngSize(png).map { [$0.0, $0.1] } == [1280, 900])
        #expect(png.count > 20_000, "a first screen with text on it, not a blank page: \(png.count) bytes")
    }
}
