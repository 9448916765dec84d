/// A snapshot of a running ``ThaliPeer`` for the status view and `--json`.
public struct PeerStatus: Sendable, Hashable, Codable {
    /// What this peer knows of one contact.
    public struct ContactState: Sendable, Hashable, Codable {
        /// The contact's name.
        public var name: String
        /// Where the link to the contact stands.
        public var state: ContactLinkPhase
        /// Where the contact is being reached, or was last found.
        public var location: PeerLocation?
        /// The binding of the route in use or tried next (nil when there is none).
        public var binding: PeerBindingKind?
        /// Relay mode: the local port whose connections reach this contact's app.
        public var relayPort: Int?
    }

    /// Where peers find us over the first binding running (over Wi-Fi our SSDP LOCATION); nil before
    /// the peer started.
    public var location: PeerLocation?
    /// Contacts we advertise beacons for.
    public var advertisingFor: [String]
    /// Peers heard on the network (their locations), whoever they are.
    public var peersSeen: [PeerLocation]
    /// The contacts whose beacons matched (since the peer started), with their link state: not every
    /// contact, only those found on the network.
    public var matchedContacts: [ContactState]
    /// Authenticated sessions running (both directions): delivery sessions, and in relay mode the
    /// sessions carrying a relay.
    public var sessionsInFlight: Int
    /// Relay mode: relayed TCP connections open now (streams to or from a contact's app, both roles).
    public var relayConnections = 0
    /// Items in the inbox.
    public var inboxCount: Int
    /// Items waiting in the outbox.
    public var outboxCount: Int
    /// How often each DoS limit fired since the peer started, by kind (see ``PeerEvent/limitTriggered(_:)``).
    public var limitsTriggered: [PeerLimitKind: Int] = [:]
    /// The single port's admission and traffic counts.
    public var port = PeerPortCounters()
    /// Beacon fetches made and failed.
    public var discovery = PeerDiscoveryCounters()
}

/// Where the link to a matched contact stands (``PeerStatus/ContactState/state``).
public enum ContactLinkPhase: String, Sendable, Hashable, Codable, CustomStringConvertible {
    /// Nothing to try: the last session completed, or nothing was matched yet.
    case idle
    /// A route is waiting to be tried.
    case matched
    /// Connecting.
    case connecting
    /// An authenticated session is up.
    case connected
    /// Waiting before the next attempt (every route failed).
    case backoff
    /// No route can succeed: waiting for the contact's next match.
    case gaveUp = "gave-up"

    /// The name as `thali-node` prints it (`gave-up`, ...).
    public var description: String { rawValue }
}
