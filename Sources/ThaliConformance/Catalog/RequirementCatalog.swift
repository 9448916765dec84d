import Foundation

/// How binding a rule of the specification is (spec/conformance.md, "Levels").
public enum RequirementLevel: String, Sendable, Hashable, Codable, CaseIterable, Comparable {
    /// Required of every implementation: breaking it is a wire error.
    case must = "MUST"
    /// Recommended: breaking it is a warning.
    case should = "SHOULD"
    /// Allowed.
    case may = "MAY"
    /// This implementation's own limit or policy; another implementation may choose differently.
    case profile = "PROFILE"
    /// A description of behaviour, not a requirement.
    case info = "INFO"

    /// MUST is the strongest, INFO the weakest.
    public static func < (lhs: Self, rhs: Self) -> Bool { lhs.rank < rhs.rank }
    private var rank: Int { Self.allCases.firstIndex(of: self).map { Self.allCases.count - $0 } ?? 0 }
}

/// One normative rule of `spec/`, as `spec/requirements.json` lists it.
public struct Requirement: Sendable, Hashable, Codable {
    /// The stable id, tagged `[ID]` beside the rule in the spec text (`PSK-4.1`).
    public var id: String
    /// How binding the rule is.
    public var level: RequirementLevel
    /// The wire layer or part it belongs to (`psk-tls`, `delivery`, ...).
    public var layer: String
    /// The spec document, relative to `spec/`.
    public var document: String
    /// The section number within the document.
    public var section: String
    /// The rule in one sentence.
    public var rule: String
}

/// Why a requirement catalog could not be read.
public struct RequirementCatalogError: Error, Hashable, CustomStringConvertible {
    /// What was wrong, with the file named.
    public let description: String
}

/// The requirement catalog (`spec/requirements.json`, format `thali-requirements/1`).
public struct RequirementCatalog: Sendable, Hashable {
    /// The format name this code reads.
    public static let format = "thali-requirements/1"
    /// Largest catalog file read, so a wrong path cannot make us load a huge file.
    public static let maximumFileBytes = 4 << 20

    /// The catalog's own version number (bumped when ids are added or levels change).
    public let version: Int
    /// Every requirement, in catalog order.
    public let requirements: [Requirement]
    private let byID: [String: Requirement]

    /// A catalog of `requirements`.
    public init(version: Int, requirements: [Requirement]) throws(RequirementCatalogError) {
        self.version = version
        self.requirements = requirements
        var byID: [String: Requirement] = [:]
        for requirement in requirements {
            guard byID.updateValue(requirement, forKey: requirement.id) == nil else {
                throw RequirementCatalogError(description: "requirement id \(requirement.id) appears twice")
            }
        }
        self.byID = byID
    }

    /// The requirement with `id`, if the catalog has it.
    public subscript(id: String) -> Requirement? { byID[id] }

    /// Parses a catalog document.
    public init(json data: Data) throws(RequirementCatalogError) {
        struct Document: Decodable {
            var format: String
            var version: Int
            var requirements: [Requirement]
        }
        let document: Document
        do {
            document = try JSONDecoder().decode(Document.self, from: data)
        } catch {
            throw RequirementCatalogError(description: "not a requirement catalog: \(error)")
        }
        guard document.format == Self.format else {
            throw RequirementCatalogError(description: "format \(document.format), expected \(Self.format)")
        }
        try self.init(version: document.version, requirements: document.requirements)
    }

    /// Reads the catalog at `path`.
    public static func load(from path: String) throws(RequirementCatalogError) -> RequirementCatalog {
        let data: Data
        do {
            data = try BoundedFile.read(path, maximumBytes: maximumFileBytes)
        } catch {
            throw RequirementCatalogError(description: error.description)
        }
        do {
            return try RequirementCatalog(json: data)
        } catch {
            throw RequirementCatalogError(description: "\(path): \(error)")
        }
    }

    /// `spec/requirements.json` of the source tree this module was built from: where `thali-node` finds
    /// the catalog when it runs from a checkout (`--catalog` gives another).
    public static var defaultPath: String {
        // The first folder up from this file that holds Sources/ (the file moves between folders).
        var url = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        while url.path != "/", url.lastPathComponent != "Sources" { url.deleteLastPathComponent() }
        return url.deletingLastPathComponent().appendingPathComponent("spec/requirements.json").path
    }

    /// The strongest level among `ids` (MUST over SHOULD ...); INFO when none is known.
    public func level(of ids: [String]) -> RequirementLevel {
        ids.compactMap { byID[$0]?.level }.max() ?? .info
    }
}
