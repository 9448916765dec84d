import Foundation

/// What a ``ThaliPeer`` reports as it runs, for logs, `--json` lines and the status view.
public enum PeerEvent: Sendable, Hashable {
    /// Which side of a connection this peer is.
    public enum Role: String, Sendable, Hashable {
        /// This peer matched a beacon and connected (it receives, or relays from a local listener).
        case connecting
        /// This peer advertised and accepted the connection (it sends, or relays to the app port).
        case accepting
    }

    /// Listening at `location` (the SSDP LOCATION: beacons and PSK-TLS on one port).
    case started(location: String)
    /// Advertising beacons for these contacts (empty: nothing announced).
    case advertising(contacts: [String])
    /// A peer was heard on the network (by its location).
    case peerAppeared(location: String)
    /// A peer left (`byebye`, `expired` or `stopped`).
    case peerLeft(location: String, reason: String)
    /// A peer's beacons named us, from this contact.
    case beaconMatched(contact: String, location: String)
    /// Connecting to a contact (attempt ≥ 1) found at `location` (an SSDP location, or `bluetooth:` and
    /// its address: the location names the binding).
    case connecting(contact: String, location: String, attempt: Int)
    /// A PSK-TLS session with a contact is up, over `binding`.
    case connected(contact: String, role: Role, binding: PeerBindingKind)
    /// A connection or delivery failed; `retryIn` is the delay before the next attempt, nil when giving up.
    case connectionFailed(contact: String, reason: String, retryIn: Duration?)
    /// Delivery progress with a contact.
    case delivery(contact: String, DeliveryEvent)
    /// An authenticated connection with a contact over `binding` ended (every
    /// ``connected(contact:role:binding:)`` gets one): `reason` is the first error on it (TLS, a
    /// multiplexer protocol error) or `closed`.
    case disconnected(contact: String, role: Role, binding: PeerBindingKind, reason: String)
    /// A delivery session ended (`error` nil: it completed).
    case sessionEnded(contact: String, role: Role, error: String?)
    /// A DoS limit fired and this peer switched something off for a while: the last resort of that limit.
    case limitTriggered(PeerLimitReport)
    /// Relay mode: connections to this local port reach the contact's app.
    case relayListening(contact: String, port: Int)
    /// A binding that was asked for cannot run (`binding` is `bluetooth` or `wifi`); the others go on.
    case bindingUnavailable(binding: String, reason: String)
    /// The peer stopped.
    case stopped
}

/// What a fired DoS limit did (``PeerEvent/limitTriggered(_:)``).
public struct PeerLimitReport: Sendable, Hashable {
    /// What the peer switched off.
    public enum Effect: String, Sendable, Hashable {
        /// SSDP discovery: the multicast socket is closed, nothing is heard.
        case discoveryOff = "discovery-off"
        /// Announcing: byebye sent, no alives.
        case announcingPaused = "announcing-paused"
        /// The single port is closed (and announcing paused with it).
        case portClosed = "port-closed"
    }

    /// The limit (ThaliSSDP's `SSDPDiscoveryEvent.LimitKind`: `announcementFlood`, `peerCap`, ...).
    public var kind: String
    /// What it switched off.
    public var effect: Effect
    /// For how long.
    public var period: Duration
    /// In words: what was exceeded, and that this is the limit's last resort.
    public var detail: String

    /// A report of `kind` switching `effect` off for `period`.
    public init(kind: String, effect: Effect, period: Duration, detail: String) {
        self.kind = kind
        self.effect = effect
        self.period = period
        self.detail = detail
    }
}

/// A callback for ``PeerEvent``s; called from the peer's tasks and event loops, so keep it short.
public typealias PeerEventHandler = @Sendable (PeerEvent) -> Void
