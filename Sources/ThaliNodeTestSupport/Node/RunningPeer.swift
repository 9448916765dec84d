import Foundation
import ThaliNodeCore
import ThaliTestSupport

/// A long-running `thali-node run` (or `thali-node events`) started as a ``ChildProcess``, whose standard
/// output is read as event lines (``NodeEvent``). Killed and reaped on `kill` and on deinit.
public final class RunningPeer: Sendable {
    /// An event that did not come in time, or a line that is JSON but no event this version knows.
    public struct NotSeen: Error, CustomStringConvertible {
        public let description: String
    }

    /// One event line: the event, and `t`, the seconds since the run started.
    public struct Line: Sendable, Hashable {
        /// `t`: seconds since the run started (every line `run` prints has it).
        public var t: Double?
        /// The event.
        public var event: NodeEvent
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

    /// The whole lines printed so far, read: each an event line, a line that is JSON but not an event
    /// (a failure: the decoder misses something the node prints), or not JSON at all (readable output:
    /// skipped).
    private var read: (lines: [Line], undecodable: [String]) {
        var lines: [Line] = [], undecodable: [String] = []
        let output = output
        // The last line is whole only once its newline came.
        for text in output.split(separator: "\n").dropLast(output.hasSuffix("\n") ? 0 : 1) {
            do {
                let record = try PeerEventRecord(jsonLine: Data(text.utf8))
                lines.append(Line(t: record.t, event: try NodeEvent(record)))
            } catch NodeEventDecodingError.malformed {
                continue
            } catch {
                undecodable.append("\(error): \(text)")
            }
        }
        return (lines, undecodable)
    }

    /// The event lines printed so far.
    public var lines: [Line] { read.lines }

    /// The events printed so far.
    public var events: [NodeEvent] { read.lines.map(\.event) }

    /// Waits for an event line that satisfies `predicate`; fails at once when a line is JSON that does
    /// not decode as an event.
    @discardableResult
    public func waitForLine(_ what: String, timeout: Duration = .seconds(20), _ predicate: (Line) -> Bool) async throws -> Line {
        struct Exited: Error {}
        do {
            let found = try await waitForValue(timeout: timeout, every: .milliseconds(50)) { () throws -> Line? in
                let (lines, undecodable) = read
                if let bad = undecodable.first { throw NotSeen(description: "\(label): a line that is no event: \(bad)") }
                if let line = lines.first(where: predicate) { return line }
                if hasExited { throw Exited() }  // nothing more will come
                return nil
            }
            if let found { return found }
        } catch is Exited {}
        if let line = read.lines.first(where: predicate) { return line }
        throw NotSeen(description: "\(label): no \(what) within \(timeout); output:\n\(output)")
    }

    /// Waits for an event that satisfies `predicate` (see ``waitForLine(_:timeout:_:)``).
    @discardableResult
    public func waitFor(_ what: String, timeout: Duration = .seconds(20), _ predicate: (NodeEvent) -> Bool) async throws -> NodeEvent {
        try await waitForLine(what, timeout: timeout) { predicate($0.event) }.event
    }

    /// Waits for a whole line of output (readable, not an event) that contains `text`, and returns it.
    @discardableResult
    public func waitForOutputLine(containing text: String, timeout: Duration = .seconds(30)) async throws -> Substring {
        struct Exited: Error {}
        func line() -> Substring? { output.split(separator: "\n").first { $0.contains(text) } }
        do {
            let found = try await waitForValue(timeout: timeout, every: .milliseconds(50)) { () throws -> Substring? in
                if let found = line() { return found }
                if hasExited { throw Exited() }  // nothing more will come
                return nil
            }
            if let found { return found }
        } catch is Exited {}
        if let found = line() { return found }
        throw NotSeen(description: "\(label): no line with \(text) within \(timeout); output:\n\(output)")
    }

    /// Whether the process has exited (reaps it).
    public var hasExited: Bool { child.exitStatus != nil }

    /// Sends `signal`, waits up to `grace` for the exit (SIGKILL after), reaps; returns the exit code.
    @discardableResult
    public func kill(signal: Int32 = SIGTERM, grace: Duration = .seconds(10)) -> Int32 {
        child.terminate(signal: signal, grace: grace)
    }
}

extension NodeEvent {
    /// Whether this is a `started` line.
    public var isStarted: Bool { if case .started = self { true } else { false } }

    /// The location of a `started` line.
    public var startedLocation: PeerLocation? { if case .started(let location) = self { location } else { nil } }

    /// The delivery event of a delivery line (`offered`, `progress`, `received`, ...).
    public var deliveryEvent: Delivery? { if case .delivery(_, let delivery) = self { delivery } else { nil } }

    /// The item of a `received` line.
    public var receivedItem: Item? { if case .delivery(_, .received(let item)) = self { item } else { nil } }

    /// The item id of a `delivered` line.
    public var deliveredID: UUID? { if case .delivery(_, .delivered(let id, _)) = self { id } else { nil } }

    /// A `progress` line's item, bytes and total.
    public var progress: (id: UUID, bytes: UInt64, total: UInt64)? {
        if case .delivery(_, .progress(let id, let bytes, let total)) = self { (id, bytes, total) } else { nil }
    }

    /// A `transfer_started` line's item and offset.
    public var transferStart: (id: UUID, offset: UInt64)? {
        if case .delivery(_, .transferStarted(let id, let offset, _)) = self { (id, offset) } else { nil }
    }

    /// Whether this is a `duplicate` line.
    public var isDuplicate: Bool { if case .delivery(_, .duplicate) = self { true } else { false } }

    /// The item of a `duplicate` line: offered again after its answer was lost with a broken session.
    public var duplicateID: UUID? { if case .delivery(_, .duplicate(let id)) = self { id } else { nil } }

    /// The snapshot of a `status` line.
    public var statusSnapshot: Status? { if case .status(let status) = self { status } else { nil } }

    /// The reason of a `stopped` line.
    public var stopReason: String? { if case .stopped(let reason) = self { reason } else { nil } }
}
