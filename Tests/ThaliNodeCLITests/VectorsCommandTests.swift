import Foundation
import Testing
import ThaliTestSupport

@testable import ThaliConformance

/// `thali-node conformance vectors` as an implementer runs it: a separate process, its output and status.
@Suite("thali-node conformance vectors", .serialized, .enabled(if: TestEnvironment.available(PackagePaths.thaliNode() != nil)))
struct VectorsCommandTests {
    func run(_ arguments: [String]) async throws -> (status: Int32, output: String) {
        let process = try ChildProcess(try #require(PackagePaths.thaliNode()), ["conformance", "vectors"] + arguments)
        let status = try await process.waitForExit(timeout: .seconds(60))
        try? await process.waitForOutput(containing: status == 0 ? "conform" : "\n", timeout: .seconds(2))
        return (status, process.output)
    }

    @Test("emit writes the committed sets; check grades this implementation's answers and another's from a file")
    func emitAnswerCheck() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("vectors-cli-\(UUID())").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var (status, output) = try await run(["emit", directory])
        #expect(status == 0, "\(output)")
        for layer in FrameVectorLayer.allCases {
            let written = try Data(contentsOf: URL(fileURLWithPath: directory + "/" + layer.fileName))
            #expect(written == FrameVectorSets.set(layer).json())
        }
        let vectors = directory + "/" + FrameVectorLayer.yamux.fileName
        (status, output) = try await run(["check", vectors])
        #expect(status == 0, "\(output)")
        #expect(output.contains("PASS         MUST    vectors/yamux/Y-version-1"))
        #expect(output.contains("conforms"))

        // An implementation that accepts yamux version 1: its answers file, graded, fails the MUST.
        var answers = FrameVectorReference.answers(to: FrameVectorSets.yamux)
        let index = try #require(answers.answers.firstIndex { $0.id == "Y-version-1" })
        answers.answers[index] = FrameVectorAnswer(id: "Y-version-1", result: .valid,
                                                   frames: [["type": "ping", "flags": "1", "stream_id": "0", "length": "7"]])
        answers.implementation = "lenient\u{1b}[2J"
        let answersPath = directory + "/answers.json"
        try JSONEncoder().encode(answers).write(to: URL(fileURLWithPath: answersPath))
        (status, output) = try await run(["check", vectors, "--answers", answersPath, "--junit-out", directory + "/junit.xml"])
        #expect(status == 1)
        #expect(output.contains("FAIL         MUST    vectors/yamux/Y-version-1"))
        #expect(output.contains("[MUX-2.1]"))
        #expect(!output.contains("\u{1b}"), "the answers' text reaches the terminal escaped")
        let junit = try String(contentsOfFile: directory + "/junit.xml", encoding: .utf8)
        #expect(junit.contains("<failure"))

        (status, output) = try await run(["answer", vectors, "--split", "3"])
        #expect(status == 0)
        let printed = try JSONDecoder().decode(FrameVectorAnswers.self, from: Data(output.utf8))
        #expect(printed == FrameVectorReference.answers(to: FrameVectorSets.yamux, split: 3))
    }

    @Test("--html-out writes the page, compared with an earlier --json-out; an unwritable path exits 74; another mode's report as baseline exits 64")
    func htmlOut() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("vectors-html-\(UUID())").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let vectors = PackagePaths.root() + "/spec/vectors/" + FrameVectorLayer.yamux.fileName
        var (status, output) = try await run(["check", vectors, "--json-out", directory + "/first.json", "--html-out", directory + "/first.html"])
        #expect(status == 0, "\(output)")
        let first = try String(contentsOfFile: directory + "/first.html", encoding: .utf8)
        #expect(first.hasPrefix("<!DOCTYPE html>") && first.contains("<span class=\"outcome ok\">Conforms</span>"))
        #expect(!first.contains("id=\"changes\""), "no baseline, no comparison")

        (status, output) = try await run(["check", vectors, "--baseline", directory + "/first.json", "--html-out", directory + "/second.html"])
        #expect(status == 0, "\(output)")
        let second = try String(contentsOfFile: directory + "/second.html", encoding: .utf8)
        #expect(second.contains("<a href=\"#changes\">0 changed, 0 new, 0 gone</a>"))

        (status, output) = try await run(["check", vectors, "--html-out", directory + "/no/such/dir/report.html"])
        #expect(status == 74, "\(output)")
        #expect(output.contains("cannot write the report to \(directory)/no/such/dir/report.html"), "\(output)")

        let peerReport = #"{"format":"thali-conformance-report/2","target":"peer 02ab","results":[]}"#
        try Data(peerReport.utf8).write(to: URL(fileURLWithPath: directory + "/peer.json"))
        (status, output) = try await run(["check", vectors, "--baseline", directory + "/peer.json", "--html-out", directory + "/third.html"])
        #expect(status == 64, "\(output)")
        #expect(output.contains("is a report of peer mode, not of vectors mode"), "\(output)")
        #expect(!FileManager.default.fileExists(atPath: directory + "/third.html"))
    }
}
