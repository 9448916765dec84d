import Foundation
import Testing
@testable import ThaliNodeCore

/// Event lines read back: every ``PeerEvent`` decodes from its `--json` line to what the line says
/// (``NodeEvent``), the line unchanged byte for byte, and a line that is not an event is a typed error.
@Suite struct NodeEventTests {
    /// The lines of ``PeerEventSamples/all`` (but `stopped`, which has none) as `run --json` printed them
    /// before events could be read back: the wire form must not change.
    static let lines = [
        #"{"event":"started","location":"http://10.0.0.2:4000/NotificationBeacons"}"#,
        #"{"event":"started","location":"bluetooth:00:AA:01:00:00:01"}"#,
        #"{"event":"location_changed","location":"http://10.0.0.9:4000/NotificationBeacons","previous":"http://10.0.0.2:4000/NotificationBeacons"}"#,
        #"{"contacts":[],"event":"advertising"}"#,
        #"{"contacts":["bob","carol"],"event":"advertising"}"#,
        #"{"binding":"wifi","event":"peer_appeared","location":"http://10.0.0.2:4000/NotificationBeacons"}"#,
        #"{"binding":"lora","event":"peer_appeared","location":"lora:node-7"}"#,
        #"{"binding":"wifi","event":"peer_left","location":"http://10.0.0.2:4000/NotificationBeacons","reason":"byebye"}"#,
        #"{"binding":"bluetooth","event":"peer_left","location":"bluetooth:00:AA:01:00:00:01","reason":"narrowed"}"#,
        #"{"binding":"bluetooth","contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"matched","location":"bluetooth:00:AA:01:00:00:01"}"#,
        #"{"attempt":3,"binding":"wifi","contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"connecting","location":"http://10.0.0.2:4000/NotificationBeacons"}"#,
        #"{"binding":"wifi","contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"connected","remote":"10.0.0.2:4000","role":"connecting"}"#,
        #"{"binding":"bluetooth","contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"connected","role":"accepting"}"#,
        #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"connection_failed","reason":"connection refused by 10.0.0.2:4000","retry_in_ms":1500}"#,
        #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"connection_failed","reason":"connection to 10.0.0.2:4000 reset by the other side"}"#,
        #"{"binding":"wifi","clean":true,"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"disconnected","reason":"closed","remote":"10.0.0.2:4000","role":"accepting"}"#,
        #"{"binding":"bluetooth","clean":false,"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"disconnected","reason":"connection to 10.0.0.2:4000 reset by the other side","role":"connecting"}"#,
        #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"session_ended","role":"accepting"}"#,
        #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","error":"connection with 10.0.0.2:4000 closed: this peer stopped","event":"session_ended","role":"connecting"}"#,
        #"{"detail":"1001 connections within 5 s","effect":"port-closed","event":"limit_triggered","kind":"httpOverload","period_s":30.25}"#,
        #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"relay_listening","port":7000}"#,
        #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"relay_reopened","port":7000}"#,
        #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"relay_closed","port":7000}"#,
        #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"relay_port_unavailable","instead":7001,"port":7000,"reason":"address in use"}"#,
        #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"relay_port_unavailable","port":7000,"reason":"address in use"}"#,
        #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"relay_app_unreachable","reason":"connection refused by 127.0.0.1:8080","role":"accepting"}"#,
        #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"relay_app_unreachable","reason":"closed by bob's node before any reply","role":"connecting"}"#,
        #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","detail":"refused by this node","event":"stream_refused","kind":"app/chat","reason":"not-served: no handler: for app/chat","role":"accepting"}"#,
        #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","detail":"refused by bob's node","event":"stream_refused","reason":"code 9: late","role":"connecting"}"#,
        #"{"binding":"bluetooth","event":"binding_unavailable","reason":"no adapter hci0"}"#,
        #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"offered","id":"7A1B2C3D-0000-4000-8000-000000000001","kind":"text","size":19}"#,
        #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"offered","id":"7A1B2C3D-0000-4000-8000-000000000001","kind":"file","size":52428800}"#,
        #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"transfer_started","id":"7A1B2C3D-0000-4000-8000-000000000001","offset":4096,"total":52428800}"#,
        #"{"bytes":10,"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"progress","id":"7A1B2C3D-0000-4000-8000-000000000001","total":20}"#,
        #"{"already_stored":false,"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"delivered","id":"7A1B2C3D-0000-4000-8000-000000000001"}"#,
        #"{"already_stored":true,"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"delivered","id":"7A1B2C3D-0000-4000-8000-000000000001"}"#,
        #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"refused","file_name":"big \"iso\".iso","id":"7A1B2C3D-0000-4000-8000-000000000001","kind":"file","reason":"larger than what bob accepts","refusal":"too_large","size":52428800}"#,
        #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"refused","id":"7A1B2C3D-0000-4000-8000-000000000001","kind":"text","reason":"it had expired by bob's clock","refusal":"expired","size":19}"#,
        #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"deferred","file_name":"big \"iso\".iso","id":"7A1B2C3D-0000-4000-8000-000000000001","kind":"file","reason":"not enough space","refusal":"no_space","retry_in_ms":300000,"size":52428800}"#,
        #"{"contact":"alice","contact_key":"\#(ContactIdentity.sample("alice").publicKey)","event":"refused_offer","file_name":"big \"iso\".iso","id":"7A1B2C3D-0000-4000-8000-000000000001","kind":"file","reason":"not enough space: 1.0 MiB free","refusal":"no_space","size":52428800}"#,
        #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"rejected","id":"7A1B2C3D-0000-4000-8000-000000000001","reason":"its SHA-256 did not match the offer's"}"#,
        #"{"contact":"alice","contact_key":"\#(ContactIdentity.sample("alice").publicKey)","event":"discarded","id":"7A1B2C3D-0000-4000-8000-000000000001","reason":"the text was not valid UTF-8"}"#,
        #"{"contact":"alice","contact_key":"\#(ContactIdentity.sample("alice").publicKey)","event":"received","id":"7A1B2C3D-0000-4000-8000-000000000001","kind":"text","size":12,"text":"hello\u0085 bob \u202E"}"#,
        #"{"contact":"alice","contact_key":"\#(ContactIdentity.sample("alice").publicKey)","event":"received","file_name":"photo.jpg","id":"7A1B2C3D-0000-4000-8000-000000000001","kind":"file","size":300000}"#,
        #"{"contact":"alice","contact_key":"\#(ContactIdentity.sample("alice").publicKey)","event":"duplicate","id":"7A1B2C3D-0000-4000-8000-000000000001"}"#,
    ]

    @Test func everyCaseHasASample() {
        for kind in PeerEventSamples.Kind.allCases {
            let samples = PeerEventSamples.samples(of: kind)
            #expect(!samples.isEmpty && samples.allSatisfy { PeerEventSamples.kind(of: $0) == kind }, "\(kind)")
        }
    }

    @Test func everyEventRoundTripsThroughItsLine() throws {
        var printed: [String] = []
        for event in PeerEventSamples.all {
            guard let record = PeerEventRecord(event) else {
                // Only `stopped` has no line of its own: `run` prints `stopped` with its reason.
                #expect(PeerEventSamples.kind(of: event) == .stopped && NodeEvent(event) == nil)
                continue
            }
            let line = try record.jsonLine()
            let expected = try #require(NodeEvent(event), "\(event)")
            let decoded = try NodeEvent(jsonLine: line)
            #expect(decoded == expected, "\(String(decoding: line, as: UTF8.self))")
            #expect(decoded.name == record.event)
            #expect(try decoded.jsonLine() == line, "re-encoded: \(String(decoding: line, as: UTF8.self))")
            printed.append(String(decoding: line, as: UTF8.self))
        }
        #expect(printed == Self.lines)
    }

    @Test func theRunsOwnRecordsRoundTrip() throws {
        let status = PeerStatus(location: PeerEventSamples.wifi, advertisingFor: ["bob"], peersSeen: [PeerEventSamples.bluetooth, PeerEventSamples.lora],
                                matchedContacts: [.init(name: "bob", state: .gaveUp, location: PeerEventSamples.bluetooth, binding: .bluetooth,
                                                        relayPort: 7000),
                                                  .init(name: "carol", state: .idle, location: nil, binding: nil, relayPort: nil)],
                                sessionsInFlight: 2, inboxCount: 3, outboxCount: 1, limitsTriggered: [.narrowed: 2, .announcementFlood: 1])
        var unstarted = status
        unstarted.location = nil
        for status in [status, unstarted] {
            let line = try PeerEventRecord(status).jsonLine()
            let decoded = try NodeEvent(jsonLine: line)
            #expect(decoded == .status(NodeEvent.Status(status)))
            guard case .status(let read) = decoded else { continue }
            #expect(read.matchedContacts == status.matchedContacts && read.location == status.location && read.inbox == 3)
            #expect(read.port.admission["refused"] == 0 && read.limitsTriggered[.narrowed] == 2)
            #expect(try decoded.jsonLine() == line)
        }
        let item = NodeEvent.Item(id: PeerEventSamples.id, kind: .file, size: 10, fileName: "a.txt")
        for event: NodeEvent in [.stopped(reason: "SIGTERM"), .expired(item), .expired(.init(id: PeerEventSamples.id, kind: .text, size: 3))] {
            #expect(try NodeEvent(jsonLine: event.jsonLine()) == event)
        }
        #expect(String(decoding: try NodeEvent.stopped(reason: "duration").jsonLine(), as: UTF8.self) == #"{"event":"stopped","reason":"duration"}"#)
        #expect(String(decoding: try NodeEvent.expired(item).jsonLine(), as: UTF8.self)
            == #"{"event":"expired","file_name":"a.txt","id":"7A1B2C3D-0000-4000-8000-000000000001","kind":"file","size":10}"#)
    }

    @Test func theTimeAndUnknownKeysAreNoPartOfTheEvent() throws {
        let line = #"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","event":"relay_closed","port":7000,"t":12.5,"summary":"words","added_later":[1,{"x":null}]}"#
        let record = try PeerEventRecord(jsonLine: Data(line.utf8))
        #expect(record.t == 12.5)
        #expect(try NodeEvent(record) == .relayClosed(contact: .sample("bob"), port: 7000))
        // Fields derived from others are written from the event, whatever the line said.
        let derived = #"{"binding":"bluetooth","event":"peer_appeared","location":"http://10.0.0.2:4000/NotificationBeacons"}"#
        #expect(try NodeEvent(jsonLine: Data(derived.utf8)) == .peerAppeared(location: PeerEventSamples.wifi))
    }

    @Test(arguments: [
        ("", NodeEventDecodingError.malformed("")),
        ("not json", .malformed("")),
        ("[1, 2]", .malformed("")),
        (#"{"contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)"}"#, .missingField(event: "?", field: "event")),
        (#"{"event":7}"#, .invalidValue(event: "?", field: "event", value: "")),
        (#"{"event":"teleported","contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)"}"#, .unknownEvent("teleported")),
        (#"{"event":"connected","contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","binding":"wifi"}"#, .missingField(event: "connected", field: "role")),
        (#"{"event":"connected","contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","binding":"wifi","role":"lurking"}"#, .invalidValue(event: "connected", field: "role", value: "lurking")),
        (#"{"event":"received","contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","id":"not-a-uuid","kind":"text","size":1}"#, .invalidValue(event: "received", field: "id", value: "not-a-uuid")),
        (#"{"event":"progress","contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","id":"7A1B2C3D-0000-4000-8000-000000000001","bytes":1}"#, .missingField(event: "progress", field: "total")),
        (#"{"event":"progress","contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","id":"7A1B2C3D-0000-4000-8000-000000000001","bytes":-1,"total":2}"#, .malformed("")),
        (#"{"event":"deferred","contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","id":"7A1B2C3D-0000-4000-8000-000000000001","kind":"file","size":1,"refusal":"no_space","retry_in_ms":-5}"#,
         .invalidValue(event: "deferred", field: "retry_in_ms", value: "-5")),
        (#"{"event":"refused","contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","id":"7A1B2C3D-0000-4000-8000-000000000001","kind":"file","size":1,"refusal":"too_big"}"#,
         .invalidValue(event: "refused", field: "refusal", value: "too_big")),
        (#"{"event":"started","location":"nowhere"}"#, .invalidValue(event: "started", field: "location", value: "nowhere")),
        (#"{"event":"limit_triggered","kind":"meteor","effect":"port-closed","period_s":1,"detail":"x"}"#, .invalidValue(event: "limit_triggered", field: "kind", value: "meteor")),
        (#"{"event":"stream_refused","contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","role":"accepting","reason":"odd: x","detail":"refused by this node"}"#,
         .invalidValue(event: "stream_refused", field: "reason", value: "odd: x")),
        (#"{"event":"stream_refused","contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","role":"accepting","reason":"code 0: x","detail":"refused by this node"}"#,
         .invalidValue(event: "stream_refused", field: "reason", value: "code 0: x")),
        (#"{"event":"stream_refused","contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","role":"accepting","reason":"code 9: x","detail":"refused by carol's node"}"#,
         .invalidValue(event: "stream_refused", field: "detail", value: "refused by carol's node")),
        (#"{"event":"disconnected","contact":"bob","contact_key":"\#(ContactIdentity.sample("bob").publicKey)","role":"accepting","binding":"wifi","clean":false}"#, .missingField(event: "disconnected", field: "reason")),
        (#"{"event":"status","location":""}"#, .missingField(event: "status", field: "peers_seen")),
    ])
    func aLineThatIsNoEventIsATypedError(line: String, expected: NodeEventDecodingError) {
        do {
            let event = try NodeEvent(jsonLine: Data(line.utf8))
            Issue.record("\(line) decoded as \(event)")
        } catch {
            // The JSON decoder's own words are not part of the contract: only the case and the field.
            switch (error, expected) {
            case (.malformed, .malformed): break
            case (.invalidValue(let event, let field, _), .invalidValue("?", let expectedField, "")):
                #expect(event == "?" && field == expectedField, "\(line): \(error)")
            default: #expect(error == expected, "\(line)")
            }
            #expect(!error.description.isEmpty)
        }
    }
}
