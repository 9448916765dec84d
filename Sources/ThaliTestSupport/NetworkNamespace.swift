import Foundation

/// Runs a command to completion; throws with its output if it fails.
@discardableResult
public func runCommand(_ executable: String, _ arguments: [String]) throws -> String {
    let result = try ChildProcess.run(executable, arguments)
    guard result.status == 0 else {
        throw CommandFailure(command: ([executable] + arguments).joined(separator: " "), output: result.output)
    }
    return result.output
}

/// A command that exited with a non-zero status.
public struct CommandFailure: Error, CustomStringConvertible {
    /// The command line.
    public let command: String
    /// What it printed.
    public let output: String
    /// The command and its output.
    public var description: String { "\(command) failed: \(output)" }
}

/// A network namespace of this test run, deleted on deinit (so also when a test fails).
public final class NetworkNamespace: @unchecked Sendable {
    /// The namespace's name (`ip netns`).
    public let name: String

    /// Creates the namespace `name` (deleting a leftover of that name first) with its loopback up.
    public init(_ name: String) throws {
        self.name = name
        _ = try? runCommand("ip", ["netns", "del", name])  // a leftover of a crashed run with the same pid
        try runCommand("ip", ["netns", "add", name])
        try run("ip", "link", "set", "lo", "up")
    }

    deinit { _ = try? runCommand("ip", ["netns", "del", name]) }

    /// Runs a command inside the namespace to completion.
    @discardableResult
    public func run(_ arguments: String...) throws -> String {
        try runCommand("ip", ["netns", "exec", name] + arguments)
    }

    /// Starts a process inside the namespace.
    public func spawn(_ executable: String, _ arguments: [String]) throws -> ChildProcess {
        try ChildProcess("ip", ["netns", "exec", name, executable] + arguments)
    }
}
