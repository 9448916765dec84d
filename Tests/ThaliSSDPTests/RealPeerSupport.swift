import Foundation
import Testing
import ThaliTestSupport

/// The `thali-node` built beside the test bundle.
func thaliNodePath() -> String? { PackagePaths.thaliNode() }

/// Whether this process may create network namespaces (root, and `ip` present).
var canUseNetworkNamespaces: Bool { TestEnvironment.canUseNetworkNamespaces }

/// The JSON lines a `thali-node discover` printed so far.
func discoverLines(_ child: ChildProcess) -> [[String: Any]] {
    child.output.split(separator: "\n").compactMap {
        try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
    }
}

/// Waits until a `thali-node discover` printed a line matching `predicate`.
@discardableResult
func waitForLine(_ child: ChildProcess, timeout: Duration = .seconds(5), _ what: String,
                 _ predicate: ([String: Any]) -> Bool) async throws -> [String: Any] {
    let found = try await waitForValue(timeout: timeout) { discoverLines(child).first(where: predicate) }
    return try #require(found, "timed out waiting for \(what); output:\n\(child.output)")
}
