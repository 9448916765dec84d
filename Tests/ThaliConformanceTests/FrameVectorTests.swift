import Foundation
import Testing
import ThaliBeacons
import ThaliSupport
import ThaliTestSupport

@testable import ThaliConformance

/// The frame vector sets of `spec/vectors/`: published as generated, graded right for this implementation
/// however its decoders are fed, and graded wrong for answers that break a rule.
@Suite("Frame vectors")
struct FrameVectorTests {
    static let vectorDirectory = PackagePaths.root() + "/spec/vectors"

    static func grade(_ answers: FrameVectorAnswers, _ set: FrameVectorSet) throws -> ConformanceReport {
        let run = ConformanceRun(target: "test", catalog: try RequirementCatalog.load(from: RequirementCatalog.defaultPath))
        FrameVectorGrading.grade(answers, against: set, in: run)
        return run.report
    }

    static func answers(_ set: FrameVectorSet, changing id: String, _ change: (inout FrameVectorAnswer) -> Void) -> FrameVectorAnswers {
        var answers = FrameVectorReference.answers(to: set)
        if let index = answers.answers.firstIndex(where: { $0.id == id }) { change(&answers.answers[index]) }
        return answers
    }

    @Test("the committed files are what the sets generate", arguments: FrameVectorLayer.allCases)
    func committedFilesAreCurrent(layer: FrameVectorLayer) throws {
        let path = Self.vectorDirectory + "/" + layer.fileName
        let committed = try Data(contentsOf: URL(fileURLWithPath: path))
        #expect(committed == FrameVectorSets.set(layer).json(),
                "\(path) differs from FrameVectorSets: run `thali-node conformance vectors emit spec/vectors`")
        #expect(try FrameVectorSet.load(from: path) == FrameVectorSets.set(layer))
    }

    @Test("each set has unique ids, every kind of expectation, frames where they are due, and only catalog ids",
          arguments: FrameVectorLayer.allCases)
    func setsAreWellFormed(layer: FrameVectorLayer) throws {
        let set = FrameVectorSets.set(layer)
        let catalog = try RequirementCatalog.load(from: RequirementCatalog.defaultPath)
        #expect(Set(set.cases.map(\.id)).count == set.cases.count)
        for outcome in [FrameVectorOutcome.valid, .invalid] + (layer.isStream ? [.incomplete] : []) {
            #expect(set.cases.contains { $0.expect == outcome }, "\(layer) has no \(outcome) case")
        }
        // A message that arrives whole is never waited on.
        #expect(layer.isStream || !set.cases.contains { $0.expect == .incomplete })
        for vector in set.cases {
            #expect(Hex.decode(vector.bytes) != nil && !vector.bytes.isEmpty, "\(vector.id)")
            #expect((vector.frames == nil) == (vector.expect == .invalid), "\(vector.id): frames are listed for every outcome but invalid")
            #expect((vector.error != nil) == (vector.expect == .invalid), "\(vector.id)")
            #expect(!vector.requirements.isEmpty && vector.requirements.allSatisfy { catalog[$0] != nil }, "\(vector.id)")
        }
    }

    @Test("this implementation passes every case, its decoders fed 1, 2, 3, 5 or 13 bytes at a time or all at once",
          arguments: FrameVectorLayer.allCases)
    func ourImplementationPasses(layer: FrameVectorLayer) throws {
        let set = FrameVectorSets.set(layer)
        let byteByByte = FrameVectorReference.answers(to: set)
        for split in [2, 3, 5, 13, 1 << 20] {
            #expect(FrameVectorReference.answers(to: set, split: split) == byteByByte, "split \(split)")
        }
        let report = try Self.grade(byteByByte, set)
        #expect(report.results.count == set.cases.count)
        for result in report.results where result.verdict != .pass {
            Issue.record("\(result.testCase.id): \(result.verdict.rawValue), expected \(result.expected), got \(result.actual)")
        }
        #expect(report.succeeded)
        // Every valid case was also encoded, byte for byte, where the frames determine the bytes.
        let valid = set.cases.filter { $0.expect == .valid }
        #expect(byteByByte.answers.filter { $0.encoded != nil }.count == (layer.framesDetermineBytes ? valid.count : 0))
    }

    @Test("wrong answers are graded wrong: FAIL for a MUST, WARN for a PROFILE limit, INCONCLUSIVE when missing")
    func wrongAnswersAreCaught() throws {
        let delivery = FrameVectorSets.delivery
        // A decoder that ignores trailing bytes (NODE-1.2, MUST).
        var report = try Self.grade(Self.answers(delivery, changing: "D-ack-trailing") {
            $0.result = .valid
            $0.frames = [["type": "ack", "id": "000102030405060708090a0b0c0d0e0f"]]
        }, delivery)
        #expect(report.result("vectors/delivery/D-ack-trailing")?.verdict == .fail)
        #expect(report.result("vectors/delivery/D-ack")?.verdict == .pass)
        #expect(!report.succeeded)
        // A decoder that reads a field wrong, and one whose encoder writes other bytes.
        report = try Self.grade(Self.answers(delivery, changing: "D-start") { $0.frames?[0]["offset"] = "4097" }, delivery)
        #expect(report.result("vectors/delivery/D-start")?.verdict == .fail)
        report = try Self.grade(Self.answers(delivery, changing: "D-done") { $0.encoded = "0900000001" + "00" }, delivery)
        #expect(report.result("vectors/delivery/D-done")?.verdict == .fail)
        // A decoder that reports an error where the bytes only end early.
        report = try Self.grade(Self.answers(delivery, changing: "D-offer-partial") { $0.result = .invalid }, delivery)
        #expect(report.result("vectors/delivery/D-offer-partial")?.verdict == .fail)
        // No answer at all.
        var missing = FrameVectorReference.answers(to: delivery)
        missing.answers.removeAll { $0.id == "D-welcome" }
        report = try Self.grade(missing, delivery)
        #expect(report.result("vectors/delivery/D-welcome")?.verdict == .inconclusive)
        #expect(report.succeeded, "a missing answer is not a MUST failure")
        // thali-multiplex: accepting a frame over our 1 MiB profile limit is a warning, not a failure.
        let multiplex = FrameVectorSets.thaliMultiplex
        report = try Self.grade(Self.answers(multiplex, changing: "M-message-over-limit") { $0.result = .incomplete }, multiplex)
        #expect(report.result("vectors/thali-multiplex/M-message-over-limit")?.verdict == .warn)
        #expect(report.succeeded)
        // Either answer is conforming for an acceptable case; a wrong reading of it is not.
        report = try Self.grade(Self.answers(multiplex, changing: "M-non-minimal-varint") { $0.result = .invalid; $0.frames = nil }, multiplex)
        #expect(report.result("vectors/thali-multiplex/M-non-minimal-varint")?.verdict == .pass)
        report = try Self.grade(Self.answers(multiplex, changing: "M-non-minimal-varint") { $0.frames = [["stream_id": "0", "flag": "0", "body": ""]] }, multiplex)
        #expect(report.result("vectors/thali-multiplex/M-non-minimal-varint")?.verdict == .fail)
        // Advertising payloads: a receiver that ignores Android's manufacturer data (BLE-1.2), one that
        // accepts a payload over the legacy 31 octets (BLE-1.3), and one that takes another UUID for Thali's.
        let advertising = FrameVectorSets.advertisingData
        report = try Self.grade(Self.answers(advertising, changing: "A-android-manufacturer") { $0.frames = [] }, advertising)
        #expect(report.result("vectors/advdata/A-android-manufacturer")?.verdict == .fail)
        report = try Self.grade(Self.answers(advertising, changing: "A-too-long") {
            $0.result = .valid
            $0.frames = [["form": "service-data", "claim": "bluetooth-address", "address": "A0:B1:C2:D3:E4:F5", "generation": "0"]]
        }, advertising)
        #expect(report.result("vectors/advdata/A-too-long")?.verdict == .fail)
        report = try Self.grade(Self.answers(advertising, changing: "A-other-uuid") {
            $0.frames = [["form": "service-data", "claim": "bluetooth-address", "address": "A0:B1:C2:D3:E4:F5", "generation": "0"]]
        }, advertising)
        #expect(report.result("vectors/advdata/A-other-uuid")?.verdict == .fail)
        #expect(report.result("vectors/advdata/A-ours")?.verdict == .pass)
        // Answers for another framing grade nothing.
        let yamux = FrameVectorSets.yamux
        report = try Self.grade(FrameVectorReference.answers(to: delivery), yamux)
        #expect(report.count(.inconclusive) == yamux.cases.count)
    }

    /// Before, a decoder that knew none of the version 2 and 3 frame types (welcome, error, progress,
    /// item) passed the eight vectors of malformed frames of those types, rejecting them as unknown.
    @Test("a rejection proves a malformed-frame rule only from a decoder that reads that frame type right; an error class given must be the case's")
    func rejectionsNeedTheirReason() throws {
        let delivery = FrameVectorSets.delivery
        // A version 1 decoder: every frame of types 10-13 is an unknown type to it.
        var answers = FrameVectorReference.answers(to: delivery)
        let newer: Set<UInt8> = [10, 11, 12, 13]
        for (index, answer) in answers.answers.enumerated() {
            guard let vector = delivery.cases.first(where: { $0.id == answer.id }), let type = Hex.decode(vector.bytes)?.first,
                  newer.contains(type) else { continue }
            answers.answers[index] = FrameVectorAnswer(id: answer.id, result: .invalid, error: "unknown frame type \(type)")
        }
        let report = try Self.grade(answers, delivery)
        let malformedNewer = delivery.cases.filter { vector in
            vector.expect == .invalid && vector.error == "malformed" && Hex.decode(vector.bytes)?.first.map(newer.contains) == true
        }
        #expect(malformedNewer.count >= 8)
        for vector in malformedNewer {
            let result = try #require(report.result("vectors/delivery/\(vector.id)"))
            #expect(result.verdict == .inconclusive && result.actual.contains("reads no"), "\(result)")
        }
        #expect(report.result("vectors/delivery/D-welcome")?.verdict == .fail)
        // Malformed frames of the types it does read are still graded on the rejection alone.
        #expect(report.result("vectors/delivery/D-ack-trailing")?.verdict == .pass)
        // An error class, when the answer names one, must be the case's.
        var named = try Self.grade(Self.answers(delivery, changing: "D-ack-trailing") { $0.errorClass = "unknown-frame-type" }, delivery)
        #expect(named.result("vectors/delivery/D-ack-trailing")?.verdict == .fail)
        named = try Self.grade(Self.answers(delivery, changing: "D-ack-trailing") { $0.errorClass = "malformed" }, delivery)
        #expect(named.result("vectors/delivery/D-ack-trailing")?.verdict == .pass)
    }

    @Test("a vector or answer file that is not one is a clear error")
    func badFilesAreRefused() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("frame-vectors-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("bad.json").path
        try Data(#"{"format":"thali-beacon-vectors/1","cases":[]}"#.utf8).write(to: URL(fileURLWithPath: path))
        #expect(throws: FrameVectorError.self) { try FrameVectorSet.load(from: path) }
        #expect(throws: FrameVectorError.self) { try FrameVectorAnswers.load(from: path) }
        #expect(throws: FrameVectorError.self) { try FrameVectorSet.load(from: directory.appendingPathComponent("none").path) }
    }
}
