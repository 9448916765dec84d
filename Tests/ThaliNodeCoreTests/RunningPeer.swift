import Foundation
import Testing
import ThaliTestSupport

/// A long-running `thali-node run` (or any command) started as a ``ChildProcess``, whose standard output
/// is read as JSON lines. Killed and reaped on `kill` and on deinit.
final class RunningPeer: Sendable {
    let label: String
    private let child: ChildProcess

    init(_ label: String, _ executable: String, _ arguments: [String]) throws {
        self.label = label
        child = try ChildProcess(executable, arguments)
        child.closeInput()
    }

    deinit { child.terminate(signal: SIGKILL, grace: .zero) }

    /// The process id.
    var pid: pid_t { child.pid }

    /// Everything printed so far.
    var output: String { child.output }

    /// The JSON lines printed so far.
    var events: [[String: Any]] {
        output.split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
    }

    /// Waits for a JSON line that satisfies `predicate`.
    @discardableResult
    func waitFor(_ what: String, timeout: Duration = .seconds(20),
                 _ predicate: ([String: Any]) -> Bool) async throws -> [String: Any] {
        let clock = ContinuousClock()
        let end = clock.now + timeout
        while clock.now < end {
            if let line = events.first(where: predicate) { return line }
            if hasExited { break }
            try await Task.sleep(for: .milliseconds(50))
        }
        let found = events.first(where: predicate)
        return try #require(found, "\(label): no \(what) within \(timeout); output:\n\(output)")
    }

    /// Whether the process has exited (reaps it).
    var hasExited: Bool { child.exitStatus != nil }

    /// Sends `signal`, waits up to `grace` for the exit (SIGKILL after), reaps; returns the exit code.
    @discardableResult
    func kill(signal: Int32 = SIGTERM, grace: Duration = .seconds(10)) -> Int32 {
        child.terminate(signal: signal, grace: grace)
    }
}

/// `line["event"] == name` and every `fields` value equal (as text).
func isEvent(_ line: [String: Any], _ name: String, _ fields: [String: String] = [:]) -> Bool {
    guard line["event"] as? String == name else { return false }
    return fields.allSatisfy { key, value in line[key].map { "\($0)" } == value }
}
