import NIOCore
import ThaliAdmission
import ThaliBeacons
import ThaliPSKTLS
import ThaliSSDP
import ThaliSupport

/// How a ``ThaliPeer`` runs: where it listens, how it announces, how it retries. Defaults follow
/// `spec/node.md`.
public struct PeerConfiguration: Sendable {
    /// How a connecting peer retries a failed connection or delivery while the matched beacon is valid.
    public struct RetryPolicy: Sendable, Hashable {
        /// Failures in a row, the first attempt included, before the link rests (`restAfterMaxAttempts`).
        public var maxAttempts: Int = 6
        /// After `maxAttempts` failures in a row, the pause before the link tries the same match again, as
        /// often as that takes while the match is valid: a contact that was overloaded (a crowd, a flood)
        /// answers later, and its beacons, whose change would bring a new match, may stay the same for up
        /// to three quarters of their validity. A new match ends the pause at once.
        public var restAfterMaxAttempts: Duration = .seconds(60)
        /// Delay before the first retry; doubled each time up to `maxDelay`, each with ±50 % jitter.
        public var initialDelay: Duration = .milliseconds(250)
        /// Longest delay between attempts.
        public var maxDelay: Duration = .seconds(5)
        /// The defaults above.
        public init() {}

        /// The delays between attempts: `initialDelay` doubling up to `maxDelay`, ±50 % so that peers do
        /// not retry in step.
        public var backoff: Backoff { Backoff(base: initialDelay, cap: maxDelay, jitter: 0.5) }

        /// The delay before attempt `attempt + 1` (attempt ≥ 1).
        func delay(after attempt: Int) -> Duration {
            backoff.delay(beforeRetry: attempt)
        }
    }

    /// IPv4 address of the interface the peer is pinned to (SSDP, the single TCP port, LOCATION).
    public var interfaceAddress: String
    /// The interface whose IPv4 address the peer follows (roaming: `run --interface`, or the interface
    /// `config.json` names or the first one up), or nil to stay on `interfaceAddress` (`run --address`).
    /// When the interface loses that address (a phone joined another access point), the peer moves to
    /// the interface's new one: its port rebinds there, SSDP says byebye for the old location where it
    /// still can and announces the new one at once, searches again, and reports
    /// ``PeerEvent/locationChanged(location:previous:)`` (``InterfaceAddressPlan``, spec/node.md "Roaming").
    public var followsInterface: String?
    /// How often a peer that follows its interface reads the interface's addresses even without the
    /// kernel's notice of a change (rtnetlink): the bound on how late a change is seen where the notice
    /// cannot be had, and the repair of a notice lost.
    public var interfaceRecheckInterval: Duration = .seconds(2)
    /// Whether the Wi-Fi binding (SSDP discovery on `interfaceAddress`) runs; false with an extra binding
    /// (Bluetooth) runs that alone (the single port then best sits on 127.0.0.1, reachable through its
    /// relay only).
    public var wifi: Bool = true
    /// The bindings beside Wi-Fi, started after it in this order, or none: each makes its binding when
    /// the peer starts. ThaliNodeBluetooth's `BluetoothPeerConfiguration` (BLE advertising and scanning
    /// through BlueZ, RFCOMM relay) is one, set through its `PeerConfiguration.bluetooth`; a peer without
    /// it links neither D-Bus nor BlueZ.
    public var extraBindings: [any PeerBindingFactory] = []
    /// Why Wi-Fi, asked for beside Bluetooth, cannot run, or nil: no usable network interface when the
    /// configuration was resolved (a device whose Wi-Fi is off or that is on no network). `wifi` is then
    /// false and the peer runs Bluetooth alone, reporting this as ``PeerEvent/bindingUnavailable(binding:reason:)``
    /// when it starts.
    public var wifiUnavailableReason: String?
    /// SSDP multicast group.
    public var ssdpGroup: String = SSDPDiscoveryConfiguration.defaultGroupAddress
    /// SSDP multicast port.
    public var ssdpPort: Int = SSDPDiscoveryConfiguration.defaultPort
    /// The one TCP port serving `GET /NotificationBeacons` and PSK-TLS; 0 picks a free one.
    public var port: Int = 0
    /// SSDP `CACHE-CONTROL: max-age` announced, in seconds.
    public var maxAge: Int = 60
    /// SSDP alive interval in the foreground.
    public var aliveInterval: Duration = .milliseconds(500)
    /// How long announced beacons stay valid; re-announced when a quarter of it is left.
    public var beaconValidity: Duration = .seconds(3600)
    /// The beacon wire profile.
    public var beaconProfile: BeaconProfile = .spec
    /// Relay mode: streams a contact opens for a relay go to this local TCP port. On a marked session
    /// (``streams``) delivery goes on beside the relay; with an unmarked one (a peer from before stream
    /// marking) every stream goes to the app, as it always did.
    public var appPort: Int?
    /// Stream marking: whether sessions offer `thali-streams/1` and how long a stream's header and its
    /// answer may take (spec/node.md, "Stream marking").
    public var streams = PeerStreamConfiguration()
    /// Relay mode: the local port of each contact's relay listener, by contact name (`--relay-port
    /// NAME=PORT`). A contact not named here keeps the port first bound for it across reconnects.
    public var relayPorts: [String: Int] = [:]
    /// Whether this node opens a relay listener for each contact it connects to: relay mode (``appPort``),
    /// or pinned ``relayPorts`` alone (a node whose apps only connect out to a contact's app needs no app
    /// port of its own).
    public var opensRelayListeners: Bool { appPort != nil || !relayPorts.isEmpty }
    /// How often the peer looks for outbox changes (`send` runs in another process). Looking is two
    /// `stat`s of the store's files; the store is read only when a commit moved them, an item expired
    /// or the announcement is due for renewal.
    public var outboxPollInterval: Duration = .seconds(1)
    /// Retries of a matched peer.
    public var retry = RetryPolicy()
    /// Delivery bounds (chunk size, idle timeout, ...).
    public var deliveryLimits: DeliveryLimits = .default
    /// TLS settings of both roles. The DH group is the spec's minimum, ffdhe2048, unlike ThaliPSKTLS's own
    /// default (ffdhe3072): a peer's server pays a DH key generation for every incoming connection before
    /// the PSK tells a contact from a stranger (about 6 ms at 2048 bits, 17 ms at 3072, measured here), and
    /// the PSK, not the group, authenticates. `config.json`'s `dhGroup` changes it.
    public var tls = PSKTLSConfiguration(dhGroup: .ffdhe2048)
    /// Admission limits of the single port (beacon fetches and PSK-TLS alike), per source before global.
    /// Per source: the node's own pattern is one fetch and one TLS connection per matched announcement
    /// plus at most `retry.maxAttempts - 1` retries, so 30 connections per 10 s from one address (then
    /// refused for 60 s), 4 unauthenticated at once (a TLS connection is unauthenticated until its
    /// handshake succeeds; a beacon fetch never is), 16 open. Globally 32 unauthenticated, 128 open, and
    /// 1,000 per 5 s, whose excess closes the port for 30 s as the last resort. See spec/node.md.
    public var admission = AdmissionLimits()
    /// How long a connection to the single port may take to send its first byte, and a beacon request to
    /// be answered, beyond two retransmission timeouts of the connection's round trip as the kernel
    /// measured it at accept (so that a lost first segment on a slow path is retransmitted in time); PSK-TLS
    /// then runs under its own handshake timeout (`PSKTLSConfiguration.handshakeTimeout`).
    public var firstByteTimeout: Duration = .seconds(2)
    /// The longest first-byte wait, however slow the connection's path: what a source that delays its
    /// handshake's last ACK to look slow can hold a slot for.
    public var maxFirstByteTimeout: Duration = .seconds(8)
    /// SSDP discovery's limits (flood threshold, peer cap, cooldowns); a limit that fires is reported as
    /// ``PeerEvent/limitTriggered(_:)`` and counted in ``PeerStatus/limitsTriggered``.
    public var discoveryLimits = SSDPDiscoveryLimits()
    /// The most contacts advertised at once; more wait for a later round (logged). The PSK table holds
    /// twice as many identities, so the previous announcements stay valid during a re-announcement.
    public var maxAdvertisedContacts = 4096
    /// With more contacts than one announcement holds (64 beacons), the announcements are served in
    /// turn, each for this long: a contact in the last of `n` announcements hears its beacon within
    /// `(n - 1)` intervals plus one SSDP round.
    public var announcementRotationInterval: Duration = .seconds(5)
    /// The least time between two new announcements (new beacons, a new USN). Each one makes every
    /// listening contact fetch it, a connection to this port that its admission counts (30 per 10 s
    /// per source by default), so a burst of sends must not announce once per send: the first
    /// announces at once, the rest share one announcement when this interval has passed. A withdrawal
    /// (nothing left to announce) is not held back. Zero: no pacing.
    public var minimumAnnouncementInterval: Duration = .seconds(1)
    /// Testing and demonstration aid: caps the bytes per second a delivery sender writes on each
    /// stream (nil: no cap), so that a transfer takes long enough to be watched or interrupted.
    public var sendThrottleBytesPerSecond: Int?

    /// A configuration pinned to `interfaceAddress`, defaults elsewhere.
    public init(interfaceAddress: String) {
        self.interfaceAddress = interfaceAddress
    }
}

extension PeerConfiguration {
    /// The first-byte wait of a connection whose retransmission timeout is `roundTrip` (nil: unknown):
    /// `firstByteTimeout` plus twice `roundTrip`, at most `maxFirstByteTimeout` (never below `firstByteTimeout`).
    public func firstByteTimeout(roundTrip: Duration?) -> Duration {
        firstByteTimeout.widened(forRoundTrip: roundTrip, factor: 2, cap: maxFirstByteTimeout)
    }
}
