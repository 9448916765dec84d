import ArgumentParser
import ThaliBeacons

/// `thali-node conformance beacons FILE...`: checks vector files in the `thali-beacon-vectors/1`
/// format against this implementation.
struct ConformanceBeacons: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "beacons",
        abstract: "Check notification-beacon vectors (format thali-beacon-vectors/1).",
        discussion: """
            For every case: the generated stream byte for byte, each beacon's PSK identity and secret, \
            and every parse outcome. Prints one line per difference (file, case, field, expected, got) \
            and a last line "N passed, M failed"; exits non-zero if anything failed. A file that cannot \
            be read or decoded counts as one failure.
            """)

    @Argument(help: "Vector files to check.")
    var files: [String]
    @Flag(help: "Print one JSON object (passed, failed, differences) instead of lines.") var json = false

    struct Output: Encodable {
        struct Difference: Encodable {
            let file, caseId, field, expected, got: String
        }
        let passed: Int
        let failed: Int
        let differences: [Difference]
    }

    func validate() throws {
        guard !files.isEmpty else { throw ValidationError("give at least one vector file") }
    }

    func run() throws {
        var report = BeaconConformance.Report()
        for file in files { report.merge(BeaconConformance.check(contentsOf: file)) }
        if json {
            try printJSON(Output(passed: report.passed, failed: report.failed, differences: report.differences.map {
                Output.Difference(file: $0.file, caseId: $0.caseId, field: $0.field, expected: $0.expected, got: $0.got)
            }))
        } else {
            for difference in report.differences { print(TerminalText.escaped(difference.description)) }
            print("\(report.passed) passed, \(report.failed) failed")
        }
        if report.failed > 0 { throw ExitCode.failure }
    }
}
