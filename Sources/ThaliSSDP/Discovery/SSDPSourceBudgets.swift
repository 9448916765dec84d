import NIOCore
import ThaliAdmission

/// What discovery allows each source address before anything global is counted: the seed asks to
/// "filter out excessive requesters" before switching discovery off for everyone, so one host on the
/// segment can only lose its own announcements, never take discovery from the others.
///
/// Per source: a datagram rate (over it, the source's datagrams are dropped before parsing for
/// ``SSDPDiscoveryLimits/sourceRefusalPeriod``, and count toward nothing global), the peers (locations)
/// it may have tracked at once, and consecutive failed beacon fetches (at the threshold the source is
/// ignored for ``SSDPDiscoveryLimits/unicastFailurePause`` instead of pausing our own announcing). A pure
/// value; memory bounded by ``SSDPDiscoveryLimits/maxTrackedSources``.
struct SSDPSourceBudgets: Sendable {
    /// Why a source is ignored.
    enum Refusal: Sendable, Hashable {
        /// It sent more than `maxDatagramsPerSource` datagrams in a window.
        case datagramRate
        /// Its locations failed `sourceFetchFailureThreshold` fetches in a row.
        case fetchFailures
    }

    private struct Source: Sendable {
        var window: RateWindow
        var refusedUntil: NIODeadline?
        var refusal: Refusal?
        var trackedPeers = 0
        var consecutiveFetchFailures = 0
        /// A busy answer asked us not to fetch from it before then.
        var fetchesDeferredUntil: NIODeadline?
        var lastSeen: NIODeadline
    }

    let limits: SSDPDiscoveryLimits
    private var sources: [String: Source] = [:]

    init(limits: SSDPDiscoveryLimits) {
        self.limits = limits
    }

    /// Sources remembered now (at most `maxTrackedSources`).
    var trackedSources: Int { sources.count }

    /// Whether a datagram from `source` at `now` may be read. The first datagram over the rate refuses
    /// the source (the returned refusal is then new: count it once).
    mutating func admitDatagram(from source: String, now: NIODeadline) -> (admitted: Bool, newlyRefused: Bool) {
        var entry = sources[source] ?? Source(window: RateWindow(limit: limits.maxDatagramsPerSource, length: limits.floodWindow),
                                              lastSeen: now)
        entry.lastSeen = now
        defer { store(source, entry, now: now) }
        if let until = entry.refusedUntil {
            if now < until { return (false, false) }
            entry.refusedUntil = nil
            entry.refusal = nil
            entry.consecutiveFetchFailures = 0
        }
        guard entry.window.record(now: now) else {
            entry.refusedUntil = now + TimeAmount(limits.sourceRefusalPeriod)
            entry.refusal = .datagramRate
            return (false, true)
        }
        return (true, false)
    }

    /// Whether `source` is being ignored at `now` (for either reason).
    func isRefused(_ source: String, now: NIODeadline) -> Bool {
        sources[source]?.refusedUntil.map { now < $0 } ?? false
    }

    /// Whether `source` may have one more peer tracked.
    func mayTrackAnotherPeer(from source: String) -> Bool {
        (sources[source]?.trackedPeers ?? 0) < limits.maxPeersPerSource
    }

    /// A peer at `source` started being tracked.
    mutating func peerTracked(at source: String, now: NIODeadline) {
        var entry = sources[source] ?? Source(window: RateWindow(limit: limits.maxDatagramsPerSource, length: limits.floodWindow),
                                              lastSeen: now)
        entry.trackedPeers += 1
        store(source, entry, now: now)
    }

    /// A peer at `source` is no longer tracked.
    mutating func peerLeft(at source: String) {
        guard var entry = sources[source], entry.trackedPeers > 0 else { return }
        entry.trackedPeers -= 1
        sources[source] = entry
    }

    /// `source` answered busy: no fetch of it before `until`. Not a failure.
    mutating func deferFetches(from source: String, until: NIODeadline) {
        guard var entry = sources[source] else { return }
        entry.fetchesDeferredUntil = max(entry.fetchesDeferredUntil ?? until, until)
        sources[source] = entry
    }

    /// When fetches of `source` may start again, if a busy answer postponed them past `now`.
    func fetchesDeferred(from source: String, now: NIODeadline) -> NIODeadline? {
        sources[source]?.fetchesDeferredUntil.flatMap { now < $0 ? $0 : nil }
    }

    /// A beacon fetch from `source` succeeded.
    mutating func fetchSucceeded(at source: String) {
        sources[source]?.consecutiveFetchFailures = 0
    }

    /// A beacon fetch from `source` failed; true when this refuses the source (count it once).
    mutating func fetchFailed(at source: String, now: NIODeadline) -> Bool {
        guard var entry = sources[source] else { return false }
        defer { sources[source] = entry }
        entry.consecutiveFetchFailures += 1
        guard entry.consecutiveFetchFailures >= limits.sourceFetchFailureThreshold, entry.refusedUntil == nil else { return false }
        entry.refusedUntil = now + TimeAmount(limits.unicastFailurePause)
        entry.refusal = .fetchFailures
        return true
    }

    /// Stores `entry`, making room first when `source` is new and the table is full: sources with no
    /// tracked peer and no refusal in force go first, least recently seen first, an eighth at a time.
    private mutating func store(_ source: String, _ entry: Source, now: NIODeadline) {
        if sources[source] == nil, sources.count >= limits.maxTrackedSources {
            let idle = sources.filter { $0.value.trackedPeers == 0 && !($0.value.refusedUntil.map { now < $0 } ?? false) }
                .sorted { $0.value.lastSeen < $1.value.lastSeen }
            for (key, _) in idle.prefix(max(1, limits.maxTrackedSources / 8)) { sources[key] = nil }
            // Every remembered source holds a peer or a refusal: forget the oldest anyway.
            if sources.count >= limits.maxTrackedSources,
               let oldest = sources.min(by: { $0.value.lastSeen < $1.value.lastSeen }) {
                sources[oldest.key] = nil
            }
        }
        sources[source] = entry
    }
}
