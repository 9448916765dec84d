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

    /// All zero.
    public init() {}
}
