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

/// The `events` verb's output as the suite reads it: bytes in, in pieces as they come, cut into lines;
/// each line that is a JSON object with a string `event` is kept, at most `maxEvents` (the oldest
/// forgotten), and the reading ends at the first line longer than `maxLineBytes`, whether its newline
/// has come yet or not, so what is read never depends on how the bytes were split.
///
/// The bytes are the implementation's: anything at all. `AdapterEventFollower` feeds it from the verb's
/// pipe; the `adapter-events` fuzz harness feeds it directly.
package struct AdapterEventLog: Sendable {
    /// Events kept; older ones are forgotten.
    package let maxEvents: Int
    /// The longest line read.
    package let maxLineBytes: Int
    /// The events kept, oldest first (a ring: once full, each new event drops the oldest in constant time).
    package private(set) var events = CircularBuffer<AdapterEvent>(initialCapacity: 64)
    /// How many events were forgotten to keep at most `maxEvents`.
    package private(set) var forgotten = 0
    /// Why the reading ended, nil while it goes on.
    package private(set) var ended: String?
    /// The bytes of the line not ended yet.
    private var pending: [UInt8] = []

    /// An empty log.
    package init(maxEvents: Int, maxLineBytes: Int) {
        self.maxEvents = maxEvents
        self.maxLineBytes = maxLineBytes
    }

    /// How many events were read so far, forgotten ones included.
    package var count: Int { forgotten + events.count }

    /// Reads the next bytes of output, read at `readAt`; nothing once the reading has ended.
    package mutating func read(_ bytes: some Collection<UInt8>, readAt: NIODeadline) {
        guard ended == nil else { return }
        pending.append(contentsOf: bytes)
        var start = 0
        while let newline = pending[start...].firstIndex(of: UInt8(ascii: "\n")) {
            guard newline - start <= maxLineBytes else {
                end(overLimit: true)
                return
            }
            if let event = AdapterEvent(line: pending[start..<newline], readAt: readAt) {
                events.append(event)
                if events.count > maxEvents {
                    events.removeFirst()
                    forgotten += 1
                }
            }
            start = newline + 1
        }
        pending.removeFirst(start)
        if pending.count > maxLineBytes { end(overLimit: true) }
    }

    /// The output ended (the verb exited, or its pipe failed): a last line without its newline is not read.
    package mutating func endOfOutput() {
        if ended == nil { end(overLimit: false) }
    }

    private mutating func end(overLimit: Bool) {
        ended = overLimit ? "a line longer than \(maxLineBytes) bytes" : "the events verb ended"
        pending = []
    }

    /// The events read after `mark` (a ``count`` taken earlier) that are still kept.
    package func events(after mark: Int) -> [AdapterEvent] {
        Array(events.dropFirst(max(0, mark - forgotten)))
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
    private let state = NIOLockedValueBox(AdapterEventLog(maxEvents: maxEvents, maxLineBytes: maxLineBytes))

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
            var chunk = [UInt8](repeating: 0, count: 64 << 10)
            // read(2) itself: FileHandle's read(upToCount:) waits for the whole count on a pipe.
            while true {
                let got = chunk.withUnsafeMutableBytes { read(reading.fileDescriptor, $0.baseAddress, $0.count) }
                if got < 0 && errno == EINTR { continue }
                guard got > 0 else { break }
                let ended = state.withLockedValue { log in
                    log.read(chunk.prefix(got), readAt: .now())
                    return log.ended != nil
                }
                if ended { return }
            }
            state.withLockedValue { $0.endOfOutput() }
        }
    }

    /// Why the reading ended, nil while it goes on.
    public var ended: String? { state.withLockedValue { $0.ended } }

    /// How many events were read so far (forgotten ones included): a mark for ``first(after:timeout:where:)``.
    public var count: Int { state.withLockedValue { $0.count } }

    /// The first event read after `mark` (a ``count`` taken earlier) that `matches`, waiting up to
    /// `timeout` for it; nil when none came, or the verb ended first.
    public func first(after mark: Int, timeout: TimeAmount, where matches: @Sendable (AdapterEvent) -> Bool) async -> AdapterEvent? {
        let deadline = NIODeadline.now() + timeout
        while true {
            let (found, ended) = state.withLockedValue { log -> (AdapterEvent?, Bool) in
                (log.events(after: mark).first(where: matches), log.ended != nil)
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
        state.withLockedValue { $0.events(after: mark) }
    }

    /// The longest ``stop()`` waits for the verb to be seen ending.
    public static let stopTimeout: TimeInterval = 3

    /// Stops the verb (SIGTERM, then SIGKILL after a second), waiting at most ``stopTimeout``: Foundation
    /// sees a child end only once every copy of its descriptors has closed, and a verb that left a child of
    /// its own running (a shell pipeline; the contract asks it to stop what it started) holds them until
    /// that child ends, which would hold the run's end forever.
    public func stop() {
        guard process.isRunning else { return }
        process.terminate()
        let pid = process.processIdentifier
        DispatchQueue.global().asyncAfter(deadline: .now() + 1) { [process] in
            if process.isRunning { kill(pid, SIGKILL) }
        }
        let deadline = Date().addingTimeInterval(Self.stopTimeout)
        while process.isRunning && Date() < deadline { usleep(20_000) }
    }
}
