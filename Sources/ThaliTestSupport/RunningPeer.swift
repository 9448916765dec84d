import Foundation

/// A long-running `thali-node run` (or any command) started as a ``ChildProcess``, whose standard output
/// is read as JSON lines. Killed and reaped on `kill` and on deinit.
public final class RunningPeer: Sendable {
    /// A JSON line that did not appear in time.
    public struct NotSeen: Error, CustomStringConvertible {
        public let description: String
    }

    /// Names the process in failures.
    public let label: String
    private let child: ChildProcess

    /// Starts `executable` with `arguments` (and `environment` added to this process's), input closed.
    public init(_ label: String, _ executable: String, _ arguments: [String], environment: [String: String]? = nil) throws {
        self.label = label
        child = try ChildProcess(executable, arguments, environment: environment)
        child.closeInput()
    }

    deinit { child.terminate(signal: SIGKILL, grace: .zero) }

    /// The process id.
    public var pid: pid_t { child.pid }

    /// Everything printed so far.
    public var output: String { child.output }

    /// The JSON lines printed so far.
    public var events: [[String: Any]] {
        output.split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
    }

    /// Waits for a JSON line that satisfies `predicate`.
    @discardableResult
    public func waitFor(_ what: String, timeout: Duration = .seconds(20),
                 _ predicate: ([String: Any]) -> Bool) async throws -> [String: Any] {
        let clock = ContinuousClock()
        let end = clock.now + timeout
        while clock.now < end {
            if let line = events.first(where: predicate) { return line }
            if hasExited { break }
            try await Task.sleep(for: .milliseconds(50))
        }
        guard let found = events.first(where: predicate) else {
            throw NotSeen(description: "\(label): no \(what) within \(timeout); output:\n\(output)")
        }
        return found
    }

    /// Whether the process has exited (reaps it).
    public var hasExited: Bool { child.exitStatus != nil }

    /// Sends `signal`, waits up to `grace` for the exit (SIGKILL after), reaps; returns the exit code.
    @discardableResult
    public func kill(signal: Int32 = SIGTERM, grace: Duration = .seconds(10)) -> Int32 {
        child.terminate(signal: signal, grace: grace)
    }
}

/// `line["event"] == name` and every `fields` value equal (as text).
public func isEvent(_ line: [String: Any], _ name: String, _ fields: [String: String] = [:]) -> Bool {
    guard line["event"] as? String == name else { return false }
    return fields.allSatisfy { key, value in line[key].map { "\($0)" } == value }
}
