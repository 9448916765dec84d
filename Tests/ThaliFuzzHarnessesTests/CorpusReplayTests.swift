import Foundation
import Testing
import ThaliFuzzHarnesses
import ThaliTestSupport

/// Every committed corpus file (`Fuzz/Corpus/<harness>/`: seeds, inputs the fuzzer kept for new
/// coverage, and regression inputs of past findings) runs through its harness's entry point, without
/// the fuzzer. An input that once crashed or broke an invariant fails CI if the defect comes back.
@Suite struct CorpusReplayTests {
    static let corpusRoot = PackagePaths.root() + "/Fuzz/Corpus"

    static func corpusFiles(_ harness: String) -> [String] {
        let directory = corpusRoot + "/" + harness
        let names = (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
        return names.filter { !$0.hasPrefix(".") }.sorted().map { directory + "/" + $0 }
    }

    @Test(arguments: FuzzHarnesses.all.map(\.name))
    func everyCorpusFilePasses(harnessName: String) throws {
        let harness = try #require(FuzzHarnesses.named(harnessName))
        let files = Self.corpusFiles(harnessName)
        // Each harness has a committed corpus that starts at least from its seeds.
        #expect(files.count >= harness.seeds().count, "\(harnessName): \(files.count) corpus files")
        for file in files {
            let bytes = try #require(FileManager.default.contents(atPath: file), "unreadable \(file)")
            do {
                try harness.run(Array(bytes))
            } catch {
                Issue.record("\(file): \(error)")
            }
        }
    }

    /// The seeds themselves pass: a harness whose own valid inputs break an invariant is wrong.
    @Test(arguments: FuzzHarnesses.all.map(\.name))
    func seedsPass(harnessName: String) throws {
        let harness = try #require(FuzzHarnesses.named(harnessName))
        let seeds = harness.seeds()
        #expect(!seeds.isEmpty)
        for (index, seed) in seeds.enumerated() {
            #expect(throws: Never.self, "seed \(index)") { try harness.run(seed) }
        }
    }

    /// Every harness has its libFuzzer executable in `Fuzz/Package.swift`, and every executable there
    /// names a harness: `scripts/fuzz.sh --list` reads that table.
    @Test func everyHarnessHasAFuzzExecutable() throws {
        let manifest = try String(contentsOfFile: PackagePaths.root() + "/Fuzz/Package.swift", encoding: .utf8)
        let listed = manifest.split(separator: "\n").compactMap { line -> String? in
            let parts = line.split(separator: "\"")
            return line.hasPrefix("    (\"") && parts.count >= 4 ? String(parts[1]) : nil
        }
        #expect(Set(listed) == Set(FuzzHarnesses.all.map(\.name)))
        #expect(listed.count == FuzzHarnesses.all.count)
    }
}
