import ArgumentParser
import Foundation
import ThaliConformance

/// `thali-node conformance vectors`: the frame vector sets (format `thali-frame-vectors/1`), this
/// implementation's answers to them, and the grading of anyone's answers.
struct ConformanceVectors: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "vectors",
        abstract: "Frame vectors (delivery, yamux, thali-multiplex): write them, answer them, grade answers.",
        discussion: """
            An implementation under test reads each case's bytes with its own decoder and writes what it \
            concluded (format thali-frame-answers/1, spec/vectors/README.md); `check --answers` grades that \
            file case by case against the requirement catalog. `answer` prints this implementation's own \
            answers, an example of the format.
            """,
        subcommands: [Emit.self, Answer.self, Check.self])

    /// `vectors emit DIR`: writes every set as `spec/vectors/` publishes it.
    struct Emit: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Write the frame vector sets (frames-<layer>.json) into a directory.")

        @Argument(help: "Directory to write into (created if missing).")
        var directory: String

        func run() throws {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            for set in FrameVectorSets.all {
                let path = URL(fileURLWithPath: directory).appendingPathComponent(set.layer.fileName)
                try set.json().write(to: path)
                print("\(path.path): \(set.cases.count) cases")
            }
        }
    }

    /// `vectors answer FILE`: this implementation's answers.
    struct Answer: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print this implementation's answers to a vector set (format thali-frame-answers/1).")

        @Argument(help: "A vector set (thali-frame-vectors/1).")
        var vectors: String

        @Option(help: "Feed the decoder this many bytes at a time.")
        var split = 1

        func validate() throws {
            guard split >= 1 else { throw ValidationError("--split must be at least 1") }
        }

        func run() throws {
            let set = try FrameVectorSet.load(from: vectors)
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
            let answers = FrameVectorReference.answers(to: set, split: split)
            print(String(decoding: try encoder.encode(answers), as: UTF8.self))
        }
    }

    /// `vectors check FILE [--answers FILE]`: grades answers.
    struct Check: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Grade answers to a vector set (default: this implementation's own).",
            discussion: """
                Prints each case as it is graded (VERDICT LEVEL id: actual), then a table with the rule quoted \
                for every FAIL and WARN; exits non-zero only when a MUST fails or --baseline does not hold. A \
                case without an answer is INCONCLUSIVE.
                """)

        @Argument(help: "A vector set (thali-frame-vectors/1).")
        var vectors: String

        @Option(help: "The implementation's answers (thali-frame-answers/1); default: this implementation's.")
        var answers: String?

        @OptionGroup var report: ReportOptions

        func run() throws {
            let set = try FrameVectorSet.load(from: vectors)
            let given = try answers.map { path throws(FrameVectorError) in try FrameVectorAnswers.load(from: path) }
            let graded = given ?? FrameVectorReference.answers(to: set)
            let json = report.json
            let target = "vectors \(set.layer.rawValue): \(graded.implementation)"
            let baseline = try report.loadBaseline(for: target)
            let run = ConformanceRun(target: target, catalog: try report.loadCatalog(), baseline: baseline) { result in
                let line = TerminalText.escaped(ConformanceReport.progressLine(result))
                if json { StandardStream.error.write(line + "\n") } else { print(line) }
            }
            FrameVectorGrading.grade(graded, against: set, in: run)
            let result = run.report
            try report.outputs(baseline: baseline).write(result)
            if !result.succeeded { throw ExitCode.failure }
        }
    }
}
