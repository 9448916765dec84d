import NIOCore

/// The last resort against blocked unicast (`spec/ssdp.md` §7): fetches of
/// ``SSDPDiscoveryLimits/unicastFailureThreshold`` distinct sources that got no TCP connection at all,
/// with no fetch succeeding and no peer reaching us in between, over at least
/// ``SSDPDiscoveryLimits/unicastFailureMinimumSpan`` (``SSDPDiscoveryLimits/unicastFailureMinimumSpanOnceWorked``
/// once unicast has worked in this run). A crowd that saturates its peers makes fetches time out, and
/// connects fail while the peers they aim at are starved; but those peers still reach us, and blocked
/// unicast would stop them too. A streak during which this peer's own event loop ran late by
/// ``SSDPDiscoveryLimits/unicastFailureStarvedLoopLag`` shows our starvation, not blocked unicast: it
/// starts over. A pure value: time, and the count of peers that reached us, are passed in.
struct SSDPUnicastFailureStreak {
    /// What a failed connect concludes.
    enum Verdict: Equatable {
        /// Nothing yet.
        case goingOn
        /// The streak was long enough, but this peer was starved of CPU during it: it starts over
        /// (`sources` had failed).
        case starved(sources: Int)
        /// Unicast is blocked: pause announcing. The streak is over.
        case blocked
    }

    let limits: SSDPDiscoveryLimits
    /// Distinct sources whose fetches failed since the last success.
    private(set) var failingSources: Set<String> = []
    /// When the first of `failingSources` failed.
    private(set) var failingSince: NIODeadline?
    /// Peers that had reached us over unicast when the first of `failingSources` failed: any since then
    /// proves that unicast works.
    private var inboundAtFailingSince = 0
    /// Whether the event loop ran late by `unicastFailureStarvedLoopLag` since the streak started.
    private var loopStarvedDuringStreak = false
    /// When the housekeeping tick last ran (the loop's lateness is measured between ticks).
    private var lastTick: NIODeadline?
    /// Whether a fetch of ours succeeded in this run: unicast has worked here.
    private var anyFetchSucceeded = false

    init(limits: SSDPDiscoveryLimits) {
        self.limits = limits
    }

    /// A fetch succeeded: unicast works, the streak is over.
    mutating func fetchSucceeded() {
        anyFetchSucceeded = true
        failingSources.removeAll()
        failingSince = nil
    }

    /// A fetch from `host` got no TCP connection at `now`, `inbound` peers having reached us so far.
    mutating func connectFailed(from host: String, inbound: Int, now: NIODeadline) -> Verdict {
        // A peer reached us meanwhile: unicast works here, whatever our fetches meet. A new streak starts.
        if failingSince == nil || inbound != inboundAtFailingSince {
            startStreak(at: now, inbound: inbound)
        }
        failingSources.insert(host)
        let unicastHasWorked = anyFetchSucceeded || inbound > 0
        let span = unicastHasWorked ? max(limits.unicastFailureMinimumSpan, limits.unicastFailureMinimumSpanOnceWorked)
                                    : limits.unicastFailureMinimumSpan
        guard let since = failingSince, failingSources.count >= limits.unicastFailureThreshold, now - since >= TimeAmount(span) else {
            return .goingOn
        }
        // Our own loop stopped for a while: the fetches failed because we were not running. Start over.
        if loopStarvedDuringStreak {
            let sources = failingSources.count
            startStreak(at: now, inbound: inbound)
            failingSources.insert(host)
            return .starved(sources: sources)
        }
        failingSources.removeAll()
        failingSince = nil
        return .blocked
    }

    /// The housekeeping tick ran at `now`, `interval` after the one before was due; returns how late it
    /// ran (nil on the first tick).
    mutating func tick(now: NIODeadline, interval: TimeAmount) -> TimeAmount? {
        defer { lastTick = now }
        guard let lastTick else { return nil }
        let lag = now - lastTick - interval
        let limit = TimeAmount(limits.unicastFailureStarvedLoopLag)
        if failingSince != nil, limit > .zero, lag >= limit { loopStarvedDuringStreak = true }
        return lag
    }

    private mutating func startStreak(at now: NIODeadline, inbound: Int) {
        failingSources.removeAll()
        failingSince = now
        inboundAtFailingSince = inbound
        loopStarvedDuringStreak = false
    }
}
