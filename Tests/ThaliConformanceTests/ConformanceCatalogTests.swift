import Foundation
import Testing
import ThaliTestSupport

@testable import ThaliConformance

/// The requirement catalog, the spec text and the cases agree: every tag in `spec/*.md` is in the catalog
/// and every catalog id is tagged in its document; every case cites catalog ids; every MUST and SHOULD of
/// the wire layers the suite covers has a case or a reason in `spec/conformance-not-yet-graded.json`.
@Suite("Requirement catalog")
struct ConformanceCatalogTests {
    static let specDirectory = PackagePaths.root() + "/spec"
    /// The layers whose MUST and SHOULD rules must each have a case or a stated reason.
    static let coveredLayers: Set<String> = ["beacons", "psk-tls", "ssdp", "http", "multiplexer", "delivery", "node", "ble"]
    static var tag: Regex<(Substring, Substring)> { /\[([A-Z]+-[0-9]+(?:\.[0-9]+)+)\]/ }

    static func catalog() throws -> RequirementCatalog {
        try RequirementCatalog.load(from: RequirementCatalog.defaultPath)
    }

    /// Every case the suite has, in every mode.
    static var allCases: [ConformanceCase] {
        PeerConformance.Cases.all + ConformanceProbe.cases + FrameVectorSets.cases + TargetConformance.Cases.all
            + BluetoothConformance.Cases.all
    }

    @Test("the catalog loads from the source tree, its ids are unique and each names an existing document")
    func loads() throws {
        let catalog = try Self.catalog()
        #expect(RequirementCatalog.defaultPath == Self.specDirectory + "/requirements.json")
        #expect(catalog.requirements.count >= 100)
        for requirement in catalog.requirements {
            #expect(FileManager.default.fileExists(atPath: Self.specDirectory + "/" + requirement.document), "\(requirement.id)")
            #expect(!requirement.rule.isEmpty, "\(requirement.id)")
            #expect(requirement.id.hasPrefix(requirement.id.split(separator: "-")[0] + "-" + requirement.section), "\(requirement.id)")
        }
        // Every level occurs, MAY aside (no rule of ours is a bare permission yet).
        #expect(Set(catalog.requirements.map(\.level)).isSuperset(of: [.must, .should, .profile, .info]))
    }

    @Test("every id tagged in the spec text is in the catalog, and every catalog id is tagged in its own document")
    func tagsMatch() throws {
        let catalog = try Self.catalog()
        var tagged: [String: Set<String>] = [:]  // id -> documents that tag it
        for name in try FileManager.default.contentsOfDirectory(atPath: Self.specDirectory) where name.hasSuffix(".md") {
            let text = try String(contentsOfFile: Self.specDirectory + "/" + name, encoding: .utf8)
            for match in text.matches(of: Self.tag) { tagged[String(match.1), default: []].insert(name) }
        }
        for (id, documents) in tagged.sorted(by: { $0.key < $1.key }) {
            #expect(catalog[id] != nil, "\(id) is tagged in \(documents.sorted()) but not in the catalog")
        }
        for requirement in catalog.requirements {
            #expect(tagged[requirement.id]?.contains(requirement.document) == true,
                    "\(requirement.id) is not tagged in \(requirement.document)")
        }
    }

    @Test("the catalog's levels are valid: an unknown level or a duplicate id is refused")
    func invalidCatalogs() throws {
        let badLevel = #"{"format":"thali-requirements/1","version":1,"requirements":[{"id":"X-1.1","level":"OUGHT","layer":"x","document":"x.md","section":"1","rule":"r"}]}"#
        #expect(throws: RequirementCatalogError.self) { try RequirementCatalog(json: Data(badLevel.utf8)) }
        let entry = #"{"id":"X-1.1","level":"MUST","layer":"x","document":"x.md","section":"1","rule":"r"}"#
        let duplicate = #"{"format":"thali-requirements/1","version":1,"requirements":[\#(entry),\#(entry)]}"#
        #expect(throws: RequirementCatalogError.self) { try RequirementCatalog(json: Data(duplicate.utf8)) }
        let wrongFormat = #"{"format":"thali-requirements/2","version":1,"requirements":[]}"#
        #expect(throws: RequirementCatalogError.self) { try RequirementCatalog(json: Data(wrongFormat.utf8)) }
    }

    @Test("every case has a unique id and cites at least one requirement, each in the catalog")
    func casesCiteRequirements() throws {
        let catalog = try Self.catalog()
        let ids = Self.allCases.map(\.id)
        #expect(Set(ids).count == ids.count, "duplicate case ids")
        for testCase in Self.allCases {
            #expect(!testCase.requirements.isEmpty, "\(testCase.id) cites no requirement")
            for id in testCase.requirements {
                #expect(catalog[id] != nil, "\(testCase.id) cites \(id), which the catalog does not have")
            }
        }
    }

    @Test("every MUST and SHOULD of the covered wire layers has a case or a reason in the not-yet-graded list")
    func everyRuleGradedOrListed() throws {
        struct Gaps: Decodable {
            struct Entry: Decodable { var id: String, reason: String }
            var format: String
            var notYetGraded: [Entry]
        }
        let catalog = try Self.catalog()
        let data = try Data(contentsOf: URL(fileURLWithPath: Self.specDirectory + "/conformance-not-yet-graded.json"))
        let gaps = try JSONDecoder().decode(Gaps.self, from: data)
        #expect(gaps.format == "thali-conformance-not-yet-graded/1")
        let listed = Dictionary(gaps.notYetGraded.map { ($0.id, $0.reason) }, uniquingKeysWith: { first, _ in first })
        #expect(listed.count == gaps.notYetGraded.count, "an id is listed twice")
        let graded = Set(Self.allCases.flatMap(\.requirements))
        for requirement in catalog.requirements
        where Self.coveredLayers.contains(requirement.layer) && [.must, .should].contains(requirement.level) {
            let isGraded = graded.contains(requirement.id)
            let reason = listed[requirement.id]
            #expect(isGraded || reason != nil, "\(requirement.id) (\(requirement.level.rawValue)) has no case and no reason")
            #expect(!(isGraded && reason != nil), "\(requirement.id) has a case now: remove it from the not-yet-graded list")
            #expect(reason.map { !$0.isEmpty } ?? true, "\(requirement.id): empty reason")
        }
        for id in listed.keys {
            #expect(catalog[id] != nil, "the not-yet-graded list names \(id), which the catalog does not have")
        }
    }
}
