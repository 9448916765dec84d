import NIOCore

/// Counts events in fixed windows: `record` says whether the event is still within `limit` for the
/// current window. O(1) per event, no allocation.
struct RateWindow: Sendable {
    let limit: Int
    let length: TimeAmount
    private var windowStart: NIODeadline = .uptimeNanoseconds(0)
    private var count = 0

    init(limit: Int, length: TimeAmount) {
        self.limit = limit
        self.length = length
    }

    /// Records one event at `now`; false when it exceeds the window's limit.
    mutating func record(now: NIODeadline) -> Bool {
        if now - windowStart >= length {
            windowStart = now
            count = 0
        }
        count += 1
        return count <= limit
    }
}
