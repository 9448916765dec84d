import NIOCore

/// The denial-of-service bounds of discovery (the seed's "Denial of Service" and "Local Wi-Fi Binding"
/// sections). Each has a counter in `SSDPDiscoveryCounters` that shows when it fired.
public struct SSDPDiscoveryLimits: Sendable {
    /// Length of the window over which received datagrams are counted for flood detection.
    public var floodWindow: TimeAmount = .seconds(1)
    /// Datagrams (any kind, from anyone) per `floodWindow` beyond which discovery is switched off: the
    /// multicast socket is closed, so the kernel drops the flood instead of this process. 100 peers at the
    /// foreground rate send 200 per second.
    public var maxDatagramsPerWindow: Int = 400
    /// How long discovery stays off after a flood or after the peer cap was exceeded.
    public var discoveryCooldown: TimeAmount = .seconds(60)
    /// The most peers tracked at once. A new peer beyond it is not tracked and switches discovery off for
    /// `discoveryCooldown` (the seed: "configured with some maximum number of devices").
    public var maxTrackedPeers: Int = 100
    /// Consecutive failed beacon fetches, with no success in between, after which this peer concludes that
    /// unicast is blocked on this network and stops announcing for `unicastFailurePause`.
    public var unicastFailureThreshold: Int = 8
    /// How long announcements pause when every unicast to discovered peers fails.
    public var unicastFailurePause: TimeAmount = .seconds(60)
    /// Beacon fetches in flight at once; others wait in a queue no longer than `maxTrackedPeers`.
    public var maxConcurrentFetches: Int = 4
    /// Search answers waiting for their random delay at once; more M-SEARCHes are not answered.
    public var maxPendingSearchResponses: Int = 16

    /// The defaults above.
    public init() {}
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
    /// Times the peer cap switched discovery off.
    public var peerCapShutdowns = 0
    /// New peers not tracked because the cap was reached.
    public var peersRejectedAtCap = 0
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
    /// Beacon fetches that returned a body (or 204).
    public var beaconFetchesSucceeded = 0
    /// Beacon fetches that failed after their retries.
    public var beaconFetchesFailed = 0
    /// Times announcing paused because every unicast to discovered peers failed.
    public var unicastFailurePauses = 0

    /// All zero.
    public init() {}
}
