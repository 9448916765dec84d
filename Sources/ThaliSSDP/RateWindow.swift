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

/// `RateWindow`s per key (a requester's address), holding at most `maxKeys` keys so that a spray of
/// source addresses cannot grow it: when full, the table is reset (a spray is itself caught by the
/// global limit).
struct KeyedRateWindows<Key: Hashable & Sendable>: Sendable {
    let limit: Int
    let length: TimeAmount
    let maxKeys: Int
    private var windows: [Key: RateWindow] = [:]

    init(limit: Int, length: TimeAmount, maxKeys: Int) {
        self.limit = limit
        self.length = length
        self.maxKeys = maxKeys
    }

    /// Keys remembered now (at most `maxKeys`).
    var trackedKeys: Int { windows.count }

    mutating func record(_ key: Key, now: NIODeadline) -> Bool {
        if windows[key] == nil && windows.count >= maxKeys { windows.removeAll(keepingCapacity: true) }
        return windows[key, default: RateWindow(limit: limit, length: length)].record(now: now)
    }
}
