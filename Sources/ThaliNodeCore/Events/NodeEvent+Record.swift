import Foundation

extension NodeEvent {
    /// The event's record (``PeerEventRecord``): its fields, with no summary and no time.
    public var record: PeerEventRecord {
        var record = PeerEventRecord(event: name, summary: "")
        switch self {
        case .started(let location):
            record.location = location.description
        case .locationChanged(let location, let previous):
            (record.location, record.previous) = (location.description, previous.description)
        case .advertising(let contacts):
            record.contacts = contacts
        case .peerAppeared(let location):
            (record.location, record.binding) = (location.description, location.binding.rawValue)
        case .peerLeft(let location, let reason):
            (record.location, record.reason, record.binding) = (location.description, reason.rawValue, location.binding.rawValue)
        case .beaconMatched(_, let location):
            (record.location, record.binding) = (location.description, location.binding.rawValue)
        case .connecting(_, let location, let attempt):
            (record.location, record.attempt) = (location.description, attempt)
            record.binding = location.binding.rawValue
        case .connected(_, let role, let binding, let remote):
            (record.role, record.binding, record.remote) = (role.rawValue, binding.rawValue, remote)
        case .connectionFailed(_, let reason, let retryIn):
            record.reason = reason
            record.retryInMs = retryIn.map { Int($0.components.seconds * 1000 + $0.components.attoseconds / 1_000_000_000_000_000) }
        case .delivery(let contact, let delivery):
            delivery.fill(&record, contact: contact)
        case .disconnected(_, let role, let binding, let remote, let reason):
            (record.role, record.binding, record.remote) = (role.rawValue, binding.rawValue, remote)
            (record.reason, record.clean) = (reason ?? "closed", reason == nil)
        case .sessionEnded(_, let role, let error):
            (record.role, record.error) = (role.rawValue, error)
        case .limitTriggered(let kind, let effect, let periodSeconds, let detail):
            (record.kind, record.effect, record.detail, record.periodSeconds) = (kind.rawValue, effect.rawValue, detail, periodSeconds)
        case .relayListening(_, let port), .relayReopened(_, let port), .relayClosed(_, let port):
            record.port = port
        case .relayPortUnavailable(_, let port, let reason, let instead):
            (record.port, record.reason, record.instead) = (port, reason, instead)
        case .relayAppUnreachable(let contact, let role, let error):
            record.role = role.rawValue
            record.reason = error ?? Self.closedBeforeAnyReply(contact.name)
        case .streamRefused(let contact, let role, let kind, let refusal, let byThisNode):
            (record.role, record.kind) = (role.rawValue, kind)
            record.reason = "\(refusal.code): \(refusal.reason)"
            record.detail = byThisNode ? Self.refusedHere : Self.refusedThere(contact.name)
        case .bindingUnavailable(let binding, let reason):
            (record.binding, record.reason) = (binding.rawValue, reason)
        case .status(let status):
            record.location = status.location?.description ?? ""
            record.advertisingFor = status.advertisingFor
            record.peersSeen = status.peersSeen.map(\.description)
            record.matchedContacts = status.matchedContacts.map {
                PeerEventRecord.ContactRecord(name: $0.name, state: $0.state.rawValue, location: $0.location?.description,
                                              binding: $0.binding?.rawValue, relayPort: $0.relayPort)
            }
            (record.sessionsInFlight, record.relayConnections) = (status.sessionsInFlight, status.relayConnections)
            (record.portCounts, record.inbox, record.outbox) = (status.port, status.inbox, status.outbox)
            record.limitsTriggered = Dictionary(uniqueKeysWithValues: status.limitsTriggered.map { ($0.key.rawValue, $0.value) })
            record.discovery = status.discovery
        case .expired(let item):
            record.fill(item)
        case .stopped(let reason):
            record.reason = reason
        }
        if let contact { (record.contact, record.contactKey) = (contact.name, contact.publicKey) }
        return record
    }

    /// The event's JSON line (no newline), as ``PeerEventRecord/jsonLine()`` writes it, without `t`.
    public func jsonLine() throws -> Data { try record.jsonLine() }

    /// Decodes one JSON line as `run --json` prints it (without its newline; `t` and `summary` are
    /// ignored).
    public init(jsonLine: some DataProtocol) throws(NodeEventDecodingError) {
        try self.init(PeerEventRecord(jsonLine: jsonLine))
    }

    /// The event `record` holds.
    public init(_ record: PeerEventRecord) throws(NodeEventDecodingError) {
        let line = Fields(record)
        switch record.event {
        case "started":
            self = .started(location: try line.location())
        case "location_changed":
            self = .locationChanged(location: try line.location(), previous: try line.parsed(\.previous, "previous", PeerLocation.init))
        case "advertising":
            self = .advertising(contacts: try line.required(\.contacts, "contacts"))
        case "peer_appeared":
            self = .peerAppeared(location: try line.location())
        case "peer_left":
            self = .peerLeft(location: try line.location(), reason: try line.parsed(\.reason, "reason", PeerDepartureReason.init(rawValue:)))
        case "matched":
            self = .beaconMatched(contact: try line.contact(), location: try line.location())
        case "connecting":
            self = .connecting(contact: try line.contact(), location: try line.location(), attempt: try line.required(\.attempt, "attempt"))
        case "connected":
            self = .connected(contact: try line.contact(), role: try line.role(), binding: try line.binding(), remote: record.remote)
        case "connection_failed":
            var retryIn: Duration?
            if let milliseconds = record.retryInMs { retryIn = try line.delay(milliseconds) }
            self = .connectionFailed(contact: try line.contact(), reason: try line.required(\.reason, "reason"), retryIn: retryIn)
        case "disconnected":
            // `reason` is `closed` when `clean`: the error's words otherwise.
            var reason: String?
            if try !line.required(\.clean, "clean") { reason = try line.required(\.reason, "reason") }
            self = .disconnected(contact: try line.contact(), role: try line.role(), binding: try line.binding(), remote: record.remote,
                                 reason: reason)
        case "session_ended":
            self = .sessionEnded(contact: try line.contact(), role: try line.role(), error: record.error)
        case "limit_triggered":
            self = .limitTriggered(kind: try line.parsed(\.kind, "kind", PeerLimitKind.init(rawValue:)),
                                   effect: try line.parsed(\.effect, "effect", PeerLimitReport.Effect.init(rawValue:)),
                                   periodSeconds: try line.required(\.periodSeconds, "period_s"), detail: try line.required(\.detail, "detail"))
        case "relay_listening":
            self = .relayListening(contact: try line.contact(), port: try line.required(\.port, "port"))
        case "relay_reopened":
            self = .relayReopened(contact: try line.contact(), port: try line.required(\.port, "port"))
        case "relay_closed":
            self = .relayClosed(contact: try line.contact(), port: try line.required(\.port, "port"))
        case "relay_port_unavailable":
            self = .relayPortUnavailable(contact: try line.contact(), port: try line.required(\.port, "port"),
                                         reason: try line.required(\.reason, "reason"), instead: record.instead)
        case "relay_app_unreachable":
            let contact = try line.contact()
            let reason = try line.required(\.reason, "reason")
            self = .relayAppUnreachable(contact: contact, role: try line.role(), error: reason == Self.closedBeforeAnyReply(contact.name) ? nil : reason)
        case "stream_refused":
            let contact = try line.contact()
            let detail = try line.required(\.detail, "detail")
            guard detail == Self.refusedHere || detail == Self.refusedThere(contact.name) else {
                throw line.invalid("detail", detail)
            }
            self = .streamRefused(contact: contact, role: try line.role(), kind: record.kind,
                                  refusal: try line.parsed(\.reason, "reason", StreamRefusal.init(line:)), byThisNode: detail == Self.refusedHere)
        case "binding_unavailable":
            self = .bindingUnavailable(binding: try line.binding(), reason: try line.required(\.reason, "reason"))
        case "status":
            self = .status(try Status(line))
        case "expired":
            self = .expired(try line.item())
        case "stopped":
            self = .stopped(reason: try line.required(\.reason, "reason"))
        default:
            guard let delivery = try Delivery(line) else { throw .unknownEvent(record.event) }
            self = .delivery(contact: try line.contact(), delivery)
        }
    }

    static func closedBeforeAnyReply(_ contact: String) -> String { "closed by \(contact)'s node before any reply" }
    static let refusedHere = "refused by this node"
    static func refusedThere(_ contact: String) -> String { "refused by \(contact)'s node" }
}

extension NodeEvent.Delivery {
    /// Fills in the fields of this event with `contact`.
    func fill(_ record: inout PeerEventRecord, contact: ContactIdentity) {
        func item(_ item: NodeEvent.Item) { record.fill(item) }
        (record.contact, record.contactKey) = (contact.name, contact.publicKey)
        switch self {
        case .offered(let offered):
            item(offered)
        case .transferStarted(let id, let offset, let total):
            (record.id, record.offset, record.total) = (id.uuidString, offset, total)
        case .progress(let id, let bytes, let total):
            (record.id, record.bytes, record.total) = (id.uuidString, bytes, total)
        case .delivered(let id, let alreadyStored):
            (record.id, record.alreadyStored) = (id.uuidString, alreadyStored)
        case .refused(let offer, let refusal):
            item(offer)
            (record.refusal, record.reason) = (refusal.code, refusal.explanation(receiver: contact.name))
        case .deferred(let offer, let refusal, let retryIn):
            item(offer)
            (record.refusal, record.reason) = (refusal.code, refusal.explanation(receiver: contact.name))
            record.retryInMs = Int(retryIn.components.seconds * 1000 + retryIn.components.attoseconds / 1_000_000_000_000_000)
        case .refusedOffer(let offer, let refusal, let reason):
            item(offer)
            (record.refusal, record.reason) = (refusal.code, reason)
        case .rejected(let id, let failure), .discarded(let id, let failure):
            (record.id, record.reason) = (id.uuidString, failure.explanation)
        case .received(let received):
            item(received)
        case .duplicate(let id):
            record.id = id.uuidString
        }
    }

    /// The delivery event of `line`; nil when its name is none.
    fileprivate init?(_ line: NodeEvent.Fields) throws(NodeEventDecodingError) {
        func refusal() throws(NodeEventDecodingError) -> ItemRefusal {
            try line.parsed(\.refusal, "refusal") { code in ItemRefusal.allCases.first { $0.code == code } }
        }
        func failure() throws(NodeEventDecodingError) -> TransferFailure {
            try line.parsed(\.reason, "reason") { words in TransferFailure.allCases.first { $0.explanation == words } }
        }
        switch line.record.event {
        case "offered": self = .offered(try line.item())
        case "transfer_started":
            self = .transferStarted(id: try line.id(), offset: try line.required(\.offset, "offset"), total: try line.required(\.total, "total"))
        case "progress":
            self = .progress(id: try line.id(), bytes: try line.required(\.bytes, "bytes"), total: try line.required(\.total, "total"))
        case "delivered": self = .delivered(id: try line.id(), alreadyStored: try line.required(\.alreadyStored, "already_stored"))
        case "refused": self = .refused(try line.item(), try refusal())
        case "deferred": self = .deferred(try line.item(), try refusal(), retryIn: try line.delay(try line.required(\.retryInMs, "retry_in_ms")))
        case "refused_offer": self = .refusedOffer(try line.item(), try refusal(), reason: try line.required(\.reason, "reason"))
        case "rejected": self = .rejected(id: try line.id(), try failure())
        case "discarded": self = .discarded(id: try line.id(), try failure())
        case "received": self = .received(try line.item())
        case "duplicate": self = .duplicate(id: try line.id())
        default: return nil
        }
    }
}

extension NodeEvent.Status {
    fileprivate init(_ line: NodeEvent.Fields) throws(NodeEventDecodingError) {
        let text = try line.required(\.location, "location")
        let location: PeerLocation?
        if text.isEmpty {
            location = nil
        } else {
            guard let parsed = PeerLocation(text) else { throw line.invalid("location", text) }
            location = parsed
        }
        var peersSeen: [PeerLocation] = []
        for peer in try line.required(\.peersSeen, "peers_seen") {
            guard let parsed = PeerLocation(peer) else { throw line.invalid("peers_seen", peer) }
            peersSeen.append(parsed)
        }
        var contacts: [PeerStatus.ContactState] = []
        for contact in try line.required(\.matchedContacts, "matched_contacts") {
            guard let state = ContactLinkPhase(rawValue: contact.state) else { throw line.invalid("matched_contacts", contact.state) }
            var location: PeerLocation?
            if let text = contact.location {
                guard let parsed = PeerLocation(text) else { throw line.invalid("matched_contacts", text) }
                location = parsed
            }
            contacts.append(PeerStatus.ContactState(name: contact.name, state: state, location: location,
                                                    binding: contact.binding.map(PeerBindingKind.init(rawValue:)), relayPort: contact.relayPort))
        }
        var limits: [PeerLimitKind: Int] = [:]
        for (name, count) in try line.required(\.limitsTriggered, "limits_triggered") {
            guard let kind = PeerLimitKind(rawValue: name) else { throw line.invalid("limits_triggered", name) }
            limits[kind] = count
        }
        self.init(location: location, advertisingFor: try line.required(\.advertisingFor, "advertising_for"), peersSeen: peersSeen,
                  matchedContacts: contacts, sessionsInFlight: try line.required(\.sessionsInFlight, "sessions_in_flight"),
                  relayConnections: try line.required(\.relayConnections, "relay_connections"),
                  inbox: try line.required(\.inbox, "inbox"), outbox: try line.required(\.outbox, "outbox"), limitsTriggered: limits,
                  port: try line.required(\.portCounts, "port_counts"), discovery: try line.required(\.discovery, "discovery"))
    }
}

extension NodeEvent {
    /// A record's fields read for one event, each failure naming the event and the JSON key.
    fileprivate struct Fields {
        let record: PeerEventRecord

        init(_ record: PeerEventRecord) { self.record = record }

        func invalid(_ key: String, _ value: String) -> NodeEventDecodingError {
            .invalidValue(event: record.event, field: key, value: value)
        }

        func required<Value>(_ field: KeyPath<PeerEventRecord, Value?>, _ key: String) throws(NodeEventDecodingError) -> Value {
            guard let value = record[keyPath: field] else { throw .missingField(event: record.event, field: key) }
            return value
        }

        func parsed<Value>(_ field: KeyPath<PeerEventRecord, String?>, _ key: String, _ parse: (String) -> Value?)
            throws(NodeEventDecodingError) -> Value {
            let text = try required(field, key)
            guard let value = parse(text) else { throw invalid(key, text) }
            return value
        }

        func contact() throws(NodeEventDecodingError) -> ContactIdentity {
            ContactIdentity(name: try required(\.contact, "contact"), publicKey: try required(\.contactKey, "contact_key"))
        }
        func location() throws(NodeEventDecodingError) -> PeerLocation { try parsed(\.location, "location", PeerLocation.init) }
        func role() throws(NodeEventDecodingError) -> PeerEvent.Role { try parsed(\.role, "role", PeerEvent.Role.init(rawValue:)) }
        func binding() throws(NodeEventDecodingError) -> PeerBindingKind {
            try parsed(\.binding, "binding") { $0.isEmpty ? nil : PeerBindingKind(rawValue: $0) }
        }
        func id() throws(NodeEventDecodingError) -> UUID { try parsed(\.id, "id", UUID.init(uuidString:)) }

        func item() throws(NodeEventDecodingError) -> Item {
            Item(id: try id(), kind: try parsed(\.kind, "kind", ItemKind.init(rawValue:)), size: try required(\.size, "size"),
                 fileName: record.fileName, text: record.text)
        }

        /// A delay in milliseconds: not negative (the line never has one, and whole milliseconds of any
        /// `Int` fit a `Duration`).
        func delay(_ milliseconds: Int) throws(NodeEventDecodingError) -> Duration {
            guard milliseconds >= 0 else { throw invalid("retry_in_ms", String(milliseconds)) }
            return .milliseconds(milliseconds)
        }
    }
}

extension StreamRefusal {
    /// Parses `CODE: REASON` as a `stream_refused` line's `reason` has it (the code's description:
    /// `not-served`, ..., or `code N`).
    fileprivate init?(line text: String) {
        guard let separator = text.range(of: ": ") else { return nil }
        let name = text[..<separator.lowerBound]
        let named: [Code] = [.unknownKind, .notServed, .appUnreachable, .badHeader]
        if let code = named.first(where: { $0.description == name }) {
            self.init(code, reason: String(text[separator.upperBound...]))
        } else if name.hasPrefix("code "), let number = UInt8(name.dropFirst("code ".count)), number != 0 {
            self.init(Code(rawValue: number), reason: String(text[separator.upperBound...]))
        } else {
            return nil
        }
    }
}

extension PeerEventRecord {
    /// Fills in an item's fields: every one the decoder reads back (``NodeEvent/Fields/item()``).
    fileprivate mutating func fill(_ item: NodeEvent.Item) {
        (id, kind, size, text, fileName) = (item.id.uuidString, item.kind.rawValue, item.size, item.text, item.fileName)
    }

    /// Decodes one JSON line (without its newline) as a record.
    public init(jsonLine: some DataProtocol) throws(NodeEventDecodingError) {
        do {
            self = try JSONDecoder().decode(PeerEventRecord.self, from: Data(jsonLine))
        } catch DecodingError.keyNotFound(let key, _) {
            throw .missingField(event: "?", field: key.stringValue)
        } catch DecodingError.typeMismatch(_, let context) where !context.codingPath.isEmpty {
            throw .invalidValue(event: "?", field: context.codingPath.map(\.stringValue).joined(separator: "."), value: context.debugDescription)
        } catch DecodingError.valueNotFound(_, let context) where !context.codingPath.isEmpty {
            throw .invalidValue(event: "?", field: context.codingPath.map(\.stringValue).joined(separator: "."), value: context.debugDescription)
        } catch {
            throw .malformed("\(error)")
        }
    }
}
