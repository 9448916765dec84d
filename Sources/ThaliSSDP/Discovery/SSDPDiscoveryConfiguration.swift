import NIOCore

/// Everything a discovery service needs to know: where to listen, how often to speak, and its limits.
/// Defaults follow `spec/ssdp.md`.
public struct SSDPDiscoveryConfiguration: Sendable {
    /// SSDP's multicast group, the default everywhere (the peer, `config.json`).
    public static let defaultGroupAddress = "239.255.255.250"
    /// SSDP's multicast port, the default everywhere.
    public static let defaultPort = 1900

    /// The IPv4 address of the interface discovery is pinned to (`IP_MULTICAST_IF`, group join, HTTP
    /// server and LOCATION). On `lo`, `127.0.0.1`.
    public var interfaceAddress: String
    /// The multicast group. Thali's deployed node-ssdp used 228.227.226.225; we use SSDP's own.
    public var groupAddress: String = SSDPDiscoveryConfiguration.defaultGroupAddress
    /// The multicast port. Tests pick a random one so concurrent runs do not hear each other.
    public var port: Int = SSDPDiscoveryConfiguration.defaultPort
    /// The TCP port of the beacon server; 0 picks a free one.
    public var httpPort: Int = 0
    /// `NT` sent and the only `NT`/`ST` listened to.
    public var notificationType: String = ThaliServiceName.notificationType
    /// Interval between alive announcements while the app is in use (seed: 500 ms).
    public var foregroundAliveInterval: Duration = .milliseconds(500)
    /// Interval between alive announcements in background mode (seed: one minute).
    public var backgroundAliveInterval: Duration = .seconds(60)
    /// Whether the peer starts in background mode.
    public var background: Bool = false
    /// `CACHE-CONTROL: max-age` sent, in seconds (seed: 60).
    public var maxAge: Int = 60
    /// Multicast TTL (2: the local network and one router at most).
    public var multicastTTL: UInt8 = 2
    /// `MX` of our M-SEARCHes, in seconds.
    public var searchMaxWait: Int = 3
    /// Shortest interval between our M-SEARCHes (seed: "no more than once every 5 minutes").
    public var searchInterval: Duration = .seconds(300)
    /// Upper bound of the random delay before answering an M-SEARCH: min(MX, this) seconds.
    public var maxSearchResponseDelaySeconds: Int = 5
    /// How long a byebye'd peer is kept so that the alive for its next USN, sent right after, reads as a
    /// change rather than a departure and a new arrival.
    public var byebyeGracePeriod: Duration = .milliseconds(300)
    /// How often expiry and byebye graces are checked.
    public var housekeepingInterval: Duration = .milliseconds(100)
    /// `SERVER` header value.
    public var server: String = "Linux UPnP/1.1 thali-swift/1.0"
    /// Datagram parser bounds.
    public var parserLimits = SSDPParserLimits()
    /// Discovery DoS bounds.
    public var limits = SSDPDiscoveryLimits()
    /// Who serves `GET /NotificationBeacons` at the announced LOCATION.
    public enum BeaconServer: Sendable, Hashable {
        /// The service runs its own ``BeaconHTTPServer`` on ``SSDPDiscoveryConfiguration/httpPort``.
        case builtIn
        /// The app serves the beacons on this TCP port (for example next to its own TLS, behind its own
        /// admission; ``BeaconHTTPServer/configureRequestHandling(on:beacons:)`` answers the requests).
        /// The service only announces the port; the app reports its overloads with
        /// ``SSDPDiscoveryService/pauseAnnouncing(for:)``.
        case external(port: Int)
    }

    /// Who serves the beacons (default: the service's own server).
    public var beaconServer = BeaconServer.builtIn
    /// Beacon server bounds (``BeaconServer/builtIn`` only).
    public var serverLimits = BeaconHTTPServerLimits()
    /// Beacon client bounds and retries.
    public var client = BeaconHTTPClientConfiguration()

    /// A configuration pinned to `interfaceAddress`, defaults elsewhere.
    public init(interfaceAddress: String) {
        self.interfaceAddress = interfaceAddress
    }

    /// `HOST` header value: `group:port`.
    var hostHeader: String { "\(groupAddress):\(port)" }
}

extension SSDPDiscoveryConfiguration {
    /// Refuses timers that would spin the event loop and limits that could never be met.
    func validate() throws(SSDPDiscoveryService.StartError) {
        let configuration = self
        let positiveTimes: [(String, Duration)] = [
            ("foregroundAliveInterval", configuration.foregroundAliveInterval),
            ("backgroundAliveInterval", configuration.backgroundAliveInterval),
            ("searchInterval", configuration.searchInterval),
            ("housekeepingInterval", configuration.housekeepingInterval),
            ("floodWindow", configuration.limits.floodWindow),
            ("failedFetchRetryDelay", configuration.limits.failedFetchRetryDelay),
            ("maxFailedFetchRetryDelay", configuration.limits.maxFailedFetchRetryDelay),
        ]
        let nonNegativeTimes: [(String, Duration)] = [
            ("fetchSpreadPerPeer", configuration.limits.fetchSpreadPerPeer),
            ("maxFetchSpread", configuration.limits.maxFetchSpread),
            ("unicastFailureMinimumSpan", configuration.limits.unicastFailureMinimumSpan),
            ("unicastFailureMinimumSpanOnceWorked", configuration.limits.unicastFailureMinimumSpanOnceWorked),
            ("unicastFailureStarvedLoopLag", configuration.limits.unicastFailureStarvedLoopLag),
        ]
        for (name, value) in nonNegativeTimes where value < .zero { throw .invalidConfiguration(name) }
        for (name, value) in positiveTimes where value <= .zero { throw .invalidConfiguration(name) }
        let positiveCounts: [(String, Int)] = [
            ("maxAge", configuration.maxAge), ("maxDatagramsPerWindow", configuration.limits.maxDatagramsPerWindow),
            ("maxDatagramsReadPerWindow", configuration.limits.maxDatagramsReadPerWindow),
            ("maxTrackedPeers", configuration.limits.maxTrackedPeers),
            ("maxConcurrentFetches", configuration.limits.maxConcurrentFetches),
            ("unicastFailureThreshold", configuration.limits.unicastFailureThreshold),
            ("maxDatagramsPerSource", configuration.limits.maxDatagramsPerSource),
            ("maxPeersPerSource", configuration.limits.maxPeersPerSource),
            ("sourceFetchFailureThreshold", configuration.limits.sourceFetchFailureThreshold),
            ("maxTrackedSources", configuration.limits.maxTrackedSources),
            ("maxDatagramBytes", configuration.parserLimits.maxDatagramBytes),
        ]
        for (name, value) in positiveCounts where value <= 0 { throw .invalidConfiguration(name) }
        guard (1...65535).contains(configuration.port) else { throw .invalidConfiguration("port") }
    }
}
