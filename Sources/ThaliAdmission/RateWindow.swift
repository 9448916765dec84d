import NIOCore

/// Counts events in fixed windows of `length`: the suite's one rate counter (connections per source and
/// in all, SSDP datagrams, Bluetooth advertisements). A window starts with the first event after the
/// previous one ended. O(1) per event, no allocation; the owner passes the time in.
public struct RateWindow: Sendable, Hashable {
    /// Events allowed per window.
    public let limit: Int
    /// How long a window lasts.
    public let length: Duration
    /// When the current window started (nil before the first event or after ``restart()``).
    public private(set) var start: NIODeadline?
    /// Events counted in the current window.
    public private(set) var count = 0

    /// A counter allowing `limit` events per `length`.
    public init(limit: Int, length: Duration) {
        self.limit = limit
        self.length = length
    }

    /// Whether another event at the current count would exceed `limit`.
    public var isFull: Bool { count >= limit }

    /// Starts a new window at `now` when there is none or the current one has ended.
    public mutating func advance(to now: NIODeadline) {
        if let start, now - start < TimeAmount(length) { return }
        start = now
        count = 0
    }

    /// Counts one event in the current window (call ``advance(to:)`` first).
    public mutating func add() {
        count += 1
    }

    /// Forgets the current window: the next event starts a new one.
    public mutating func restart() {
        start = nil
        count = 0
    }

    /// Takes one event back from the current window (an event that turned out not to count).
    public mutating func remove() {
        count = max(0, count - 1)
    }

    /// Empties the current window without moving its start.
    public mutating func empty() {
        count = 0
    }

    /// Records one event at `now`; false when it exceeds the window's limit.
    public mutating func record(now: NIODeadline) -> Bool {
        advance(to: now)
        count += 1
        return count <= limit
    }
}
