/// A snapshot of a running ``ThaliPeer`` for the status view and `--json`.
public struct PeerStatus: Sendable, Hashable, Codable {
    /// What this peer knows of one contact.
    public struct ContactState: Sendable, Hashable, Codable {
        /// The contact's name.
        public var name: String
        /// `idle`, `matched`, `connecting`, `connected`, `backoff` or `gave-up`.
        public var state: String
        /// Where the contact is being reached, or was last found.
        public var location: String?
        /// The binding of the route in use or tried next (nil when there is none).
        public var binding: PeerBindingKind?
        /// Relay mode: the local port whose connections reach this contact's app.
        public var relayPort: Int?
    }

    /// Our SSDP LOCATION.
    public var location: String
    /// Contacts we advertise beacons for.
    public var advertisingFor: [String]
    /// Peers heard on the network (their locations), whoever they are.
    public var peersSeen: [String]
    /// The contacts whose beacons matched (since the peer started), with their link state: not every
    /// contact, only those found on the network.
    public var matchedContacts: [ContactState]
    /// Delivery sessions running (both directions).
    public var sessionsInFlight: Int
    /// Items in the inbox.
    public var inboxCount: Int
    /// Items waiting in the outbox.
    public var outboxCount: Int
    /// How often each DoS limit fired since the peer started, by kind (see ``PeerEvent/limitTriggered(_:)``).
    public var limitsTriggered: [String: Int] = [:]
    /// The single port's admission and traffic counts.
    public var port = PeerPortCounters()
}
