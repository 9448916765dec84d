/// A Thali peer as discovery currently sees it. Identified by its beacon location (address and port);
/// its USN changes whenever its beacons do.
public struct SSDPPeer: Hashable, Sendable {
    /// Where the beacons of the peer are served; the peer's identity in the table.
    public var location: BeaconLocation
    /// The current USN.
    public var uniqueServiceName: String
    /// How far fetching the current USN's beacons got.
    public var beaconState: BeaconState

    /// The beacon fetch state of one USN.
    public enum BeaconState: Hashable, Sendable {
        /// Queued or in flight.
        case fetching
        /// Fetched: the stream bytes (empty when the peer answered 204, nothing advertised).
        case fetched([UInt8])
        /// Every attempt failed, or the fetch was not made (its source ignored, the queue full); a later
        /// alive fetches it again (`SSDPDiscoveryLimits.failedFetchRetryDelay`).
        case failed
    }
}

/// What discovery reports, in order, on `SSDPDiscoveryService.events`.
public enum SSDPDiscoveryEvent: Hashable, Sendable {
    /// A peer not tracked before announced itself (or answered a search).
    case appeared(SSDPPeer)
    /// A tracked peer announced a new USN (its beacons changed).
    case changed(SSDPPeer, previousServiceName: String)
    /// The beacons for the peer's current USN were fetched and handed to the consumer.
    case beaconsFetched(SSDPPeer)
    /// Fetching the beacons for the peer's current USN failed after all retries, or was not made.
    case beaconFetchFailed(SSDPPeer, BeaconFetchFailure)
    /// A peer left: by byebye, or because its max-age ran out without a new alive.
    case left(SSDPPeer, reason: DepartureReason)
    /// A limit fired and switched something off for a while (see `SSDPDiscoveryLimits`).
    case limitTriggered(LimitKind)

    /// Why a peer left the table.
    public enum DepartureReason: String, Hashable, Sendable {
        /// It sent `ssdp:byebye` and no new USN followed within the grace period.
        case byebye
        /// Its max-age ran out.
        case expired
        /// Discovery was stopped.
        case stopped
        /// The table was full (`maxTrackedPeers`) and gave this peer's place, its beacons read, to a new
        /// one (narrowing, `spec/ssdp.md` 7.2).
        case narrowed
    }

    /// The limit that fired.
    public enum LimitKind: String, Hashable, Sendable {
        /// Too many datagrams: discovery off for `discoveryCooldown`.
        case announcementFlood
        /// Discovery narrowed to a sample of the crowd (a full table, or more datagrams than the read budget;
        /// `spec/ssdp.md` 7.2): nothing is switched off; reported once per episode
        /// (`SSDPDiscoveryLimits/narrowingEpisodeGap`).
        case narrowed
        /// Every unicast failed: announcing paused for `unicastFailurePause`.
        case unicastFailure
        /// The beacon HTTP server was overloaded: its port closed and announcing paused.
        case httpOverload
    }
}
