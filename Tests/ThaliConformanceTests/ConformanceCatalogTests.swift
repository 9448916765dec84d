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

    /// The spec text that tag `[id]` vouches for in `text`: the paragraph holding it with the tables and
    /// grammars of its section, or, for a tag in a heading, the whole section.
    static func taggedText(_ id: String, in text: String) -> String {
        let blocks = text.components(separatedBy: "\n\n")
        let isHeading = { (block: String) in block.drop { $0 == "\n" || $0 == " " }.hasPrefix("#") }
        var found: [String] = []
        for (index, block) in blocks.enumerated() where block.contains("[\(id)]") {
            var start = index
            while start > 0, !isHeading(blocks[start]) { start -= 1 }
            var end = index + 1
            while end < blocks.count, !isHeading(blocks[end]) { end += 1 }
            let section = blocks[start..<end]
            if isHeading(block) {
                found += section
            } else {
                found.append(block)
                found += section.filter { $0.drop { $0 == "\n" || $0 == " " }.hasPrefix("|") || $0.contains("```") }
            }
        }
        return found.joined(separator: "\n")
    }

    /// What a rule states that its spec text must state too: code spans, `version N`, hexadecimal codes
    /// and numbers of two or more digits (sizes, times, counts).
    static func statedValues(_ rule: String) -> Set<String> {
        var values = Set(rule.matches(of: /`([^`]+)`/).map { String($0.1) })
        values.formUnion(rule.matches(of: /version [0-9]+/).map { String($0.0) })
        values.formUnion(rule.matches(of: /0x[0-9A-Fa-f]+/).map { String($0.0) })
        values.formUnion(rule.matches(of: /(?:^|[^\w.\-])([0-9]{2,}(?:\.[0-9]+)?)(?![\w.\-])/).map { String($0.1) })
        return values
    }

    /// A rule's text is a summary of its sentence in `spec/`: when the two drift (NODE-1.4 said `hello`
    /// with version 2 after node.md had moved to 3), the table quotes a rule the spec no longer has.
    @Test("every rule's values (code spans, versions, codes, numbers) are in the spec text that tags it")
    func rulesMatchTheirSentences() throws {
        let catalog = try Self.catalog()
        var texts: [String: String] = [:]
        let normalize = { (text: String) in text.replacingOccurrences(of: ",", with: "").replacingOccurrences(of: "\u{202F}", with: " ").lowercased() }
        for requirement in catalog.requirements {
            if texts[requirement.document] == nil {
                texts[requirement.document] = try String(contentsOfFile: Self.specDirectory + "/" + requirement.document, encoding: .utf8)
            }
            let tagged = normalize(Self.taggedText(requirement.id, in: texts[requirement.document] ?? ""))
            let missing = Self.statedValues(requirement.rule).filter { !tagged.contains(normalize($0)) }
            #expect(missing.isEmpty, "\(requirement.id) states \(missing.sorted()), which its sentence in \(requirement.document) does not: \(requirement.rule)")
        }
    }

    @Test("the drift check reads a rule's values and finds them missing from other text")
    func driftCheckBites() {
        let text = "## Frames\n\nThe sender sends `hello` with version 4 [X-1.1].\n\n| a | b |\n|---|---|\n| 30 s | x |\n\n## Next\n\nversion 2 [X-1.2]"
        #expect(Self.statedValues("hello with version 2 every 30 s, code 0x0A, `hello`") == ["version 2", "30", "0x0A", "hello"])
        let tagged = Self.taggedText("X-1.1", in: text)
        #expect(tagged.contains("version 4") && tagged.contains("30 s") && !tagged.contains("version 2"))
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
