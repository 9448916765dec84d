import NIOCore

/// The denial-of-service bounds of discovery (the seed's "Denial of Service" and "Local Wi-Fi Binding"
/// sections). Each has a counter in `SSDPDiscoveryCounters` that shows when it fired.
///
/// Per source address first, then global: a source over its budget is ignored alone (its datagrams are
/// dropped before parsing and count toward nothing global), so one host cannot switch discovery off for
/// everyone; past the bounds a crowd of honest peers reaches (the multicast datagrams read, the peers
/// tracked), discovery narrows to a sample instead of switching off (`spec/ssdp.md` 7.2); the global
/// flood limit is the last resort against many sources at once.
public struct SSDPDiscoveryLimits: Sendable {
    /// Length of the window over which received datagrams are counted, per source and in all.
    public var floodWindow: Duration = .seconds(1)
    /// Datagrams from one source address per `floodWindow`; beyond it the source is ignored for
    /// `sourceRefusalPeriod`. An honest peer sends 2 alives per second in the foreground, a byebye and an
    /// alive per beacon change, and search answers: 50 leaves room for a few peers behind one address.
    public var maxDatagramsPerSource: Int = 50
    /// How long a source over `maxDatagramsPerSource` is ignored.
    public var sourceRefusalPeriod: Duration = .seconds(60)
    /// Peers (locations) tracked at once from one source address; more from it are not tracked (counted
    /// in `peersRejectedPerSource`). A host runs a few peers at most.
    public var maxPeersPerSource: Int = 8
    /// Consecutive failed beacon fetches from one source's locations after which that source is ignored
    /// for `unicastFailurePause` (closed ports, a peer that never answers); our own announcing goes on.
    public var sourceFetchFailureThreshold: Int = 3
    /// Source addresses remembered (bounds the per-source state); idle ones are forgotten first.
    public var maxTrackedSources: Int = 4096
    /// Datagrams read per `floodWindow` from either socket, from anyone: past it discovery narrows
    /// (`spec/ssdp.md` 7.2) and stops reading until the window ends, so the kernel drops the rest of the
    /// crowd's announcements (and of the answers to our search) at the sockets' buffers and this process
    /// pays for this many at most. The sockets stay open: what is read is a sample of the crowd in time,
    /// and as every peer repeats its alive (twice a second in the foreground) each one is heard within a
    /// few windows. 1,000 a second is 500 peers at the foreground rate (`spec/ssdp.md` 7.2 for its cost).
    public var maxDatagramsReadPerWindow: Int = 1000
    /// Datagrams from sources within their budgets, in all, per `floodWindow`, beyond which discovery is
    /// switched off (the last resort against many sources at once): the multicast socket is closed, so
    /// the kernel drops the flood instead of this process. It only fires where it is set below
    /// `maxDatagramsReadPerWindow`, which narrows reading first.
    public var maxDatagramsPerWindow: Int = 2000
    /// How long discovery stays off after a flood (`maxDatagramsPerWindow`).
    public var discoveryCooldown: Duration = .seconds(60)
    /// The most peers tracked at once (the seed: "configured with some maximum number of devices"). When
    /// the table is full, discovery narrows instead of switching off (`spec/ssdp.md` 7.2): a new peer takes
    /// the place of the tracked peer whose beacons were read longest ago (reported as it left,
    /// `.narrowed`), whose USN is then remembered as read (`maxRememberedReadPeers`) and not tracked or
    /// fetched again; while no tracked peer is read yet, new ones are not tracked (`peersRejectedAtCap`)
    /// and heard again on their next alive. A crowd larger than the table is so read a sample at a time,
    /// each peer once per USN, with at most this many tracked.
    public var maxTrackedPeers: Int = 1024
    /// USNs of peers given up by a full table after their beacons were read, remembered (by a 64-bit hash,
    /// about 16 bytes each) so that their next alive does not bring them back to be fetched again; the
    /// oldest are forgotten first. 16,384 covers a hall of 10,000 (`spec/ssdp.md` 7.2); beyond it the
    /// oldest reads are repeated once per cycle through the crowd.
    public var maxRememberedReadPeers: Int = 16384
    /// Distinct sources whose fetches failed in a row without a TCP connection (refused, unreachable,
    /// or no answer to the connect), with no success in between and over at least
    /// `unicastFailureMinimumSpan`, after which this peer concludes that unicast is blocked on this
    /// network and stops announcing for `unicastFailurePause`. Failures from one source count once: a
    /// host with closed ports is ignored alone (`sourceFetchFailureThreshold`), it cannot pause our
    /// announcing; fetches that connected and then failed (timed out, closed early) count not at all.
    public var unicastFailureThreshold: Int = 8
    /// How long the failures of `unicastFailureThreshold` sources must go on, with no success, before
    /// announcing pauses: blocked unicast fails for as long as it lasts, while a peer starved of CPU
    /// for a moment (a crowd on a small device) sees a burst of connects fail together and then
    /// succeed. Default 20 s; zero pauses at the threshold at once.
    public var unicastFailureMinimumSpan: Duration = .seconds(20)
    /// The span instead of `unicastFailureMinimumSpan` once unicast has worked in this run (a fetch
    /// succeeded, or a peer reached us): a network that carried unicast rarely starts blocking it, while
    /// a crowd that saturates its peers can make every fetch fail for a while and reach us no more once
    /// it has read our beacons; 500 honest peers on 2 loaded cores drove some peers past 20 s (spec/ssdp.md
    /// 7.1). Default 120 s; never shorter than `unicastFailureMinimumSpan` in effect.
    public var unicastFailureMinimumSpanOnceWorked: Duration = .seconds(120)
    /// How late this peer's own event loop may run during a failure streak before the streak is read as
    /// this device's starvation rather than blocked unicast. Lateness is measured for free on the
    /// housekeeping tick (every `housekeepingInterval`): a loop that runs that tick this much later than
    /// due was not running at all, and the connects and fetches it had in flight failed for that reason.
    /// A streak in which the loop ran this late starts over instead of pausing announcing: blocked unicast
    /// fails on a device that keeps time, oversubscription fails on one that does not. Default 250 ms
    /// (a loop a few milliseconds late is the normal case); zero turns the check off.
    public var unicastFailureStarvedLoopLag: Duration = .milliseconds(250)
    /// How long announcements pause when unicast to many sources fails, and how long a source whose
    /// fetches keep failing is ignored.
    public var unicastFailurePause: Duration = .seconds(60)
    /// After a peer's beacon fetch failed (every attempt of it, or not made because its source was being
    /// ignored), how long until an alive of the same USN fetches it again; doubled per failure in a row
    /// up to `maxFailedFetchRetryDelay`. A USN is otherwise fetched once: a peer whose beacons do not
    /// change (one item left for us) would stay unread after one failure in a crowd.
    public var failedFetchRetryDelay: Duration = .seconds(2)
    /// The longest wait before a failed fetch is tried again (a location that never answers costs one
    /// fetch per this period, and its source's refusal, `sourceFetchFailureThreshold`, comes first).
    public var maxFailedFetchRetryDelay: Duration = .seconds(60)
    /// Beacon fetches in flight at once; others wait in a queue no longer than `maxTrackedPeers`.
    public var maxConcurrentFetches: Int = 4
    /// How far a crowd spreads its fetches of one peer's new beacons, per peer tracked: each fetch of a
    /// new USN waits a random time below `trackedPeers × fetchSpreadPerPeer` (at most `maxFetchSpread`).
    /// Every listener hears a changed USN in the same instant; without the wait a crowd of n fetches it
    /// at once, and past the beacon server's global rate (200 connections a second by default) honest
    /// peers close its port. With it a peer is fetched about `1 / fetchSpreadPerPeer` times a second
    /// (100 by default) whatever the crowd's size. Zero: fetch at once.
    public var fetchSpreadPerPeer: Duration = .milliseconds(10)
    /// The longest wait `fetchSpreadPerPeer` adds: it bounds how late a changed beacon is read. Above
    /// `maxTrackedPeers × fetchSpreadPerPeer` (10.24 s) by default, so the spread holds for every crowd a
    /// peer tracks.
    public var maxFetchSpread: Duration = .seconds(15)
    /// Search answers waiting for their random delay at once; more M-SEARCHes are not answered.
    public var maxPendingSearchResponses: Int = 16
    /// Source addresses remembered as a contact's (their beacons matched one, `SSDPDiscoveryService.markContact(at:)`),
    /// the latest first: their peers keep their places in a full table and their fetches go first
    /// (`spec/ssdp.md` 7.2). 256 covers an address book; a few bytes each.
    public var maxContactSources: Int = 256
    /// How long discovery must go without narrowing (no read pause, the table below seven eighths of
    /// `maxTrackedPeers`) before a new narrowing is reported again as `.limitTriggered(.narrowed)`: one
    /// report per episode, not one per window of a hall that keeps the budget full.
    public var narrowingEpisodeGap: Duration = .seconds(10)

    /// The defaults above.
    public init() {}

    /// How long the fetch of a new USN waits while `trackedPeers` are tracked: a draw from `generator`
    /// below `trackedPeers × fetchSpreadPerPeer`, capped at `maxFetchSpread` (zero when either is zero).
    public func fetchDelay(trackedPeers: Int, using generator: inout some RandomNumberGenerator) -> Duration {
        guard fetchSpreadPerPeer > .zero, maxFetchSpread > .zero, trackedPeers > 0 else { return .zero }
        let perPeer = TimeAmount(fetchSpreadPerPeer).nanoseconds, cap = TimeAmount(maxFetchSpread).nanoseconds
        let (product, overflow) = perPeer.multipliedReportingOverflow(by: Int64(trackedPeers))
        let window = overflow ? cap : min(cap, product)
        return .nanoseconds(Int64.random(in: 0..<window, using: &generator))
    }
}

/// What discovery has counted since it started; read with `SSDPDiscoveryService.counters()`.
public struct SSDPDiscoveryCounters: Hashable, Sendable {
    /// Datagrams read from either socket.
    public var datagramsReceived = 0
    /// Datagrams the parser rejected (`SSDPParseError`).
    public var malformedDatagrams = 0
    /// Well-formed messages for another notification type (other UPnP devices), ignored quietly.
    public var foreignMessagesIgnored = 0
    /// Our own announcements heard back through multicast loopback.
    public var ownMessagesIgnored = 0
    /// Thali announcements whose LOCATION host differed from the datagram's source, or was unusable.
    public var spoofedLocationsIgnored = 0
    /// Times a flood switched discovery off.
    public var floodShutdowns = 0
    /// Times the table filled up (`maxTrackedPeers`, from below seven eighths of it) and discovery started
    /// narrowing to a sample.
    public var peerCapNarrowings = 0
    /// Tracked peers, their beacons read, that gave their place to a new one in a full table.
    public var peersGivenUpAtCap = 0
    /// New peers not tracked because the table was full and none of its peers' beacons were read yet.
    public var peersRejectedAtCap = 0
    /// Alives of peers not tracked again because their USN's beacons were read before a full table gave
    /// them up (`maxRememberedReadPeers`).
    public var alreadyReadPeersIgnored = 0
    /// Windows in which reading stopped at `maxDatagramsReadPerWindow`.
    public var readPauses = 0
    /// Narrowing episodes (a full table or read pauses, `narrowingEpisodeGap` apart), each reported once
    /// as `.limitTriggered(.narrowed)`.
    public var narrowingEpisodes = 0
    /// Busy answers (`503` with `Retry-After`) to our fetches: each postponed its source's fetches, none
    /// counted as a failure (`spec/ssdp.md` 6.1).
    public var busyAnswersReceived = 0
    /// M-SEARCHes sent.
    public var searchesSent = 0
    /// Unicast search answers sent.
    public var searchResponsesSent = 0
    /// M-SEARCHes not answered because `maxPendingSearchResponses` answers were already waiting.
    public var searchResponsesDropped = 0
    /// Alive announcements sent.
    public var alivesSent = 0
    /// Byebye announcements sent.
    public var byebyesSent = 0
    /// Times discovery moved to a new interface address (``SSDPDiscoveryService/move(to:port:)``).
    public var interfaceMoves = 0
    /// Byebyes for the old location that could not leave because the old address was gone already.
    public var byebyesUnsent = 0
    /// Beacon fetches that returned a body (or 204).
    public var beaconFetchesSucceeded = 0
    /// Beacon fetches that failed after their retries.
    public var beaconFetchesFailed = 0
    /// Times announcing paused because every unicast to discovered peers failed.
    public var unicastFailurePauses = 0
    /// Failure streaks long enough for the `unicastFailure` last resort that started over instead, because
    /// this peer's own event loop ran late by `unicastFailureStarvedLoopLag` or more during them.
    public var unicastFailureStreaksStarved = 0
    /// The latest this peer's event loop has run its housekeeping tick, beyond `housekeepingInterval`,
    /// in milliseconds: how starved of CPU the peer has been.
    public var worstLoopLagMilliseconds = 0
    /// Failed beacon fetches by kind, not-made ones included (a busy answer is none).
    public var beaconFetchFailuresByKind: [BeaconFetchFailure.Kind: Int] = [:]
    /// Datagrams dropped unread because their source was being ignored.
    public var datagramsFromIgnoredSources = 0
    /// Sources ignored for exceeding `maxDatagramsPerSource`.
    public var sourcesIgnoredForRate = 0
    /// Sources ignored because their fetches kept failing (`sourceFetchFailureThreshold`).
    public var sourcesIgnoredForFetchFailures = 0
    /// New peers not tracked because their source had `maxPeersPerSource` already.
    public var peersRejectedPerSource = 0
    /// Queued fetches skipped because their source was being ignored.
    public var fetchesSkippedForIgnoredSources = 0

    /// All zero.
    public init() {}
}
