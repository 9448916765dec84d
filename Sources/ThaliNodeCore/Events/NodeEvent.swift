import Foundation

/// A line of `thali-node run --json` (and of the event feed, `thali-node events`) read back: the event
/// with exactly what its JSON carries, typed.
///
/// The JSON of a ``PeerEvent`` says less than the event: an error is its description in words, an
/// offer has no digest, a received item no sender key. So a line does not decode to the ``PeerEvent``
/// it came from but to this enum, whose cases are ``PeerEvent``'s (and ``DeliveryEvent``'s inside
/// ``delivery(contact:_:)``) with the payload the line has, plus the records `run` prints itself
/// (``status(_:)``, ``expired(_:)``, ``stopped(reason:)``). ``init(_:)-(PeerEvent)`` is that reduction of an
/// event; the JSON form and this enum map one to one: ``init(jsonLine:)`` decodes a line, ``record``
/// (``PeerEventRecord``) and ``jsonLine()`` encode it, and decoding the line of `NodeEvent(event)` gives
/// back `NodeEvent(event)`.
///
/// Decoding is strict about what it knows and lenient about what it does not: a line that is not a
/// JSON object, an unknown `event` name, a missing field or a value of the wrong form is a
/// ``NodeEventDecodingError`` (never a crash: the lines come from another process); keys an event does
/// not use are ignored, so a newer node's added fields do not break an older reader, and fields derived
/// from others (a location's `binding`, a refusal's `reason` in words) are not checked. An event a newer
/// node added is ``NodeEventDecodingError/unknownEvent(_:)``: the readers are this package's own, which
/// read the output of the same build, where an unknown name is a mistake to report, not to skip quietly.
public enum NodeEvent: Sendable, Hashable {
    /// `started`: ``PeerEvent/started(location:)``.
    case started(location: PeerLocation)
    /// `location_changed`: ``PeerEvent/locationChanged(location:previous:)``.
    case locationChanged(location: PeerLocation, previous: PeerLocation)
    /// `advertising`: ``PeerEvent/advertising(contacts:)``.
    case advertising(contacts: [String])
    /// `peer_appeared`: ``PeerEvent/peerAppeared(location:)``.
    case peerAppeared(location: PeerLocation)
    /// `peer_left`: ``PeerEvent/peerLeft(location:reason:)``.
    case peerLeft(location: PeerLocation, reason: PeerDepartureReason)
    /// `matched`: ``PeerEvent/beaconMatched(contact:location:)``.
    case beaconMatched(contact: ContactIdentity, location: PeerLocation)
    /// `connecting`: ``PeerEvent/connecting(contact:location:attempt:)``.
    case connecting(contact: ContactIdentity, location: PeerLocation, attempt: Int)
    /// `connected`: ``PeerEvent/connected(contact:role:binding:remote:)``.
    case connected(contact: ContactIdentity, role: PeerEvent.Role, binding: PeerBindingKind, remote: String?)
    /// `connection_failed`: ``PeerEvent/connectionFailed(contact:reason:retryIn:)``, the reason in words
    /// and the delay in whole milliseconds.
    case connectionFailed(contact: ContactIdentity, reason: String, retryIn: Duration?)
    /// A delivery event with a contact: ``PeerEvent/delivery(contact:_:)``.
    case delivery(contact: ContactIdentity, Delivery)
    /// `disconnected`: ``PeerEvent/disconnected(contact:role:binding:remote:reason:)``, the error in words
    /// (nil: the session ended cleanly, `clean` true).
    case disconnected(contact: ContactIdentity, role: PeerEvent.Role, binding: PeerBindingKind, remote: String?, reason: String?)
    /// `session_ended`: ``PeerEvent/sessionEnded(contact:role:error:)``, the error in words.
    case sessionEnded(contact: ContactIdentity, role: PeerEvent.Role, error: String?)
    /// `limit_triggered`: ``PeerEvent/limitTriggered(_:)``, the period in seconds.
    case limitTriggered(kind: PeerLimitKind, effect: PeerLimitReport.Effect, periodSeconds: Double, detail: String)
    /// `relay_listening`: ``PeerEvent/relayListening(contact:port:)``.
    case relayListening(contact: ContactIdentity, port: Int)
    /// `relay_reopened`: ``PeerEvent/relayReopened(contact:port:)``.
    case relayReopened(contact: ContactIdentity, port: Int)
    /// `relay_closed`: ``PeerEvent/relayClosed(contact:port:)``.
    case relayClosed(contact: ContactIdentity, port: Int)
    /// `relay_port_unavailable`: ``PeerEvent/relayPortUnavailable(contact:port:reason:instead:)``.
    case relayPortUnavailable(contact: ContactIdentity, port: Int, reason: String, instead: Int?)
    /// `relay_app_unreachable`: ``PeerEvent/relayAppUnreachable(contact:role:error:)``, the error in words
    /// (nil: the contact's node closed the relayed connection before any reply).
    case relayAppUnreachable(contact: ContactIdentity, role: PeerEvent.Role, error: String?)
    /// `stream_refused`: ``PeerEvent/streamRefused(contact:role:kind:refusal:byThisNode:)``.
    case streamRefused(contact: ContactIdentity, role: PeerEvent.Role, kind: String?, refusal: StreamRefusal, byThisNode: Bool)
    /// `binding_unavailable`: ``PeerEvent/bindingUnavailable(binding:reason:)``.
    case bindingUnavailable(binding: PeerBindingKind, reason: String)
    /// `status`: a ``PeerStatus`` snapshot as `run` prints it.
    case status(Status)
    /// `expired`: an item that expired undelivered and was deleted from the outbox (`run` reports it).
    case expired(Item)
    /// `stopped`: the run stopped; `reason` is `SIGINT`, `SIGTERM`, `duration`, `output_closed`,
    /// `output_failed` or `end`.
    case stopped(reason: String)

    /// A ``DeliveryEvent`` as its line carries it.
    public enum Delivery: Sendable, Hashable {
        /// `offered`: ``DeliveryEvent/offered(_:)``: id, kind and size.
        case offered(Item)
        /// `transfer_started`: ``DeliveryEvent/transferStarted(id:offset:total:)``.
        case transferStarted(id: UUID, offset: UInt64, total: UInt64)
        /// `progress`: ``DeliveryEvent/progress(id:bytes:total:)``.
        case progress(id: UUID, bytes: UInt64, total: UInt64)
        /// `delivered`: ``DeliveryEvent/delivered(id:alreadyStored:)``.
        case delivered(id: UUID, alreadyStored: Bool)
        /// `refused`: ``DeliveryEvent/refused(_:_:)``.
        case refused(Item, ItemRefusal)
        /// `deferred`: ``DeliveryEvent/deferred(_:_:retryIn:)``, the delay in whole milliseconds.
        case deferred(Item, ItemRefusal, retryIn: Duration)
        /// `refused_offer`: ``DeliveryEvent/refusedOffer(_:_:reason:)``.
        case refusedOffer(Item, ItemRefusal, reason: String)
        /// `rejected`: ``DeliveryEvent/rejected(id:_:)``.
        case rejected(id: UUID, TransferFailure)
        /// `discarded`: ``DeliveryEvent/discarded(id:_:)``.
        case discarded(id: UUID, TransferFailure)
        /// `received`: ``DeliveryEvent/received(_:)``: id, kind, size, and the text or the file's name.
        case received(Item)
        /// `duplicate`: ``DeliveryEvent/duplicate(id:)``.
        case duplicate(id: UUID)
    }

    /// An item as a line names it: an offer, a received item, an expired one.
    public struct Item: Sendable, Hashable {
        /// The item's id.
        public var id: UUID
        /// Text or file.
        public var kind: ItemKind
        /// The content's size in bytes.
        public var size: Int64
        /// A file's name, where the line has it (`refused`, `deferred`, `refused_offer`, `received`,
        /// `expired`; not `offered`).
        public var fileName: String?
        /// A received text.
        public var text: String?

        /// An item with these fields.
        public init(id: UUID, kind: ItemKind, size: Int64, fileName: String? = nil, text: String? = nil) {
            (self.id, self.kind, self.size, self.fileName, self.text) = (id, kind, size, fileName, text)
        }
    }

    /// A `status` line: a ``PeerStatus`` with the port's and discovery's counts by their snake_case names.
    public struct Status: Sendable, Hashable {
        /// ``PeerStatus/location`` (nil: an empty `location`, the peer not started).
        public var location: PeerLocation?
        /// ``PeerStatus/advertisingFor``.
        public var advertisingFor: [String]
        /// ``PeerStatus/peersSeen``.
        public var peersSeen: [PeerLocation]
        /// ``PeerStatus/matchedContacts``.
        public var matchedContacts: [PeerStatus.ContactState]
        /// ``PeerStatus/sessionsInFlight``.
        public var sessionsInFlight: Int
        /// ``PeerStatus/relayConnections``.
        public var relayConnections: Int
        /// ``PeerStatus/inboxCount``.
        public var inbox: Int
        /// ``PeerStatus/outboxCount``.
        public var outbox: Int
        /// ``PeerStatus/limitsTriggered``.
        public var limitsTriggered: [PeerLimitKind: Int]
        /// ``PeerStatus/port``, by name (`port_counts`).
        public var port: PeerEventRecord.PortRecord
        /// ``PeerStatus/discovery``, by name.
        public var discovery: PeerEventRecord.DiscoveryRecord

        /// The line's view of `status`.
        public init(_ status: PeerStatus) {
            location = status.location
            advertisingFor = status.advertisingFor
            peersSeen = status.peersSeen
            matchedContacts = status.matchedContacts
            sessionsInFlight = status.sessionsInFlight
            relayConnections = status.relayConnections
            inbox = status.inboxCount
            outbox = status.outboxCount
            limitsTriggered = status.limitsTriggered
            let admission = status.port.admission
            port = PeerEventRecord.PortRecord(
                admission: ["admitted": admission.admitted, "authenticated": admission.authenticated, "refused": admission.refused,
                            "refused_source_rate": admission.refusedSourceRate,
                            "refused_source_unauthenticated": admission.refusedSourceUnauthenticated,
                            "refused_source_open": admission.refusedSourceOpen,
                            "refused_global_unauthenticated": admission.refusedGlobalUnauthenticated,
                            "refused_global_open": admission.refusedGlobalOpen, "refused_overload": admission.refusedOverload,
                            "overloads": admission.overloads, "sources_refused": admission.sourcesRefused,
                            "sources_forgotten": admission.sourcesForgotten],
                beaconRequests: status.port.beaconRequests, tlsConnections: status.port.tlsConnections, timedOut: status.port.timedOut)
            discovery = PeerEventRecord.DiscoveryRecord(
                beaconFetches: status.discovery.beaconFetches, beaconFetchFailures: status.discovery.beaconFetchFailures,
                failuresByKind: Dictionary(uniqueKeysWithValues: status.discovery.beaconFetchFailuresByKind.map { ($0.key.rawValue, $0.value) }),
                ssdp: status.discovery.ssdp.map {
                    ["worst_loop_lag_ms": $0.worstLoopLagMilliseconds, "announcement_pauses": $0.announcementPauses,
                     "starved_failure_streaks": $0.starvedFailureStreaks, "narrowing_episodes": $0.narrowingEpisodes,
                     "sources_ignored": $0.sourcesIgnored]
                })
        }

        init(location: PeerLocation?, advertisingFor: [String], peersSeen: [PeerLocation], matchedContacts: [PeerStatus.ContactState],
             sessionsInFlight: Int, relayConnections: Int, inbox: Int, outbox: Int, limitsTriggered: [PeerLimitKind: Int],
             port: PeerEventRecord.PortRecord, discovery: PeerEventRecord.DiscoveryRecord) {
            (self.location, self.advertisingFor, self.peersSeen, self.matchedContacts) = (location, advertisingFor, peersSeen, matchedContacts)
            (self.sessionsInFlight, self.relayConnections, self.inbox, self.outbox) = (sessionsInFlight, relayConnections, inbox, outbox)
            (self.limitsTriggered, self.port, self.discovery) = (limitsTriggered, port, discovery)
        }
    }

    /// What the line of `event` says; nil for ``PeerEvent/stopped`` (`run` prints its own
    /// ``stopped(reason:)`` with the reason). Durations keep whole milliseconds, as the line does.
    public init?(_ event: PeerEvent) {
        switch event {
        case .started(let location): self = .started(location: location)
        case .locationChanged(let location, let previous): self = .locationChanged(location: location, previous: previous)
        case .advertising(let contacts): self = .advertising(contacts: contacts)
        case .peerAppeared(let location): self = .peerAppeared(location: location)
        case .peerLeft(let location, let reason): self = .peerLeft(location: location, reason: reason)
        case .beaconMatched(let contact, let location): self = .beaconMatched(contact: contact, location: location)
        case .connecting(let contact, let location, let attempt): self = .connecting(contact: contact, location: location, attempt: attempt)
        case .connected(let contact, let role, let binding, let remote):
            self = .connected(contact: contact, role: role, binding: binding, remote: remote)
        case .connectionFailed(let contact, let reason, let retryIn):
            let milliseconds = retryIn.map { Int($0.components.seconds * 1000 + $0.components.attoseconds / 1_000_000_000_000_000) }
            self = .connectionFailed(contact: contact, reason: reason.description, retryIn: milliseconds.map { .milliseconds($0) })
        case .delivery(let contact, let delivery): self = .delivery(contact: contact, Delivery(delivery))
        case .disconnected(let contact, let role, let binding, let remote, let error):
            self = .disconnected(contact: contact, role: role, binding: binding, remote: remote, reason: error?.description)
        case .sessionEnded(let contact, let role, let error): self = .sessionEnded(contact: contact, role: role, error: error?.description)
        case .limitTriggered(let report):
            self = .limitTriggered(kind: report.kind, effect: report.effect, periodSeconds: report.period.timeInterval, detail: report.detail)
        case .relayListening(let contact, let port): self = .relayListening(contact: contact, port: port)
        case .relayReopened(let contact, let port): self = .relayReopened(contact: contact, port: port)
        case .relayClosed(let contact, let port): self = .relayClosed(contact: contact, port: port)
        case .relayPortUnavailable(let contact, let port, let reason, let instead):
            self = .relayPortUnavailable(contact: contact, port: port, reason: reason, instead: instead)
        case .relayAppUnreachable(let contact, let role, let error):
            self = .relayAppUnreachable(contact: contact, role: role, error: error?.description)
        case .streamRefused(let contact, let role, let kind, let refusal, let byThisNode):
            self = .streamRefused(contact: contact, role: role, kind: kind, refusal: refusal, byThisNode: byThisNode)
        case .bindingUnavailable(let binding, let reason): self = .bindingUnavailable(binding: binding, reason: reason)
        case .stopped: return nil
        }
    }

    /// The event's name in its line (`started`, `matched`, `progress`, `status`, ...).
    public var name: String {
        switch self {
        case .started: "started"
        case .locationChanged: "location_changed"
        case .advertising: "advertising"
        case .peerAppeared: "peer_appeared"
        case .peerLeft: "peer_left"
        case .beaconMatched: "matched"
        case .connecting: "connecting"
        case .connected: "connected"
        case .connectionFailed: "connection_failed"
        case .delivery(_, let delivery): delivery.name
        case .disconnected: "disconnected"
        case .sessionEnded: "session_ended"
        case .limitTriggered: "limit_triggered"
        case .relayListening: "relay_listening"
        case .relayReopened: "relay_reopened"
        case .relayClosed: "relay_closed"
        case .relayPortUnavailable: "relay_port_unavailable"
        case .relayAppUnreachable: "relay_app_unreachable"
        case .streamRefused: "stream_refused"
        case .bindingUnavailable: "binding_unavailable"
        case .status: "status"
        case .expired: "expired"
        case .stopped: "stopped"
        }
    }

    /// The contact the event concerns, if any.
    public var contact: ContactIdentity? {
        switch self {
        case .beaconMatched(let contact, _), .connecting(let contact, _, _), .connected(let contact, _, _, _),
             .connectionFailed(let contact, _, _), .delivery(let contact, _), .disconnected(let contact, _, _, _, _),
             .sessionEnded(let contact, _, _), .relayListening(let contact, _), .relayReopened(let contact, _),
             .relayClosed(let contact, _), .relayPortUnavailable(let contact, _, _, _), .relayAppUnreachable(let contact, _, _),
             .streamRefused(let contact, _, _, _, _):
            contact
        case .started, .locationChanged, .advertising, .peerAppeared, .peerLeft, .limitTriggered, .bindingUnavailable, .status, .expired, .stopped:
            nil
        }
    }
}

extension NodeEvent.Delivery {
    /// What the line of `event` says.
    public init(_ event: DeliveryEvent) {
        func item(_ offer: ItemOffer) -> NodeEvent.Item {
            NodeEvent.Item(id: offer.id, kind: offer.kind, size: Int64(clamping: offer.size), fileName: offer.kind == .file ? offer.name : nil)
        }
        switch event {
        case .offered(let offer): self = .offered(NodeEvent.Item(id: offer.id, kind: offer.kind, size: Int64(clamping: offer.size)))
        case .transferStarted(let id, let offset, let total): self = .transferStarted(id: id, offset: offset, total: total)
        case .progress(let id, let bytes, let total): self = .progress(id: id, bytes: bytes, total: total)
        case .delivered(let id, let alreadyStored): self = .delivered(id: id, alreadyStored: alreadyStored)
        case .refused(let offer, let refusal): self = .refused(item(offer), refusal)
        case .deferred(let offer, let refusal, let retryIn):
            self = .deferred(item(offer), refusal, retryIn: .milliseconds(NodeEvent.milliseconds(retryIn)))
        case .refusedOffer(let offer, let refusal, let reason): self = .refusedOffer(item(offer), refusal, reason: reason)
        case .rejected(let id, let failure): self = .rejected(id: id, failure)
        case .discarded(let id, let failure): self = .discarded(id: id, failure)
        case .received(let received):
            self = .received(NodeEvent.Item(id: received.itemID, kind: received.kind, size: received.size, fileName: received.fileName,
                                            text: received.text))
        case .duplicate(let id): self = .duplicate(id: id)
        }
    }

    /// The event's name in its line (`offered`, `progress`, `received`, ...).
    public var name: String {
        switch self {
        case .offered: "offered"
        case .transferStarted: "transfer_started"
        case .progress: "progress"
        case .delivered: "delivered"
        case .refused: "refused"
        case .deferred: "deferred"
        case .refusedOffer: "refused_offer"
        case .rejected: "rejected"
        case .discarded: "discarded"
        case .received: "received"
        case .duplicate: "duplicate"
        }
    }

    /// The item the event concerns.
    public var itemID: UUID {
        switch self {
        case .offered(let item), .refused(let item, _), .deferred(let item, _, _), .refusedOffer(let item, _, _), .received(let item):
            item.id
        case .transferStarted(let id, _, _), .progress(let id, _, _), .delivered(let id, _), .rejected(let id, _),
             .discarded(let id, _), .duplicate(let id):
            id
        }
    }
}

extension NodeEvent {
    /// A delay in whole milliseconds as `deferred` has always printed it (through seconds as a `Double`),
    /// clamped to `Int`.
    static func milliseconds(_ duration: Duration) -> Int {
        let milliseconds = duration.timeInterval * 1000
        guard milliseconds < 0x1p63 else { return .max }
        guard milliseconds >= -0x1p63 else { return .min }
        return Int(milliseconds)
    }
}

/// Why a line is not a ``NodeEvent``.
public enum NodeEventDecodingError: Error, Sendable, Hashable, CustomStringConvertible {
    /// Not a JSON object with a string `event` (the JSON decoder's words).
    case malformed(String)
    /// An `event` this version does not know.
    case unknownEvent(String)
    /// The event lacks a field it always has (by its JSON key).
    case missingField(event: String, field: String)
    /// A field has a value the event cannot have (by its JSON key; the value as text).
    case invalidValue(event: String, field: String, value: String)

    /// The failure in words.
    public var description: String {
        switch self {
        case .malformed(let why): "not an event line: \(why)"
        case .unknownEvent(let name): "unknown event \"\(name)\""
        case .missingField(let event, let field): "\(event) without \(field)"
        case .invalidValue(let event, let field, let value): "\(event) with an invalid \(field): \(value)"
        }
    }
}
