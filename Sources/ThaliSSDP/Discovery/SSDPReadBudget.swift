import NIOCore
import ThaliAdmission

/// What discovery reads of the crowd in all, around the per-source budgets (``SSDPSourceBudgets``): the
/// read budget, past which reading pauses until its window ends and discovery narrows (`spec/ssdp.md`
/// 7.2), and the flood limit, past which discovery switches off for
/// ``SSDPDiscoveryLimits/discoveryCooldown`` (the last resort). A pure value: time is passed in.
struct SSDPReadBudget {
    /// What to do with a datagram read from either socket.
    enum Verdict: Equatable {
        /// Read on: its source's budget is next.
        case read
        /// Dropped unread: discovery is off (a straggler read before the socket closed), or reading is
        /// paused already (a datagram of the batch that went over the budget).
        case dropped
        /// Over the read budget: dropped, and reading pauses until `until` (the end of the window).
        case pauseReading(until: NIODeadline)
    }

    let limits: SSDPDiscoveryLimits
    /// Datagrams read in the current window, from either socket (`maxDatagramsReadPerWindow`).
    private var reads: RateWindow
    /// Datagrams from sources within their budgets in the current window (`maxDatagramsPerWindow`).
    private var flood: RateWindow
    /// Whether reading waits for the end of the window (narrowed by the datagram rate).
    private(set) var isReadingPaused = false
    /// Until when discovery is off after a flood; nil while on. Set until the group is joined again.
    private(set) var discoveryOffUntil: NIODeadline?

    init(limits: SSDPDiscoveryLimits) {
        self.limits = limits
        reads = RateWindow(limit: limits.maxDatagramsReadPerWindow, length: limits.floodWindow)
        flood = RateWindow(limit: limits.maxDatagramsPerWindow, length: limits.floodWindow)
    }

    /// Whether discovery is off after a flood.
    var isDiscoveryOff: Bool { discoveryOffUntil != nil }

    /// A datagram read at `now`, before anything else is known of it.
    mutating func read(now: NIODeadline) -> Verdict {
        guard discoveryOffUntil == nil else { return .dropped }
        // What this process reads of the crowd is bounded first: past it, the kernel drops the rest.
        guard reads.record(now: now) else {
            guard !isReadingPaused else { return .dropped }
            isReadingPaused = true
            return .pauseReading(until: max(now, (reads.start ?? now) + TimeAmount(limits.floodWindow)))
        }
        return .read
    }

    /// The window of a read pause ended: reading goes on.
    mutating func readingResumed() {
        isReadingPaused = false
    }

    /// Counts a datagram its source's budget admitted toward the flood limit; returns when discovery may
    /// come back on, if this one switched it off.
    mutating func countTowardFlood(now: NIODeadline) -> NIODeadline? {
        guard !flood.record(now: now) else { return nil }
        let until = now + TimeAmount(limits.discoveryCooldown)
        discoveryOffUntil = until
        return until
    }

    /// The group was joined again after the cool-down: discovery is on, its flood window new.
    mutating func rejoined() {
        discoveryOffUntil = nil
        flood = RateWindow(limit: limits.maxDatagramsPerWindow, length: limits.floodWindow)
    }
}
