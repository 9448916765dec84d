import Foundation
import Testing
import ThaliTestSupport

/// The `thali-node` built beside the test bundle.
func thaliNodePath() -> String? { PackagePaths.thaliNode() }

/// Whether this process may create network namespaces (root, and `ip` present).
var canUseNetworkNamespaces: Bool { TestEnvironment.canUseNetworkNamespaces }

/// Runs a command to completion; throws with its output if it fails.
@discardableResult
func runCommand(_ executable: String, _ arguments: [String]) throws -> String {
    let result = try ChildProcess.run(executable, arguments)
    guard result.status == 0 else {
        throw CommandFailure(command: ([executable] + arguments).joined(separator: " "), output: result.output)
    }
    return result.output
}

struct CommandFailure: Error, CustomStringConvertible {
    let command: String
    let output: String
    var description: String { "\(command) failed: \(output)" }
}

/// A network namespace of this test run, deleted on deinit (so also when a test fails).
final class NetworkNamespace: @unchecked Sendable {
    let name: String

    init(_ name: String) throws {
        self.name = name
        _ = try? runCommand("ip", ["netns", "del", name])  // a leftover of a crashed run with the same pid
        try runCommand("ip", ["netns", "add", name])
        try run("ip", "link", "set", "lo", "up")
    }

    deinit { _ = try? runCommand("ip", ["netns", "del", name]) }

    /// Runs a command inside the namespace to completion.
    @discardableResult
    func run(_ arguments: String...) throws -> String {
        try runCommand("ip", ["netns", "exec", name] + arguments)
    }

    /// Starts a process inside the namespace.
    func spawn(_ executable: String, _ arguments: [String]) throws -> ChildProcess {
        try ChildProcess("ip", ["netns", "exec", name, executable] + arguments)
    }
}

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
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if let line = discoverLines(child).first(where: predicate) { return line }
        try await Task.sleep(for: .milliseconds(20))
    }
    let found = discoverLines(child).first(where: predicate)
    return try #require(found, "timed out waiting for \(what); output:\n\(child.output)")
}
