import Foundation
import ThaliAdmission

/// One ``PeerEvent`` (or a ``PeerStatus``) as `thali-node run --json` prints it: one JSON object per
/// line with `event`, `t` (seconds since the start) and the event's own fields in snake_case, absent
/// when they do not apply; and as a readable line (``summary``). The schema is this type: apps that read
/// the output, and the command that prints it, share it. ``NodeEvent`` reads a line back
/// (``NodeEvent/init(jsonLine:)``) as the event it says, typed.
public struct PeerEventRecord: Codable, Sendable, Hashable {
    /// A matched contact in a `status` record.
    public struct ContactRecord: Codable, Sendable, Hashable {
        /// The contact's name.
        public var name: String
        /// `idle`, `matched`, `connecting`, `connected`, `backoff` or `gave-up`.
        public var state: String
        /// Where the contact is reached, or was last found.
        public var location: String?
        /// `wifi` or `bluetooth`: the route in use or tried next.
        public var binding: String?
        /// Relay mode: the local port whose connections reach the contact's app.
        public var relayPort: Int?

        enum CodingKeys: String, CodingKey {
            case name, state, location, binding
            case relayPort = "relay_port"
        }
    }

    /// The single port's counts in a `status` record (``PeerPortCounters``), in snake_case.
    public struct PortRecord: Codable, Sendable, Hashable {
        /// The admission gate's counts by snake_case name: `admitted`, `authenticated`, `refused` (every
        /// refusal) and each refusal by reason (`refused_source_rate`, `refused_source_unauthenticated`,
        /// `refused_source_open`, `refused_global_unauthenticated`, `refused_global_open`,
        /// `refused_overload`), `overloads`, `sources_refused`, `sources_forgotten`.
        public var admission: [String: Int]
        /// Connections recognised as beacon requests.
        public var beaconRequests: Int
        /// Connections recognised as PSK-TLS.
        public var tlsConnections: Int
        /// Connections cut for sending nothing (or no whole request) within the first-byte timeout.
        public var timedOut: Int

        enum CodingKeys: String, CodingKey {
            case admission
            case beaconRequests = "beacon_requests"
            case tlsConnections = "tls_connections"
            case timedOut = "timed_out"
        }
    }

    /// Discovery's counts in a `status` record (``PeerDiscoveryCounters``), in snake_case.
    public struct DiscoveryRecord: Codable, Sendable, Hashable {
        /// Beacon streams read.
        public var beaconFetches: Int
        /// Beacon fetches that failed, or were not made because their source was ignored.
        public var beaconFetchFailures: Int
        /// The failures by kind (`BeaconFetchFailure.Kind`'s names).
        public var failuresByKind: [String: Int]
        /// Over Wi-Fi (``PeerSSDPHealth``): `worst_loop_lag_ms`, `announcement_pauses`,
        /// `starved_failure_streaks`, `narrowing_episodes`, `sources_ignored`.
        public var ssdp: [String: Int]?

        enum CodingKeys: String, CodingKey {
            case beaconFetches = "beacon_fetches"
            case beaconFetchFailures = "beacon_fetch_failures"
            case failuresByKind = "failures_by_kind"
            case ssdp
        }
    }

    /// The event's name (`started`, `matched`, `progress`, `status`, ...).
    public var event: String
    /// Seconds since the start, to the millisecond.
    public var t: Double?
    /// A peer's location (SSDP `LOCATION` or `bluetooth:` and an address), or ours.
    public var location: String?
    /// `location_changed`: where peers found this node before it moved.
    public var previous: String?
    /// `advertising`: the contacts announced for.
    public var contacts: [String]?
    /// The contact the event concerns.
    public var contact: String?
    /// The public key of the contact the event concerns (``ContactIdentity/publicKey``), beside its name.
    public var contactKey: String?
    /// `wifi` or `bluetooth`: the binding a peer was found over (from the location), a connection runs
    /// over (`connecting`, `connected`, `disconnected`), or a `binding_unavailable` names.
    public var binding: String?
    /// `connecting`: failures in a row plus one.
    public var attempt: Int?
    /// `connecting` or `accepting`.
    public var role: String?
    /// `connected`, `disconnected`: the other side's TCP endpoint, `host:port`; the two events of one
    /// session carry the same (the conformance suite tells sessions apart by it).
    public var remote: String?
    /// Why a connection, a peer or an item ended as it did.
    public var reason: String?
    /// `disconnected`: true when the session ended cleanly (the other side's close_notify, or our own
    /// close), false when it ended with an error; a TCP close without close_notify is one (PSK-6.3).
    public var clean: Bool?
    /// `connection_failed`: milliseconds until the next attempt; absent when giving up.
    public var retryInMs: Int?
    /// `session_ended`: the error, absent when the session completed.
    public var error: String?
    /// A limit's kind, an item's kind (`text`, `file`), or a stream's (`delivery`, `relay`, `app/NAME`).
    public var kind: String?
    /// `limit_triggered`: what the limit switched off.
    public var effect: String?
    /// `limit_triggered`: for how long, in seconds.
    public var periodSeconds: Double?
    /// `limit_triggered`: what was exceeded, in words.
    public var detail: String?
    /// `relay_listening`, `relay_reopened`, `relay_closed`, `relay_port_unavailable`: the local port.
    public var port: Int?
    /// `relay_port_unavailable`: the port used instead, absent when none.
    public var instead: Int?
    /// An item's id.
    public var id: String?
    /// An item's size in bytes.
    public var size: Int64?
    /// `transfer_started`: where the transfer starts (above 0 when resumed).
    public var offset: UInt64?
    /// An item's total bytes.
    public var total: UInt64?
    /// `progress`: the bytes moved so far.
    public var bytes: UInt64?
    /// `delivered`: the receiver had the item already.
    public var alreadyStored: Bool?
    /// `received`: a text item's text.
    public var text: String?
    /// `received`, `refused`, `deferred`, `refused_offer`: a file item's name.
    public var fileName: String?
    /// `refused`, `deferred`, `refused_offer`: why the receiver refused the item, as a code: `too_large`,
    /// `invalid_name`, `expired` (for good) or `no_space` (for now); `reason` says it in words.
    public var refusal: String?
    /// `status`: the contacts advertised for.
    public var advertisingFor: [String]?
    /// `status`: the peers heard, by location.
    public var peersSeen: [String]?
    /// `status`: the contacts whose beacons matched, with their link state.
    public var matchedContacts: [ContactRecord]?
    /// `status`: authenticated sessions running (delivery, or in relay mode the sessions carrying a relay).
    public var sessionsInFlight: Int?
    /// `status`: relayed TCP connections open (relay mode).
    public var relayConnections: Int?
    /// `status`: the single port's admission and traffic counts (``PeerStatus/port``).
    public var portCounts: PortRecord?
    /// `status`: items in the inbox.
    public var inbox: Int?
    /// `status`: items waiting in the outbox.
    public var outbox: Int?
    /// `status`: how often each DoS limit fired, by kind.
    public var limitsTriggered: [String: Int]?
    /// `status`: beacons read and fetches failed, and over Wi-Fi how SSDP discovery fares.
    public var discovery: DiscoveryRecord?

    /// The readable line (not encoded).
    public var summary: String = ""

    enum CodingKeys: String, CodingKey {
        case event, t, location, previous, contacts, contact, binding, attempt, role, remote, reason, clean
        case contactKey = "contact_key"
        case retryInMs = "retry_in_ms"
        case error, kind, effect
        case periodSeconds = "period_s"
        case detail, port, instead, id, size, offset, total, bytes
        case alreadyStored = "already_stored"
        case text, refusal
        case fileName = "file_name"
        case advertisingFor = "advertising_for"
        case peersSeen = "peers_seen"
        case matchedContacts = "matched_contacts"
        case sessionsInFlight = "sessions_in_flight"
        case relayConnections = "relay_connections"
        case portCounts = "port_counts"
        case inbox, outbox
        case limitsTriggered = "limits_triggered"
        case discovery
    }

    /// An empty record of `event`.
    public init(event: String, summary: String) {
        self.event = event
        self.summary = summary
    }

    /// The record of `event`; nil for events that are not printed (`stopped`: the command prints its own).
    /// Its fields are those of ``NodeEvent/record`` (`NodeEvent(event)`); the summary says more.
    public init?(_ event: PeerEvent) {
        guard let line = NodeEvent(event) else { return nil }
        self = line.record
        summary = Self.summary(of: event)
    }

    /// The readable line of `event` (it has what the JSON leaves out: an offered file's name, sizes in words).
    private static func summary(of event: PeerEvent) -> String {
        switch event {
        case .started(let location):
            "listening at \(location) (beacons and PSK-TLS)"
        case .locationChanged(let location, let previous):
            "moved to \(location) (the interface's address changed; was \(previous))"
        case .advertising(let contacts):
            contacts.isEmpty ? "nothing to announce" : "advertising beacons for \(contacts.joined(separator: ", "))"
        case .peerAppeared(let location):
            "peer appeared at \(location)"
        case .peerLeft(let location, let reason):
            "peer at \(location) left: \(reason)"
        case .beaconMatched(let contact, let location):
            "beacon from \(contact) matched at \(location)"
        case .connecting(let contact, let location, let attempt):
            "connecting to \(contact) at \(location) (attempt \(attempt))"
        case .connected(let contact, let role, let binding, _):
            "PSK-TLS session with \(contact) up over \(binding.rawValue) (\(role == .connecting ? "we connected" : "they connected"))"
        case .connectionFailed(let contact, let reason, let retryIn):
            "connection with \(contact) failed: \(reason)"
                + (retryIn.map { "; retrying in \($0)" } ?? "; giving up until the next announcement")
        case .delivery(let contact, let delivery):
            summary(of: delivery, contact: contact.name)
        case .disconnected(let contact, _, let binding, _, let error):
            "PSK-TLS session with \(contact) over \(binding.rawValue) ended: \(error?.description ?? "closed")"
        case .sessionEnded(let contact, _, let error):
            "session with \(contact) ended" + (error.map { ": \($0)" } ?? "")
        case .limitTriggered(let report):
            "limit \(report.kind) fired: \(report.detail)"
        case .relayListening(let contact, let port):
            "relay: connections to 127.0.0.1:\(port) reach \(contact)'s app"
        case .relayReopened(let contact, let port):
            "relay: \(contact) reached again; connections to 127.0.0.1:\(port) reach \(contact)'s app again"
        case .relayClosed(let contact, let port):
            "relay: the session with \(contact) ended; 127.0.0.1:\(port) is closed "
                + "until \(contact) is reached again, then it reopens on the same port"
        case .relayPortUnavailable(let contact, let port, let reason, let instead):
            "relay: port \(port) for \(contact) cannot be opened (\(reason)); "
                + (instead.map { "connections to 127.0.0.1:\($0) reach \(contact)'s app instead" }
                    ?? "the session is closed and the node tries again")
        case .relayAppUnreachable(let contact, _, let error):
            if let error {
                "relay: app port \(error.address) "
                    + (error.reason == .refused ? "refused the connection" : "could not be reached (\(error))")
                    + "; the relayed connection from \(contact) was closed"
            } else {
                "relay: \(contact)'s node closed a relayed connection before any reply: "
                    + "its app port did not take it; the connection to the relay port was reset"
            }
        case .streamRefused(let contact, _, let kind, let refusal, let byThisNode):
            byThisNode
                ? "stream: refused \(kind.map { "a \($0) stream" } ?? "a stream") from \(contact): \(refusal.reason) (\(refusal.code))"
                : "stream: \(contact)'s node refused \(kind.map { "a \($0) stream" } ?? "a stream"): \(refusal.reason) (\(refusal.code))"
        case .bindingUnavailable(let binding, let reason):
            "\(binding) is not running: \(reason)"
        case .stopped:
            "stopped"
        }
    }

    private static func summary(of event: DeliveryEvent, contact: String) -> String {
        func short(_ id: UUID) -> Substring { id.uuidString.prefix(8) }
        switch event {
        case .offered(let offer):
            return "offering \(offer.kind == .text ? "a text" : "file \(offer.name)") (\(offer.size) bytes) to \(contact)"
        case .transferStarted(let id, let offset, let total):
            return "transfer of \(short(id)) with \(contact) starts at \(offset)/\(total)"
        case .progress(let id, let bytes, let total):
            return "  \(short(id)) with \(contact): \(bytes)/\(total) bytes (\(total == 0 ? 100 : bytes * 100 / total) %)"
        case .delivered(let id, let alreadyStored):
            return "delivered \(short(id)) to \(contact)" + (alreadyStored ? " (it had it already)" : "")
        case .refused(let offer, let refusal):
            return "\(contact) refused \(item(offer)): \(refusal.explanation(receiver: contact))"
        case .deferred(let offer, let refusal, let retryIn):
            return "\(contact) cannot hold \(item(offer)) now: \(refusal.explanation(receiver: contact)); "
                + "offered again in \(ByteWords.duration(retryIn))"
        case .refusedOffer(let offer, _, let words):
            return "refused \(item(offer)) from \(contact): \(words)"
        case .rejected(let id, let failure):
            return "\(contact) rejected \(short(id)) as damaged in transit (\(failure.explanation)); it will be sent again"
        case .discarded(let id, let failure):
            return "\(short(id)) with \(contact) arrived damaged (\(failure.explanation)); it will be sent again"
        case .received(let item):
            return "received from \(contact): " + (item.text.map { "\"\($0)\"" } ?? "\(item.fileName ?? "file") (\(item.size) bytes)")
        case .duplicate(let id):
            return "\(contact) offered \(short(id)) again; already in the inbox"
        }
    }

    /// An offered item in words: `"big.iso" (50.0 MiB)` or `a text (19 bytes)`.
    static func item(_ offer: ItemOffer) -> String {
        offer.kind == .text ? "a text (\(ByteCount.format(offer.size)))" : "\"\(offer.name)\" (\(ByteCount.format(offer.size)))"
    }

    /// The record of a status snapshot (the fields of ``NodeEvent/status(_:)``).
    public init(_ status: PeerStatus) {
        self = NodeEvent.status(NodeEvent.Status(status)).record
        let summary = status.matchedContacts.map { "\($0.name) \($0.state)" + ($0.relayPort.map { " (relay port \($0))" } ?? "") }
        let admission = status.port.admission
        let refusals = [("source rate", admission.refusedSourceRate), ("source unauthenticated", admission.refusedSourceUnauthenticated),
                        ("source open", admission.refusedSourceOpen), ("global unauthenticated", admission.refusedGlobalUnauthenticated),
                        ("global open", admission.refusedGlobalOpen), ("overload", admission.refusedOverload)]
            .filter { $0.1 > 0 }.map { "\($0.0) \($0.1)" }
        self.summary = "status: \(status.peersSeen.count) peer(s) seen; advertising for [\(status.advertisingFor.joined(separator: ", "))]; "
            + "matched contacts [\(summary.joined(separator: ", "))]; \(status.sessionsInFlight) session(s) in flight"
            + (status.relayConnections > 0 ? ", \(status.relayConnections) relayed connection(s)" : "")
            + "; inbox \(status.inboxCount), outbox \(status.outboxCount)"
            + "; port: \(admission.admitted) admitted, \(admission.authenticated) authenticated, \(admission.refused) refused"
            + (refusals.isEmpty ? "" : " (\(refusals.joined(separator: ", ")))")
            + (status.limitsTriggered.isEmpty ? "" : "; limits fired: "
                + status.limitsTriggered.sorted { $0.key < $1.key }.map { "\($0.key) ×\($0.value)" }.joined(separator: ", "))
            + "; beacons read \(status.discovery.beaconFetches), fetches failed \(status.discovery.beaconFetchFailures)"
            + (status.discovery.ssdp.map { ", discovery's loop at most \($0.worstLoopLagMilliseconds) ms late" } ?? "")
    }

    /// The JSON line (no newline): keys sorted, slashes unescaped, and the characters that drive a
    /// terminal which JSON leaves as they are (DEL, the C1 controls, the bidirectional overrides) written
    /// as `\u` escapes: texts, names and reasons come from other peers, and the line may reach a terminal.
    public func jsonLine() throws -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let data = try encoder.encode(self)
        // JSONEncoder escapes C0 already; the rest are above 0x7E, so plain ASCII output is final.
        guard data.contains(where: { $0 >= 0x7F }) else { return data }
        var escaped = ""
        for scalar in String(decoding: data, as: UTF8.self).unicodeScalars {
            if (0x7F...0x9F).contains(scalar.value) || (0x202A...0x202E).contains(scalar.value) || (0x2066...0x2069).contains(scalar.value) {
                escaped += String(format: "\\u%04X", scalar.value)
            } else {
                escaped.unicodeScalars.append(scalar)
            }
        }
        return Data(escaped.utf8)
    }
}

extension PeerStatus: CustomStringConvertible {
    /// The snapshot in words, as `thali-node run` prints it.
    public var description: String { PeerEventRecord(self).summary }
}
