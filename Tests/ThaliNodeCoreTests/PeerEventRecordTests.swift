import Foundation
import Testing
@testable import ThaliNodeCore

/// The `--json` schema: snake_case keys, absent fields left out, the binding named from the location.
@Suite struct PeerEventRecordTests {
    static func object(_ record: PeerEventRecord?) throws -> [String: Any] {
        let data = try #require(record).jsonLine()
        return try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
    }

    @Test func eventsCarryTheirFieldsAndNothingElse() throws {
        let failed = try Self.object(PeerEventRecord(.connectionFailed(contact: "bob", reason: "refused", retryIn: .milliseconds(1500))))
        #expect(failed as NSDictionary == ["event": "connection_failed", "contact": "bob", "reason": "refused", "retry_in_ms": 1500] as NSDictionary)
        let givingUp = try Self.object(PeerEventRecord(.connectionFailed(contact: "bob", reason: "refused", retryIn: nil)))
        #expect(givingUp["retry_in_ms"] == nil)
        let connecting = try Self.object(PeerEventRecord(.connecting(contact: "bob", location: "bluetooth:00:AA:01:00:00:01", attempt: 2)))
        #expect(connecting["binding"] as? String == "bluetooth")
        #expect(connecting["attempt"] as? Int == 2)
        let matched = try Self.object(PeerEventRecord(.beaconMatched(contact: "bob", location: "http://10.0.0.2:4000/NotificationBeacons")))
        #expect(matched["binding"] as? String == "wifi")
        let appeared = try Self.object(PeerEventRecord(.peerAppeared(location: "bluetooth:00:AA:01:00:00:01")))
        #expect(appeared["binding"] as? String == "bluetooth")
        let connected = try Self.object(PeerEventRecord(.connected(contact: "bob", role: .accepting, binding: .bluetooth)))
        #expect(connected as NSDictionary == ["event": "connected", "contact": "bob", "role": "accepting", "binding": "bluetooth"] as NSDictionary)
        let ended = try Self.object(PeerEventRecord(.disconnected(contact: "bob", role: .connecting, binding: .wifi, reason: "closed")))
        #expect(ended["binding"] as? String == "wifi" && ended["reason"] as? String == "closed")
        // Slashes stay readable.
        #expect(String(decoding: try #require(PeerEventRecord(.started(location: "http://a/b"))).jsonLine(), as: UTF8.self)
            .contains("http://a/b"))
        #expect(PeerEventRecord(.stopped) == nil)
    }

    @Test func deliveryAndStatusRecords() throws {
        let id = UUID()
        let progress = try Self.object(PeerEventRecord(.delivery(contact: "bob", .progress(id: id, bytes: 10, total: 20))))
        #expect(progress as NSDictionary == ["event": "progress", "contact": "bob", "id": id.uuidString, "bytes": 10, "total": 20] as NSDictionary)
        let status = PeerStatus(location: "bluetooth:00:AA:01:00:00:01", advertisingFor: ["bob"], peersSeen: [],
                                matchedContacts: [.init(name: "bob", state: "backoff", location: nil, binding: .wifi, relayPort: 7000)],
                                sessionsInFlight: 1, inboxCount: 2, outboxCount: 3)
        let object = try Self.object(PeerEventRecord(status))
        #expect(object["event"] as? String == "status")
        #expect(object["sessions_in_flight"] as? Int == 1)
        let contacts = try #require(object["matched_contacts"] as? [[String: Any]])
        #expect(contacts.first as NSDictionary? == ["name": "bob", "state": "backoff", "binding": "wifi", "relay_port": 7000] as NSDictionary)
        #expect(PeerEventRecord(status).summary.contains("bob backoff (relay port 7000)"))
    }
}
