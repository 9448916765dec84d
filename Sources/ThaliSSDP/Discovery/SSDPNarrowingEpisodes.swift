import NIOCore

/// When discovery narrows (a full table, or reading paused by its budget; `spec/ssdp.md` 7.2), and when
/// that is news: an episode is reported once, and ends ``SSDPDiscoveryLimits/narrowingEpisodeGap`` after
/// its last sign; the table counts as filling up again only once it fell below seven eighths of
/// ``SSDPDiscoveryLimits/maxTrackedPeers``. A pure value: time is passed in.
struct SSDPNarrowingEpisodes {
    /// What a sign of narrowing is news of.
    struct News: Equatable {
        /// A new episode: report it (`.limitTriggered(.narrowed)`).
        var startsEpisode: Bool
        /// The table filled up from below seven eighths of the cap (a full table's signs only).
        var fillsTable: Bool
    }

    let maxTrackedPeers: Int
    let episodeGap: TimeAmount
    /// Whether the table is full and narrowing (counted once per time it fills up).
    private(set) var isTableFull = false
    /// Whether discovery is in a narrowing episode.
    private(set) var isInEpisode = false
    private var lastSign: NIODeadline?

    init(limits: SSDPDiscoveryLimits) {
        maxTrackedPeers = limits.maxTrackedPeers
        episodeGap = TimeAmount(limits.narrowingEpisodeGap)
    }

    /// Reading paused by its budget at `now`.
    mutating func readingPaused(now: NIODeadline) -> News {
        News(startsEpisode: sign(now: now), fillsTable: false)
    }

    /// The full table gave a place up, or refused a newcomer, at `now`.
    mutating func tableFull(now: NIODeadline) -> News {
        let startsEpisode = sign(now: now)
        defer { isTableFull = true }
        return News(startsEpisode: startsEpisode, fillsTable: !isTableFull)
    }

    /// The housekeeping tick at `now` with `trackedPeers` in the table. Below seven eighths of the cap the
    /// table no longer narrows: the few peers a hall's table loses to expiry between refills do not count
    /// (and log) a new narrowing each time.
    mutating func housekeeping(trackedPeers: Int, now: NIODeadline) {
        if isTableFull, trackedPeers < maxTrackedPeers - maxTrackedPeers / 8 { isTableFull = false }
        if isInEpisode, !isTableFull, let lastSign, now - lastSign >= episodeGap { isInEpisode = false }
    }

    /// A sign of narrowing at `now`; true when it starts an episode.
    private mutating func sign(now: NIODeadline) -> Bool {
        lastSign = now
        guard !isInEpisode else { return false }
        isInEpisode = true
        return true
    }
}
