import Foundation
import Testing
import ThaliMutants
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
        var description: String { "\(verdict) \(id): \(actual)" }
    }

    /// The results of the report at `path`, in the order they were recorded.
    static func results(at path: String) throws -> [Result] {
        struct Report: Decodable { var results: [Result] }
        return try JSONDecoder().decode(Report.self, from: Data(contentsOf: URL(fileURLWithPath: path))).results
    }

    /// A receiver that speaks version 1 only and ends the stream on our `hello(4)`: before, the welcome
    /// case was INCONCLUSIVE ("an earlier step failed"), printed last, and seven later steps FAILed with
    /// "the peer ended its side of the connection".
    @Test("a receiver that ends the stream on hello(4) fails peer/sender/welcome, in place; the later sender steps name it")
    func welcomeIsTheCause() async throws {
        let node = try #require(PackagePaths.thaliNode())
        let mutant = Mutant.deliveryReceiverRefusesNewerHello
        let implementation = try await PeerModeTests.startImplementation(environment: [Mutant.environmentVariable: mutant.rawValue])
        defer { implementation.remove() }
        let jsonPath = implementation.suite + "/report.json"
        let run = try ChildProcess(node, ["conformance", "peer", "--peer-key", implementation.iutKey,
                                          "--identity", implementation.suite + "/identity.key", "--address", "127.0.0.1",
                                          "--ssdp-port", String(implementation.ssdpPort), "--step-timeout-s", "5", "--discovery-timeout-s", "5",
                                          "--adapter", "\(node) --home \(implementation.iut)", "--json-out", jsonPath])
        _ = try await run.waitForExit(timeout: .seconds(120))
        let results = try Self.results(at: jsonPath)
        let cases = PeerConformance.Cases.self
        let welcome = try #require(results.firstIndex { $0.id == cases.senderWelcome.id }, "\(run.output)")
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
