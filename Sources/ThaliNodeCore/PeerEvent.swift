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
    /// Connecting to a contact (attempt ≥ 1).
    case connecting(contact: String, location: String, attempt: Int)
    /// A PSK-TLS session with a contact is up.
    case connected(contact: String, role: Role)
    /// A connection or delivery failed; `retryIn` is the delay before the next attempt, nil when giving up.
    case connectionFailed(contact: String, reason: String, retryIn: Duration?)
    /// Delivery progress with a contact.
    case delivery(contact: String, DeliveryEvent)
    /// A delivery session ended (`error` nil: it completed).
    case sessionEnded(contact: String, role: Role, error: String?)
    /// A DoS limit fired (`kind`: `announcementFlood`, `peerCap`, `unicastFailure`, `httpOverload`) and
    /// this peer switched something off for a while; `effect` says what, for how long, and that it is the
    /// last resort of that limit.
    case limitTriggered(kind: String, effect: String)
    /// Relay mode: connections to this local port reach the contact's app.
    case relayListening(contact: String, port: Int)
    /// The peer stopped.
    case stopped
}

/// A callback for ``PeerEvent``s; called from the peer's tasks and event loops, so keep it short.
public typealias PeerEventHandler = @Sendable (PeerEvent) -> Void
