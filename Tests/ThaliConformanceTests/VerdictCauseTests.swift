import Foundation
import Testing
import ThaliMutants
import ThaliNodeCore
import ThaliTestSupport

@testable import ThaliConformance

/// The first rule an implementation breaks is the FAIL, reported where it breaks; what depends on it is
/// INCONCLUSIVE, naming it (spec/conformance.md, "Verdicts").
@Suite("Conformance verdicts name their cause", .serialized, .enabled(if: TestEnvironment.available(PackagePaths.thaliNode() != nil)))
struct VerdictCauseTests {
    /// A result as `--json-out` writes it.
    struct Result: Decodable, CustomStringConvertible {
        var id: String
        var verdict: String
        var actual: String
        var milliseconds: Int
        var description: String { "\(verdict) \(id): \(actual)" }
    }

    /// The results of the report at `path`, in the order they were recorded.
    static func results(at path: String) throws -> [Result] {
        struct Report: Decodable { var results: [Result] }
        return try JSONDecoder().decode(Report.self, from: Data(contentsOf: URL(fileURLWithPath: path))).results
    }

    /// Answers and refusals read as spec/node.md writes them; before, a refusal showed as
    /// `refused(ThaliNodeCore.ItemRefusal.expired)`.
    @Test("a delivery frame in a verdict reads in the spec's words, with its code, never a Swift type's name")
    func framesInWords() {
        let id = UUID()
        #expect(PeerConformance.describe(.answer(id: id, .refused(.expired))) == "answer refused(expired, reason 3)")
        #expect(PeerConformance.describe(.answer(id: id, .refused(.noSpace))) == "answer refused(no space, reason 4)")
        #expect(PeerConformance.describe(.answer(id: id, .partial(offset: 16, prefixSHA256: []))) == "answer partial(16)")
        #expect(PeerConformance.describe(.reject(id: id, .digestMismatch)) == "reject(digest mismatch, reason 1)")
        let texts = ItemRefusal.allCases.map { PeerConformance.describe(.answer(id: id, .refused($0))) }
            + TransferFailure.allCases.map { PeerConformance.describe(.reject(id: id, $0)) }
        #expect(MutantTests.typeNames(in: texts).isEmpty, "\(texts)")
        #expect(MutantTests.typeNames(in: ["refused(ThaliNodeCore.ItemRefusal.expired)"]).count == 1)
    }

    /// Runs peer mode against `thali-node run` with `mutant` switched on; the report's results.
    static func gradeInPeerMode(_ mutant: Mutant, stepTimeoutSeconds: Int = 5) async throws -> [Result] {
        let node = try #require(PackagePaths.thaliNode())
        let implementation = try await PeerModeTests.startImplementation(environment: [Mutant.environmentVariable: mutant.rawValue])
        defer { implementation.remove() }
        let jsonPath = implementation.suite + "/report.json"
        let run = try ChildProcess(node, ["conformance", "peer", "--peer-key", implementation.iutKey,
                                          "--identity", implementation.suite + "/identity.key", "--address", "127.0.0.1",
                                          "--ssdp-port", String(implementation.ssdpPort), "--step-timeout-s", String(stepTimeoutSeconds),
                                          "--discovery-timeout-s", "5", "--adapter", "\(node) --home \(implementation.iut)", "--json-out", jsonPath])
        _ = try await run.waitForExit(timeout: .seconds(180))
        let results = try results(at: jsonPath)
        #expect(MutantTests.typeNames(in: results.map(\.actual)).isEmpty, "\(results)")
        return results
    }

    /// A session that ignores frames which call for an RST or a GoAway used to cost the whole step
    /// timeout per case (10 s each by default). The Ping sent behind those frames fences the wait: once it
    /// is answered, the verdict is known after a short grace.
    @Test("a yamux session that ignores data after FIN or a wrong-parity stream is judged at its Ping answer, not at the step timeout",
          arguments: [(Mutant.yamuxAcceptsDataAfterFIN, PeerConformance.Cases.dataAfterFIN),
                      (Mutant.yamuxAcceptsWrongParity, PeerConformance.Cases.wrongParity)])
    func fencedYamuxCases(_ mutant: Mutant, _ testCase: ConformanceCase) async throws {
        let stepTimeoutSeconds = 60
        let results = try await Self.gradeInPeerMode(mutant, stepTimeoutSeconds: stepTimeoutSeconds)
        let result = try #require(results.first { $0.id == testCase.id })
        #expect(result.verdict == "FAIL", "\(result)")
        #expect(result.actual.contains("the Ping sent behind"), "\(result)")
        // Decided by the fence: well inside the step timeout, which a wait without it would have used up.
        #expect(result.milliseconds < stepTimeoutSeconds * 1000 / 2, "\(result) after \(result.milliseconds) ms")
    }

    /// Before, target mode's match-connects FAILed with "no welcome" and cited the beacon and connection
    /// rules (NODE-3.2, BCN-4.7, NODE-4.2), which held; the welcome's own rules went uncited.
    @Test("in target mode a receiver that ends the stream on hello(4) connects (match-connects passes) and fails target/delivery/welcome")
    func targetWelcomeIsItsOwnCase() async throws {
        let implementation = try await PeerModeTests.startImplementation(
            environment: [Mutant.environmentVariable: Mutant.deliveryReceiverRefusesNewerHello.rawValue])
        defer { implementation.remove() }
        let (_, verdicts, output) = try await TargetModeTests.runTarget(ssdpPort: implementation.ssdpPort, directory: implementation.suite,
                                                                        keys: (implementation.iutKey, implementation.suite + "/identity.key"))
        #expect(verdicts[TargetConformance.Cases.matchConnects.id] == "PASS", "\(output)")
        #expect(verdicts[TargetConformance.Cases.welcome.id] == "FAIL", "\(output)")
        #expect(TargetConformance.Cases.welcome.requirements.contains("NODE-1.22"))
        #expect(!TargetConformance.Cases.matchConnects.requirements.contains { $0.hasPrefix("NODE-1.") })
    }

    /// A version 1 sender is graded as one (spec/conformance.md, "Older versions"): before, its
    /// error-frame case was a WARN after three step timeouts, though nobody sends `error` to a version 1
    /// peer, and the version 3 cases ended INCONCLUSIVE.
    @Test("a version 1 sender: its hello a WARN, the cases of later versions N/A, nothing else failing for it")
    func version1SenderIsGradedAsOne() async throws {
        let results = try await Self.gradeInPeerMode(.deliverySenderSpeaksVersion1)
        let cases = PeerConformance.Cases.self
        let verdicts = Dictionary(results.map { ($0.id, $0) }, uniquingKeysWith: { first, _ in first })
        #expect(verdicts[cases.hello.id]?.verdict == "WARN", "\(results)")
        for testCase in [cases.errorFrame, cases.window, cases.itemBatch, cases.frameMaximum, cases.version2Fallback] {
            #expect(verdicts[testCase.id]?.verdict == "N/A", "\(verdicts[testCase.id].map(String.init(describing:)) ?? testCase.id)")
        }
        let failing = results.filter { ["FAIL", "INCONCLUSIVE"].contains($0.verdict) && $0.id.hasPrefix("peer/delivery/") }
        #expect(failing.isEmpty, "\(failing)")
    }

    /// An adapter that reports, beside each session the implementation accepts, a clean end of another
    /// session (as a late report of the session before would read). Before, the unclean-close case took
    /// the first `disconnected` after its mark, such a late clean one among them, and FAILed.
    static let staleEndAdapter = #"""
    import json, os, subprocess, sys
    node, home, verb = sys.argv[1], sys.argv[2], sys.argv[3:]
    if verb[:1] != ["events"]:
        os.execv(node, [node, "--home", home] + verb)
    events = subprocess.Popen([node, "--home", home, "events"], stdout=subprocess.PIPE, text=True)
    for line in events.stdout:
        sys.stdout.write(line)
        event = json.loads(line) if line.startswith("{") else {}
        if event.get("event") == "connected" and event.get("role") == "accepting":
            stale = {"event": "disconnected", "contact": event.get("contact"), "role": "accepting", "binding": "wifi",
                     "remote": "127.0.0.1:9", "clean": True, "reason": "closed"}
            sys.stdout.write(json.dumps(stale) + "\n")
        sys.stdout.flush()
    """#

    @Test("the unclean-close case grades the events of its own session (by remote), not a clean end of another reported late")
    func uncleanCloseGradesItsOwnSession() async throws {
        let node = try #require(PackagePaths.thaliNode())
        let implementation = try await PeerModeTests.startImplementation()
        defer { implementation.remove() }
        let adapter = implementation.suite + "/stale-end-adapter.py"
        try Self.staleEndAdapter.write(toFile: adapter, atomically: true, encoding: .utf8)
        let jsonPath = implementation.suite + "/report.json"
        let run = try ChildProcess(node, ["conformance", "peer", "--peer-key", implementation.iutKey,
                                          "--identity", implementation.suite + "/identity.key", "--address", "127.0.0.1",
                                          "--ssdp-port", String(implementation.ssdpPort), "--step-timeout-s", "5", "--discovery-timeout-s", "5",
                                          "--adapter", "python3 \(adapter) \(node) \(implementation.iut)", "--json-out", jsonPath])
        _ = try await run.waitForExit(timeout: .seconds(180))
        let results = try Self.results(at: jsonPath)
        let unclean = try #require(results.first { $0.id == PeerConformance.Cases.uncleanCloseReported.id }, "\(run.output)")
        #expect(unclean.verdict == "PASS", "\(unclean)")
        #expect(unclean.actual.contains("clean false") && unclean.actual.contains("the session from 127.0.0.1:"), "\(unclean)")
    }

    /// Before, the seven malformed forms shared one location, and the verdict said "4 fetches", not which
    /// forms were taken.
    @Test("target/ssdp/malformed-ignored names the malformed form an implementation took, and only that one")
    func malformedFormsAreNamed() async throws {
        let implementation = try await PeerModeTests.startImplementation(
            environment: [Mutant.environmentVariable: Mutant.ssdpAcceptsDuplicateHeaders.rawValue])
        defer { implementation.remove() }
        let run = try TargetModeTests.startTarget(ssdpPort: implementation.ssdpPort, directory: implementation.suite,
                                                  keys: (implementation.iutKey, implementation.suite + "/identity.key"))
        let (_, verdicts, output) = try await TargetModeTests.finish(run, directory: implementation.suite)
        #expect(verdicts[TargetConformance.Cases.malformed.id] == "FAIL", "\(output)")
        let results = try Self.results(at: implementation.suite + "/target.json")
        let malformed = try #require(results.first { $0.id == TargetConformance.Cases.malformed.id })
        #expect(malformed.actual.contains("NT twice"), "\(malformed)")
        for other in TargetDatagrams.malformedForms where other != "NT twice" {
            #expect(!malformed.actual.contains(other), "\(malformed)")
        }
    }

    /// Runs target mode against `thali-node run` with `mutant` switched on; the report's results.
    static func gradeInTargetMode(_ mutant: Mutant) async throws -> [Result] {
        let implementation = try await PeerModeTests.startImplementation(environment: [Mutant.environmentVariable: mutant.rawValue])
        defer { implementation.remove() }
        _ = try await TargetModeTests.runTarget(ssdpPort: implementation.ssdpPort, directory: implementation.suite,
                                                keys: (implementation.iutKey, implementation.suite + "/identity.key"))
        return try results(at: implementation.suite + "/target.json")
    }

    /// Before, busy-waited passed a client that never fetched again, and nothing graded whether a client
    /// takes a beacon body only from a 200 with application/octet-stream (or a 204).
    @Test("target mode fails a client that never fetches a busy location again, and one that takes beacons from a 404 or a text/html answer",
          arguments: [(Mutant.httpBusyAsNoContent, TargetConformance.Cases.busyWaited, "never fetched again"),
                      (Mutant.httpIgnoresStatus, TargetConformance.Cases.statusChecked, "connection")])
    func httpClientHalf(_ mutant: Mutant, _ testCase: ConformanceCase, _ evidence: String) async throws {
        let results = try await Self.gradeInTargetMode(mutant)
        let result = try #require(results.first { $0.id == testCase.id })
        #expect(result.verdict == "FAIL" && result.actual.contains(evidence), "\(result)")
    }

    /// A receiver that speaks version 1 only and ends the stream on our `hello(4)`: before, the welcome
    /// case was INCONCLUSIVE ("an earlier step failed"), printed last, and seven later steps FAILed with
    /// "the peer ended its side of the connection".
    @Test("a receiver that ends the stream on hello(4) fails peer/sender/welcome, in place; the later sender steps name it")
    func welcomeIsTheCause() async throws {
        let results = try await Self.gradeInPeerMode(.deliveryReceiverRefusesNewerHello)
        let cases = PeerConformance.Cases.self
        let welcome = try #require(results.firstIndex { $0.id == cases.senderWelcome.id }, "\(results)")
        #expect(results[welcome].verdict == "FAIL", "\(results[welcome])")
        let dependents = [cases.senderStream, cases.senderProgress, cases.senderAck, cases.refusesExpired, cases.rejectsDamaged,
                          cases.senderBatch, cases.senderClose, cases.senderInbox]
        for dependent in dependents {
            let index = try #require(results.firstIndex { $0.id == dependent.id })
            #expect(results[index].verdict == "INCONCLUSIVE", "\(results[index])")
            #expect(results[index].actual.contains("needs \(cases.senderWelcome.id)"), "\(results[index])")
            #expect(index > welcome, "\(dependent.id) reported before the welcome that decided it")
        }
        // Reported where it happened, in the sender role, not after the cases that followed it.
        let lastSenderStep = try #require(results.firstIndex { $0.id == cases.senderClose.id })
        #expect(results.count - 1 > lastSenderStep, "the sender role's verdicts came last")
    }
}
