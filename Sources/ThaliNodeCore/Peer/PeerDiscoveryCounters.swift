import ThaliSSDP

/// What discovery has done since the peer started, over every binding, for ``PeerStatus``: how often
/// this peer read other peers' beacons, and how often that failed. In a crowd every peer reads every
/// other's beacons once per change, so these grow with the crowd squared; a failure share that grows
/// too means the crowd overloads its peers.
public struct PeerDiscoveryCounters: Sendable, Hashable, Codable {
    /// Beacon streams read (a fetch that succeeded, over Wi-Fi; a stream read, over Bluetooth).
    public var beaconFetches = 0
    /// Beacon fetches that failed after their retries, or were not made because their source was
    /// being ignored.
    public var beaconFetchFailures = 0
    /// ``beaconFetchFailures`` by kind: which say that nothing answered, and which that a peer answered
    /// too late or not at all usefully.
    public var beaconFetchFailuresByKind: [BeaconFetchFailure.Kind: Int] = [:]

    /// Over Wi-Fi: how SSDP discovery itself has fared (nil without the Wi-Fi binding).
    public var ssdp: PeerSSDPHealth?

    /// All zero.
    public init() {}
}

/// What a user in a crowd can act on among SSDP discovery's counters (ThaliSSDP's
/// `SSDPDiscoveryCounters`): whether this peer's own loop is starved of CPU, and what discovery gave up
/// to stay within its limits. `spec/ssdp.md` explains each limit.
public struct PeerSSDPHealth: Sendable, Hashable, Codable {
    /// The latest discovery's loop has run its housekeeping tick, beyond its interval, in milliseconds:
    /// how starved of CPU this peer has been. Hundreds mean the machine, not the network, is the bottleneck.
    public var worstLoopLagMilliseconds = 0
    /// Times announcing paused because every unicast to discovered peers failed (the `unicastFailure`
    /// last resort).
    public var announcementPauses = 0
    /// Failure streaks that would have paused announcing but started over, because the loop ran late
    /// during them (a starved peer, not blocked unicast).
    public var starvedFailureStreaks = 0
    /// Episodes of narrowing to a sample of the crowd (a full table, or reading paused by its budget).
    public var narrowingEpisodes = 0
    /// Sources ignored for a while: for their datagram rate, or for fetches that kept failing.
    public var sourcesIgnored = 0

    /// All zero.
    public init() {}

    /// The subset of `counters`.
    public init(_ counters: SSDPDiscoveryCounters) {
        worstLoopLagMilliseconds = counters.worstLoopLagMilliseconds
        announcementPauses = counters.unicastFailurePauses
        starvedFailureStreaks = counters.unicastFailureStreaksStarved
        narrowingEpisodes = counters.narrowingEpisodes
        sourcesIgnored = counters.sourcesIgnoredForRate + counters.sourcesIgnoredForFetchFailures
    }
}
