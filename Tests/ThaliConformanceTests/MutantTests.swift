import Foundation
import Testing
import ThaliMutants
import ThaliTestSupport

@testable import ThaliConformance

/// The suite grades, not just runs: every mutant of `ThaliMutants` (one broken rule each, switched on by
/// `THALI_MUTANT` in a debug build) is caught by exactly the cases `spec/conformance-mutants.json` names,
/// in vectors mode (the mutated `thali-node` answers the frame vectors) or in peer mode (the suite grades
/// a mutated `thali-node run`).
@Suite("Conformance mutants", .serialized, .enabled(if: TestEnvironment.available(PackagePaths.thaliNode() != nil)))
struct MutantTests {
    struct Table: Decodable {
        struct Entry: Decodable, Sendable, CustomTestStringConvertible {
            var name: String
            var layer: String
            var breaks: [String]
            var description: String
            var gradedBy: String
            var caughtBy: [String]
            /// Cases the mutant may fail besides, by a side effect whose timing the mutant does not
            /// decide (its description says which and why); none of them may pass in its place.
            var mayAlsoCatch: [String]?
            var testDescription: String { name }

            /// Whether `caught` is what this mutant may be caught by: every listed case, and nothing
            /// beyond them and the side effects it may have.
            func isCaughtAsListed(_ caught: Set<String>) -> Bool {
                Set(caughtBy).isSubset(of: caught) && caught.isSubset(of: Set(caughtBy).union(mayAlsoCatch ?? []))
            }
        }
        var format: String
        var mutants: [Entry]
    }

    static let tablePath = PackagePaths.root() + "/spec/conformance-mutants.json"

    static func table() throws -> Table {
        let decoder = JSONDecoder()
        decoder.keyDecodingStrategy = .convertFromSnakeCase
        return try decoder.decode(Table.self, from: Data(contentsOf: URL(fileURLWithPath: tablePath)))
    }

    static func entries(gradedBy mode: String) -> [Table.Entry] {
        ((try? table())?.mutants ?? []).filter { $0.gradedBy.hasPrefix(mode) }
    }

    static func node() throws -> String { try #require(PackagePaths.thaliNode()) }

    /// The verdict texts that show a Swift type's module-qualified name (`ThaliNodeCore.ItemRefusal.expired`)
    /// where a reader needs the spec's words.
    static func typeNames(in texts: [String]) -> [String] {
        texts.filter { $0.contains(/\b(?:Thali[A-Za-z]*|TCPMultiplexer|NIO[A-Za-z]*|Swift|Foundation)\.[A-Z]/) }
    }

    /// The ids of the cases that did not pass.
    static func caught(_ results: [ConformanceResult]) -> Set<String> {
        Set(results.filter { $0.verdict != .pass && $0.verdict != .notApplicable }.map(\.testCase.id))
    }

    @Test("the table names every mutant once, at least 15, over every wire layer, with catalog ids and real cases")
    func tableIsComplete() throws {
        let table = try Self.table()
        #expect(table.format == "thali-conformance-mutants/1")
        let names = table.mutants.map(\.name)
        #expect(Set(names).count == names.count, "a mutant is listed twice")
        #expect(Set(names) == Set(Mutant.allCases.map(\.rawValue)), "the table and ThaliMutants disagree")
        #expect(table.mutants.count >= 15)
        #expect(Set(table.mutants.map(\.layer)) == ConformanceCatalogTests.coveredLayers)
        let catalog = try RequirementCatalog.load(from: RequirementCatalog.defaultPath)
        let cases = Set(ConformanceCatalogTests.allCases.map(\.id))
        for mutant in table.mutants {
            #expect(!mutant.breaks.isEmpty && mutant.breaks.allSatisfy { catalog[$0] != nil }, "\(mutant.name)")
            #expect(!mutant.caughtBy.isEmpty && mutant.caughtBy.allSatisfy(cases.contains), "\(mutant.name): \(mutant.caughtBy)")
            let sideEffects = mutant.mayAlsoCatch ?? []
            #expect(sideEffects.allSatisfy { cases.contains($0) && !mutant.caughtBy.contains($0) }, "\(mutant.name): \(sideEffects)")
            #expect(["vectors/delivery", "vectors/yamux", "vectors/thali-multiplex", "vectors/advdata", "peer", "target"].contains(mutant.gradedBy), "\(mutant.name)")
        }
    }

    @Test("a mutated decoder's answers fail exactly the listed vectors", arguments: MutantTests.entries(gradedBy: "vectors/"))
    func vectorsCatchMutant(_ mutant: Table.Entry) async throws {
        let layer = try #require(FrameVectorLayer(rawValue: String(mutant.gradedBy.dropFirst("vectors/".count))))
        let set = FrameVectorSets.set(layer)
        let path = PackagePaths.root() + "/spec/vectors/" + layer.fileName
        let process = try ChildProcess(try Self.node(), ["conformance", "vectors", "answer", path],
                                       environment: [Mutant.environmentVariable: mutant.name])
        #expect(try await process.waitForExit(timeout: .seconds(60)) == 0)
        try? await process.waitForOutput(containing: "\n}", timeout: .seconds(2))
        let answers = try JSONDecoder().decode(FrameVectorAnswers.self, from: Data(process.output.utf8))
        let run = ConformanceRun(target: mutant.name, catalog: try RequirementCatalog.load(from: RequirementCatalog.defaultPath))
        FrameVectorGrading.grade(answers, against: set, in: run)
        #expect(Self.caught(run.report.results) == Set(mutant.caughtBy))
    }

    /// How many mutated nodes are graded side by side. A run mostly waits (discovery, observation windows,
    /// timeouts: a target-mode run spends about 5 CPU-s in 20 s), so three at once cut this suite's time
    /// to about a third without crowding two cores; each run has its own SSDP port and data directories.
    static let mutantsAtOnce = 3

    /// Runs `grade` for each of `entries`, ``mutantsAtOnce`` at a time; a run that throws is recorded as
    /// an issue naming its mutant, and the others go on.
    static func gradeEach(_ entries: [Table.Entry], _ grade: @escaping @Sendable (Table.Entry) async throws -> Void) async {
        await withTaskGroup(of: Void.self) { group in
            var waiting = entries.makeIterator()
            func startNext() {
                guard let mutant = waiting.next() else { return }
                group.addTask {
                    do { try await grade(mutant) } catch { Issue.record(error, "mutant \(mutant.name)") }
                }
            }
            for _ in 0..<mutantsAtOnce { startNext() }
            while await group.next() != nil { startNext() }
        }
    }

    @Test("peer mode against each mutated thali-node run fails exactly the listed cases")
    func peerModeCatchesEveryMutant() async throws {
        let entries = Self.entries(gradedBy: "peer")
        #expect(!entries.isEmpty)
        await Self.gradeEach(entries) { mutant in try await Self.gradeInPeerMode(mutant) }
    }

    static func gradeInPeerMode(_ mutant: Table.Entry) async throws {
        let node = try Self.node()
        let implementation = try await PeerModeTests.startImplementation(environment: [Mutant.environmentVariable: mutant.name])
        defer { implementation.remove() }
        let (iutKey, suite, ssdpPort) = (implementation.iutKey, implementation.suite, implementation.ssdpPort)
        let jsonPath = suite + "/report.json"
        let run = try ChildProcess(node, ["conformance", "peer", "--peer-key", iutKey, "--identity", suite + "/identity.key",
                                          "--address", "127.0.0.1", "--ssdp-port", String(ssdpPort), "--step-timeout-s", "5", "--discovery-timeout-s", "5",
                                          "--adapter", "\(node) --home \(implementation.iut)", "--json-out", jsonPath])
        _ = try await run.waitForExit(timeout: .seconds(120))
        let report = try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: jsonPath))) as? [String: Any]
        let results = try #require(report?["results"] as? [[String: Any]], "mutant \(mutant.name)")
        let caught = Set(results.filter { !["PASS", "N/A"].contains($0["verdict"] as? String) }.compactMap { $0["id"] as? String })
        #expect(mutant.isCaughtAsListed(caught), "mutant \(mutant.name): caught by \(caught.sorted())\n\(run.output)")
        let texts = results.flatMap { [$0["expected"] as? String ?? "", $0["actual"] as? String ?? ""] }
        #expect(Self.typeNames(in: texts).isEmpty, "mutant \(mutant.name): \(Self.typeNames(in: texts))")
    }

    @Test("target mode against each mutated thali-node run fails exactly the listed cases")
    func targetModeCatchesEveryMutant() async throws {
        let entries = Self.entries(gradedBy: "target")
        #expect(!entries.isEmpty)
        await Self.gradeEach(entries) { mutant in
            let implementation = try await PeerModeTests.startImplementation(environment: [Mutant.environmentVariable: mutant.name])
            defer { implementation.remove() }
            let (_, verdicts, output) = try await TargetModeTests.runTarget(ssdpPort: implementation.ssdpPort, directory: implementation.suite,
                                                                            keys: (implementation.iutKey, implementation.suite + "/identity.key"))
            let caught = Set(verdicts.filter { !["PASS", "N/A"].contains($0.value) }.keys)
            #expect(mutant.isCaughtAsListed(caught), "mutant \(mutant.name): caught by \(caught.sorted())\n\(output)")
        }
    }
}
