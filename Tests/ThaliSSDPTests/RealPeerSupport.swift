import Foundation
import Testing
import ThaliTestSupport

/// The `thali-node` built beside the test bundle.
func thaliNodePath() -> String? { PackagePaths.thaliNode() }

/// Whether this process may create network namespaces (root, and `ip` present).
var canUseNetworkNamespaces: Bool { TestEnvironment.canUseNetworkNamespaces }

/// A JSON line of `thali-node discover`, typed: the fields its events carry (each event sets some).
struct DiscoverLine: Decodable {
    var event: String
    var usn: String?
    var location: String?
    var reason: String?
    var kind: String?
    var beaconsHex: String?
    var counters: [String: Int]?

    enum CodingKeys: String, CodingKey {
        case event, usn, location, reason, kind, counters
        case beaconsHex = "beacons_hex"
    }
}

/// The JSON lines a `thali-node discover` printed so far (a line that is not one is left out).
func discoverLines(_ child: ChildProcess) -> [DiscoverLine] {
    child.output.split(separator: "\n").compactMap { try? JSONDecoder().decode(DiscoverLine.self, from: Data($0.utf8)) }
}

/// Waits until a `thali-node discover` printed a line matching `predicate`.
@discardableResult
func waitForLine(_ child: ChildProcess, timeout: Duration = .seconds(5), _ what: String,
                 _ predicate: (DiscoverLine) -> Bool) async throws -> DiscoverLine {
    let found = try await waitForValue(timeout: timeout) { discoverLines(child).first(where: predicate) }
    return try #require(found, "timed out waiting for \(what); output:\n\(child.output)")
}
