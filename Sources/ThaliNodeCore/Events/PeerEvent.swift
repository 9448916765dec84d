import Foundation
import ThaliSSDP

/// What a ``ThaliPeer`` reports as it runs, for logs, `--json` lines and the status view.
public enum PeerEvent: Sendable, Hashable {
    /// Which side of a connection this peer is.
    public enum Role: String, Sendable, Hashable, CustomStringConvertible {
        /// This peer matched a beacon and connected (it receives, or relays from a local listener).
        case connecting
        /// This peer advertised and accepted the connection (it sends, or relays to the app port).
        case accepting

        /// `connecting` or `accepting`.
        public var description: String { rawValue }
    }

    /// Listening; peers find us at `location` over the first binding running (over Wi-Fi the SSDP
    /// LOCATION: beacons and PSK-TLS on one port).
    case started(location: PeerLocation)
    /// The peer moved: the interface it follows lost its address (roaming), and peers now find it at
    /// `location` instead of `previous` (``PeerConfiguration/followsInterface``).
    case locationChanged(location: PeerLocation, previous: PeerLocation)
    /// Advertising beacons for these contacts (empty: nothing announced).
    case advertising(contacts: [String])
    /// A peer was heard on the network (by its location).
    case peerAppeared(location: PeerLocation)
    /// A peer left (it said byebye, its announcement expired, or discovery stopped).
    case peerLeft(location: PeerLocation, reason: PeerDepartureReason)
    /// A peer's beacons named us, from this contact.
    case beaconMatched(contact: ContactIdentity, location: PeerLocation)
    /// Connecting to a contact (attempt ≥ 1) found at `location` (its binding is the location's).
    case connecting(contact: ContactIdentity, location: PeerLocation, attempt: Int)
    /// A PSK-TLS session with a contact is up, over `binding`; `remote` is the other side's TCP endpoint
    /// (`host:port`), which tells one session from another.
    case connected(contact: ContactIdentity, role: Role, binding: PeerBindingKind, remote: String?)
    /// A connection or delivery failed; `retryIn` is the delay before the next attempt, nil when giving up.
    case connectionFailed(contact: ContactIdentity, reason: PeerConnectionError, retryIn: Duration?)
    /// Delivery progress with a contact.
    case delivery(contact: ContactIdentity, DeliveryEvent)
    /// An authenticated connection with a contact over `binding` ended (every
    /// ``connected(contact:role:binding:remote:)`` gets one, with the same `remote`): `reason` is the first
    /// error on it (TLS, a multiplexer protocol error), nil when it simply closed.
    case disconnected(contact: ContactIdentity, role: Role, binding: PeerBindingKind, remote: String?, reason: PeerConnectionError?)
    /// A delivery session ended (`error` nil: it completed).
    case sessionEnded(contact: ContactIdentity, role: Role, error: PeerConnectionError?)
    /// A DoS limit fired and this peer switched something off for a while: the last resort of that limit.
    case limitTriggered(PeerLimitReport)
    /// Relay mode: the contact's relay listener opened: connections to 127.0.0.1:`port` reach the
    /// contact's app.
    case relayListening(contact: ContactIdentity, port: Int)
    /// Relay mode: the contact was reached again and its relay listener reopened on the same port.
    case relayReopened(contact: ContactIdentity, port: Int)
    /// Relay mode: the session with the contact ended and its relay listener on `port` closed; it
    /// reopens on the same port once the contact is reached again.
    case relayClosed(contact: ContactIdentity, port: Int)
    /// Relay mode: the contact's pinned or kept relay port could not be bound (`reason` in words).
    /// `instead`: the free port used instead (a kept port); nil for a pinned port, when the session is
    /// closed and the link retries.
    case relayPortUnavailable(contact: ContactIdentity, port: Int, reason: String, instead: Int?)
    /// Relay mode: a relayed connection with the contact could not reach the app and was closed. On
    /// the accepting side `error` is the failure to connect to the app port; on the connecting side it is
    /// nil: the contact's node reset the stream before any reply, as it does when its app port refuses.
    case relayAppUnreachable(contact: ContactIdentity, role: Role, error: PeerConnectionError?)
    /// A marked stream with the contact was not served (``StreamRefusal``: a kind the refusing node does
    /// not serve, a bad or late header or answer): reported once by each node, `byThisNode` telling which
    /// refused, `role` being this node's side of the session; `kind` is nil when no header could be read.
    case streamRefused(contact: ContactIdentity, role: Role, kind: String?, refusal: StreamRefusal, byThisNode: Bool)
    /// A binding that was asked for cannot run; the others go on.
    case bindingUnavailable(binding: PeerBindingKind, reason: String)
    /// The peer stopped.
    case stopped
}

/// Why a peer left (``PeerEvent/peerLeft(location:reason:)``).
public enum PeerDepartureReason: String, Sendable, Hashable, CustomStringConvertible {
    /// It said `ssdp:byebye` (and no new announcement followed).
    case byebye
    /// Its announcement's max-age ran out.
    case expired
    /// Our discovery stopped.
    case stopped
    /// Discovery tracks at most so many peers and gave its place, its beacons read, to another.
    case narrowed

    /// The node-level reason of an SSDP departure.
    public init(_ reason: SSDPDiscoveryEvent.DepartureReason) {
        switch reason {
        case .byebye: self = .byebye
        case .expired: self = .expired
        case .stopped: self = .stopped
        case .narrowed: self = .narrowed
        }
    }

    /// The reason in words ("it said byebye"); `--json` prints the name (`byebye`, `expired`, `stopped`,
    /// `narrowed`).
    public var description: String {
        switch self {
        // A node says byebye when it has nothing left to announce as well as when it stops.
        case .byebye: "it stopped announcing (byebye: it has nothing for its contacts now, or it stopped)"
        case .expired: "its announcement expired"
        case .stopped: "discovery stopped"
        case .narrowed: "its beacons were read and the table made room for another"
        }
    }
}

/// What a fired DoS limit did (``PeerEvent/limitTriggered(_:)``).
public struct PeerLimitReport: Sendable, Hashable {
    /// What the peer switched off.
    public enum Effect: String, Sendable, Hashable, CustomStringConvertible {
        /// SSDP discovery: the multicast socket is closed, nothing is heard.
        case discoveryOff = "discovery-off"
        /// Announcing: byebye sent, no alives.
        case announcingPaused = "announcing-paused"
        /// The single port is closed (and announcing paused with it).
        case portClosed = "port-closed"
        /// Nothing is switched off: discovery reads and tracks a sample of a crowd beyond its bounds
        /// (`spec/ssdp.md` 7.2) until the crowd is within them again.
        case discoveryNarrowed = "discovery-narrowed"

        /// `discovery-off`, `announcing-paused`, `port-closed` or `discovery-narrowed`.
        public var description: String { rawValue }
    }

    /// The limit that fired.
    public var kind: PeerLimitKind
    /// What it switched off.
    public var effect: Effect
    /// For how long.
    public var period: Duration
    /// In words: what was exceeded, and that this is the limit's last resort.
    public var detail: String

    /// A report of `kind` switching `effect` off for `period`.
    public init(kind: PeerLimitKind, effect: Effect, period: Duration, detail: String) {
        self.kind = kind
        self.effect = effect
        self.period = period
        self.detail = detail
    }
}

/// A DoS limit of a peer whose last resort switches something off, or discovery's narrowing, which
/// switches nothing off (``PeerLimitReport/kind``, ``PeerStatus/limitsTriggered``).
public enum PeerLimitKind: String, Sendable, Hashable, Codable, CodingKeyRepresentable, Comparable, CaseIterable,
    CustomStringConvertible {
    /// Too many SSDP datagrams: discovery off for a cool-down.
    case announcementFlood
    /// A crowd beyond discovery's bounds (peers tracked, datagrams read): discovery narrows to a sample,
    /// once per episode; not a last resort.
    case narrowed
    /// Every unicast answer failed: announcing paused.
    case unicastFailure
    /// The single port was overloaded: it is closed and announcing paused.
    case httpOverload

    /// The node-level kind of an SSDP discovery limit.
    public init(_ kind: SSDPDiscoveryEvent.LimitKind) {
        switch kind {
        case .announcementFlood: self = .announcementFlood
        case .narrowed: self = .narrowed
        case .unicastFailure: self = .unicastFailure
        case .httpOverload: self = .httpOverload
        }
    }

    /// The name as `thali-node` prints it (`announcementFlood`, ...).
    public var description: String { rawValue }

    public static func < (lhs: PeerLimitKind, rhs: PeerLimitKind) -> Bool { lhs.rawValue < rhs.rawValue }
}

extension PeerEvent: CustomStringConvertible {
    /// The event in words, as `thali-node run` prints it.
    public var description: String { PeerEventRecord(self)?.summary ?? "stopped" }
}

/// A callback for ``PeerEvent``s; called from the peer's tasks and event loops, so keep it short.
public typealias PeerEventHandler = @Sendable (PeerEvent) -> Void
