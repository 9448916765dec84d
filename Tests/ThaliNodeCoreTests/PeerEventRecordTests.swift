import Foundation
import Testing
@testable import ThaliNodeCore

/// The `--json` schema: snake_case keys, absent fields left out, the binding named from the location.
@Suite struct PeerEventRecordTests {
    static let bluetoothPeer = PeerLocation("bluetooth:00:AA:01:00:00:01")!
    static let wifiPeer = PeerLocation("http://10.0.0.2:4000/NotificationBeacons")!

    /// The record's JSON line.
    static func line(_ record: PeerEventRecord?) throws -> String {
        String(decoding: try #require(record).jsonLine(), as: UTF8.self)
    }

    @Test func eventsCarryTheirFieldsAndNothingElse() throws {
        let refused = PeerConnectionError(.refused, address: "10.0.0.2:4000")
        #expect(try Self.line(PeerEventRecord(.connectionFailed(contact: .sample("bob"), reason: refused, retryIn: .milliseconds(1500))))
            == #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"connection_failed","reason":"connection refused by 10.0.0.2:4000","retry_in_ms":1500}"#)
        #expect(try Self.line(PeerEventRecord(.connectionFailed(contact: .sample("bob"), reason: refused, retryIn: nil)))
            == #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"connection_failed","reason":"connection refused by 10.0.0.2:4000"}"#)
        #expect(try Self.line(PeerEventRecord(.beaconMatched(contact: .sample("bob"), location: Self.wifiPeer)))
            == #"{"binding":"wifi","contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"matched","location":"http://10.0.0.2:4000/NotificationBeacons"}"#)
        #expect(try Self.line(PeerEventRecord(.peerAppeared(location: Self.bluetoothPeer)))
            == #"{"binding":"bluetooth","event":"peer_appeared","location":"bluetooth:00:AA:01:00:00:01"}"#)
        #expect(try Self.line(PeerEventRecord(.connected(contact: .sample("bob"), role: .accepting, binding: .bluetooth, remote: "127.0.0.1:40001")))
            == #"{"binding":"bluetooth","contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"connected","remote":"127.0.0.1:40001","role":"accepting"}"#)
        #expect(try Self.line(PeerEventRecord(.disconnected(contact: .sample("bob"), role: .connecting, binding: .wifi, remote: "10.0.0.2:4000", reason: nil)))
            == #"{"binding":"wifi","clean":true,"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"disconnected","reason":"closed","remote":"10.0.0.2:4000","role":"connecting"}"#)
        // Slashes stay readable.
        #expect(String(decoding: try #require(PeerEventRecord(.started(location: Self.wifiPeer))).jsonLine(), as: UTF8.self)
            .contains("http://10.0.0.2:4000/NotificationBeacons"))
        #expect(PeerEventRecord(.stopped) == nil)
    }

    @Test("a binding of an app's own names its peers KIND:ADDRESS, and its kind in events and JSON")
    func anAppsOwnBindingHasItsOwnKindAndLocations() throws {
        let lora = PeerBindingKind(rawValue: "lora", preference: 200)
        let location = try #require(PeerLocation("lora:node-7"))
        #expect(location == .other(lora, address: "node-7") && location.binding == lora && location.description == "lora:node-7")
        #expect(PeerLocation("bluetooth:00:AA:01:00:00:01") == Self.bluetoothPeer)
        for text in ["lora:", ":node", "node-7", "bluetooth:not-an-address", "wifi:x", "http:x"] {
            #expect(PeerLocation(text) == nil, "\(text)")
        }
        #expect(try Self.line(PeerEventRecord(.peerAppeared(location: location))) == #"{"binding":"lora","event":"peer_appeared","location":"lora:node-7"}"#)
        let decoded = try JSONDecoder().decode([PeerBindingKind].self, from: Data(#"["wifi","bluetooth","lora"]"#.utf8))
        #expect(decoded == [.wifi, .bluetooth, lora] && decoded.map(\.preference) == [0, 100, 50])
        #expect(String(decoding: try JSONEncoder().encode(location), as: UTF8.self) == #""lora:node-7""#)
    }

    @Test func deliveryAndStatusRecords() throws {
        let id = UUID()
        #expect(try Self.line(PeerEventRecord(.delivery(contact: .sample("bob"), .progress(id: id, bytes: 10, total: 20))))
            == #"{"bytes":10,"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"progress","id":"\#(id.uuidString)","total":20}"#)
        let status = PeerStatus(location: Self.bluetoothPeer, advertisingFor: ["bob"], peersSeen: [],
                                matchedContacts: [.init(name: "bob", state: .backoff, location: nil, binding: .wifi, relayPort: 7000)],
                                sessionsInFlight: 1, inboxCount: 2, outboxCount: 3)
        let line = try Self.line(PeerEventRecord(status))
        #expect(line.contains(#""matched_contacts":[{"binding":"wifi","name":"bob","relay_port":7000,"state":"backoff"}]"#), "\(line)")
        guard case .status(let read) = try NodeEvent(jsonLine: Data(line.utf8)) else {
            Issue.record("the status line is no status: \(line)")
            return
        }
        #expect(read.sessionsInFlight == 1 && read.matchedContacts == status.matchedContacts)
        #expect(PeerEventRecord(status).summary.contains("bob backoff (relay port 7000)"))
    }

    /// The `--json` lines, byte for byte, of the events and the status whose fields are typed values in
    /// the API (locations, bindings, limit kinds, link states): the strings are made here only.
    @Test func typedValuesPrintAsTheirNames() throws {
        func line(_ record: PeerEventRecord?) throws -> String {
            String(decoding: try #require(record).jsonLine(), as: UTF8.self)
        }
        #expect(try line(PeerEventRecord(.connecting(contact: .sample("bob"), location: Self.bluetoothPeer, attempt: 2)))
            == #"{"attempt":2,"binding":"bluetooth","contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"connecting","location":"bluetooth:00:AA:01:00:00:01"}"#)
        #expect(try line(PeerEventRecord(.peerLeft(location: Self.wifiPeer, reason: .byebye)))
            == #"{"binding":"wifi","event":"peer_left","location":"http://10.0.0.2:4000/NotificationBeacons","reason":"byebye"}"#)
        #expect(try line(PeerEventRecord(.sessionEnded(contact: .sample("bob"), role: .accepting, error: nil)))
            == #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"session_ended","role":"accepting"}"#)
        let cutShort = PeerConnectionError(CancellationError(), address: "10.0.0.2:4000")
        #expect(try line(PeerEventRecord(.sessionEnded(contact: .sample("bob"), role: .connecting, error: cutShort)))
            == #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","error":"connection with 10.0.0.2:4000 closed: this peer stopped","event":"session_ended","role":"connecting"}"#)
        #expect(try line(PeerEventRecord(.bindingUnavailable(binding: .wifi, reason: "no usable network interface")))
            == #"{"binding":"wifi","event":"binding_unavailable","reason":"no usable network interface"}"#)
        #expect(try line(PeerEventRecord(.disconnected(contact: .sample("bob"), role: .accepting, binding: .bluetooth, remote: nil, reason: nil)))
            == #"{"binding":"bluetooth","clean":true,"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"disconnected","reason":"closed","role":"accepting"}"#)
        let reset = PeerConnectionError(.reset, address: "10.0.0.2:4000")
        #expect(try line(PeerEventRecord(.disconnected(contact: .sample("bob"), role: .connecting, binding: .wifi, remote: nil, reason: reset)))
            == #"{"binding":"wifi","clean":false,"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"disconnected","reason":"connection to 10.0.0.2:4000 reset by the other side","role":"connecting"}"#)
        let report = PeerLimitReport(kind: .announcementFlood, effect: .discoveryOff, period: .seconds(30), detail: "too many")
        #expect(try line(PeerEventRecord(.limitTriggered(report)))
            == #"{"detail":"too many","effect":"discovery-off","event":"limit_triggered","kind":"announcementFlood","period_s":30}"#)
        let status = PeerStatus(location: Self.wifiPeer, advertisingFor: [], peersSeen: [Self.bluetoothPeer],
                                matchedContacts: [.init(name: "bob", state: .gaveUp, location: Self.bluetoothPeer,
                                                        binding: .bluetooth, relayPort: nil)],
                                sessionsInFlight: 0, inboxCount: 0, outboxCount: 1,
                                limitsTriggered: [.narrowed: 2, .announcementFlood: 1])
        #expect(try line(PeerEventRecord(status)) == #"{"advertising_for":[],"#
            + #""discovery":{"beacon_fetch_failures":0,"beacon_fetches":0,"failures_by_kind":{}},"event":"status","inbox":0,"#
            + #""limits_triggered":{"announcementFlood":1,"narrowed":2},"location":"http://10.0.0.2:4000/NotificationBeacons","#
            + #""matched_contacts":[{"binding":"bluetooth","location":"bluetooth:00:AA:01:00:00:01","name":"bob","state":"gave-up"}],"#
            + #""outbox":1,"peers_seen":["bluetooth:00:AA:01:00:00:01"],"#
            + #""port_counts":{"admission":{"admitted":0,"authenticated":0,"overloads":0,"refused":0,"refused_global_open":0,"#
            + #""refused_global_unauthenticated":0,"refused_overload":0,"refused_source_open":0,"refused_source_rate":0,"#
            + #""refused_source_unauthenticated":0,"sources_forgotten":0,"sources_refused":0},"beacon_requests":0,"timed_out":0,"#
            + #""tls_connections":0},"relay_connections":0,"sessions_in_flight":0}"#)
        #expect(PeerEventRecord(status).summary.hasSuffix("limits fired: announcementFlood ×1, narrowed ×2; beacons read 0, fetches failed 0"))
        // Printing an event or a status gives words, not type names.
        #expect("\(PeerEvent.connected(contact: .sample("bob"), role: .connecting, binding: .wifi, remote: "10.0.0.2:4000"))"
            == "PSK-TLS session with bob up over wifi (we connected)")
        #expect("\(PeerEvent.Role.connecting)" == "connecting")
        #expect("\(PeerEvent.peerLeft(location: Self.wifiPeer, reason: .expired))"
            == "peer at http://10.0.0.2:4000/NotificationBeacons left: its announcement expired")
        #expect("\(PeerEvent.sessionEnded(contact: .sample("bob"), role: .connecting, error: cutShort))"
            == "session with bob ended: connection with 10.0.0.2:4000 closed: this peer stopped")
        #expect("\(status)".hasPrefix("status: 1 peer(s) seen; advertising for []; matched contacts [bob gave-up]"))
    }
}
