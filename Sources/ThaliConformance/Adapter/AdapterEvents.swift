import Foundation
import NIOConcurrencyHelpers
import NIOCore

/// One event the implementation reported through the adapter's `events` verb: the fields the contract
/// names (spec/conformance.md, "Adapter contract"), absent when the object lacks them or has another type.
public struct AdapterEvent: Sendable, Hashable {
    /// `event`: what happened (`disconnected` is the one the suite grades).
    public var event: String
    /// `contact`: the name the implementation knows the other side by.
    public var contact: String?
    /// `role`: `accepting` when the other side connected, `connecting` when the implementation did.
    public var role: String?
    /// `clean`: for `disconnected`, whether the session ended cleanly.
    public var clean: Bool?
    /// `reason`: in words.
    public var reason: String?
    /// `location`: for `peer_appeared`, where the peer was found (its LOCATION URL over SSDP).
    public var location: String?
    /// `remote`: for `connected` and `disconnected`, the other side's TCP endpoint (`host:port`) as the
    /// implementation sees it: what ties an event to one session.
    public var remote: String?
    /// When the suite read it.
    public var readAt: NIODeadline

    /// The event in one JSON object's line, or nil when the line is not an object with a string `event`.
    public init?(line: some Collection<UInt8>, readAt: NIODeadline) {
        guard let object = try? JSONSerialization.jsonObject(with: Data(line)) as? [String: Any],
              let event = object["event"] as? String else { return nil }
        self.event = event
        contact = object["contact"] as? String
        role = object["role"] as? String
        clean = object["clean"] as? Bool
        reason = object["reason"] as? String
        location = object["location"] as? String
        remote = object["remote"] as? String
        self.readAt = readAt
    }
}

/// The implementation's events, read from the adapter's `events` verb as they come: the verb runs for the
/// whole run and is stopped (SIGTERM) at its end. Bounded: at most ``maxEvents`` are kept (the oldest
/// forgotten) and a line longer than ``maxLineBytes`` ends the reading.
public final class AdapterEventFollower: Sendable {
    /// Events kept; older ones are forgotten.
    public static let maxEvents = 4096
    /// The longest line read.
    public static let maxLineBytes = 1 << 20

    private let process: Process
    private let state = NIOLockedValueBox(State())

    private struct State {
        // A ring: once full, each new event drops the oldest in constant time.
        var events = CircularBuffer<AdapterEvent>(initialCapacity: 64)
        var forgotten = 0
        var ended: String?
    }

    /// Starts `adapter.command + ["events"]`; throws when it cannot be started.
    public init(adapter: ConformanceAdapter) throws {
        guard let executable = adapter.command.first else { throw ConformanceAdapter.Failure(description: "empty adapter command") }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable.contains("/") ? executable : "/usr/bin/env")
        process.arguments = (executable.contains("/") ? [] : [executable]) + Array(adapter.command.dropFirst()) + ["events"]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        process.standardInput = FileHandle.nullDevice
        self.process = process
        try process.run()
        let state = self.state
        let reading = output.fileHandleForReading
        Thread.detachNewThread {
            var pending = [UInt8]()
            var chunk = [UInt8](repeating: 0, count: 64 << 10)
            // read(2) itself: FileHandle's read(upToCount:) waits for the whole count on a pipe.
            while true {
                let got = chunk.withUnsafeMutableBytes { read(reading.fileDescriptor, $0.baseAddress, $0.count) }
                if got < 0 && errno == EINTR { continue }
                guard got > 0 else { break }
                pending.append(contentsOf: chunk.prefix(got))
                var start = 0
                while let newline = pending[start...].firstIndex(of: UInt8(ascii: "\n")) {
                    if let event = AdapterEvent(line: pending[start..<newline], readAt: .now()) {
                        state.withLockedValue { state in
                            state.events.append(event)
                            if state.events.count > Self.maxEvents {
                                state.events.removeFirst()
                                state.forgotten += 1
                            }
                        }
                    }
                    start = newline + 1
                }
                pending.removeFirst(start)
                if pending.count > Self.maxLineBytes {
                    state.withLockedValue { $0.ended = "a line longer than \(Self.maxLineBytes) bytes" }
                    return
                }
            }
            state.withLockedValue { if $0.ended == nil { $0.ended = "the events verb ended" } }
        }
    }

    /// Why the reading ended, nil while it goes on.
    public var ended: String? { state.withLockedValue { $0.ended } }

    /// How many events were read so far (forgotten ones included): a mark for ``first(after:timeout:where:)``.
    public var count: Int { state.withLockedValue { $0.forgotten + $0.events.count } }

    /// The first event read after `mark` (a ``count`` taken earlier) that `matches`, waiting up to
    /// `timeout` for it; nil when none came, or the verb ended first.
    public func first(after mark: Int, timeout: TimeAmount, where matches: @Sendable (AdapterEvent) -> Bool) async -> AdapterEvent? {
        let deadline = NIODeadline.now() + timeout
        while true {
            let (found, ended) = state.withLockedValue { state -> (AdapterEvent?, Bool) in
                let skip = max(0, mark - state.forgotten)
                return (state.events.dropFirst(skip).first(where: matches), state.ended != nil)
            }
            if let found { return found }
            if ended || NIODeadline.now() >= deadline || Task.isCancelled { return nil }
            try? await Task.sleep(nanoseconds: 50_000_000)
        }
    }

    /// Waits up to `timeout` until `condition` holds for every event kept so far; whether it did.
    public func waitUntil(timeout: TimeAmount, _ condition: @Sendable ([AdapterEvent]) -> Bool) async -> Bool {
        let deadline = NIODeadline.now() + timeout
        while true {
            let (holds, ended) = state.withLockedValue { (condition(Array($0.events)), $0.ended != nil) }
            if holds { return true }
            if ended || NIODeadline.now() >= deadline || Task.isCancelled { return false }
            try? await Task.sleep(nanoseconds: 50_000_000)
        }
    }

    /// The events read after `mark` (a ``count`` taken earlier) that are still kept.
    public func events(after mark: Int) -> [AdapterEvent] {
        state.withLockedValue { Array($0.events.dropFirst(max(0, mark - $0.forgotten))) }
    }

    /// Stops the verb (SIGTERM, then SIGKILL after a second).
    public func stop() {
        guard process.isRunning else { return }
        process.terminate()
        let pid = process.processIdentifier
        DispatchQueue.global().asyncAfter(deadline: .now() + 1) { [process] in
            if process.isRunning { kill(pid, SIGKILL) }
        }
        process.waitUntilExit()
    }
}
