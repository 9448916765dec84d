import Foundation
import Testing
@testable import ThaliNodeCore

/// The records of relay events and the status counts issue 25 asked for: relay listener lifecycle,
/// a dead app port, relayed connections and the single port's admission counts, in words and in JSON.
@Suite("Relay and status records")
struct RelayStatusRecordTests {
    private func line(_ record: PeerEventRecord?) throws -> String {
        String(decoding: try #require(record).jsonLine(), as: UTF8.self)
    }

    @Test func relayListenerLifecycleRecords() throws {
        #expect(try line(PeerEventRecord(.relayReopened(contact: "alice", port: 6984)))
            == #"{"contact":"alice","event":"relay_reopened","port":6984}"#)
        #expect(try line(PeerEventRecord(.relayClosed(contact: "alice", port: 6984)))
            == #"{"contact":"alice","event":"relay_closed","port":6984}"#)
        let kept = PeerEventRecord(.relayPortUnavailable(contact: "alice", port: 6984,
                                                        reason: "port 6984 on 127.0.0.1 is in use by another process", instead: 41000))
        #expect(try line(kept) == #"{"contact":"alice","event":"relay_port_unavailable","instead":41000,"port":6984,"#
            + #""reason":"port 6984 on 127.0.0.1 is in use by another process"}"#)
        #expect(kept?.summary == "relay: port 6984 for alice cannot be opened (port 6984 on 127.0.0.1 is in use by another process); "
            + "connections to 127.0.0.1:41000 reach alice's app instead")
        let pinned = PeerEventRecord(.relayPortUnavailable(contact: "alice", port: 6984, reason: "in use", instead: nil))
        #expect(pinned?.summary.hasSuffix("the session is closed and the node tries again") == true)
    }

    @Test func deadAppPortRecords() throws {
        let timedOut = PeerConnectionError(.timedOut, address: "127.0.0.1:40000")
        let record = try #require(PeerEventRecord(.relayAppUnreachable(contact: "bob", role: .accepting, error: timedOut)))
        #expect(record.summary == "relay: app port 127.0.0.1:40000 could not be reached (no connection to 127.0.0.1:40000 within "
            + "the connect timeout); the relayed connection from bob was closed")
        #expect(try line(PeerEventRecord(.relayAppUnreachable(contact: "alice", role: .connecting, error: nil)))
            == #"{"contact":"alice","event":"relay_app_unreachable","reason":"closed by alice's node before any reply","role":"connecting"}"#)
    }

    @Test func statusCountsRelayedConnectionsAndAdmissions() throws {
        var status = PeerStatus(location: nil, advertisingFor: [], peersSeen: [], matchedContacts: [],
                                sessionsInFlight: 2, relayConnections: 3, inboxCount: 0, outboxCount: 0)
        status.port.admission.admitted = 7
        status.port.admission.authenticated = 4
        status.port.admission.refusedSourceRate = 2
        status.port.admission.refusedOverload = 1
        status.port.tlsConnections = 5
        let record = PeerEventRecord(status)
        #expect(record.summary.contains("2 session(s) in flight, 3 relayed connection(s)"))
        #expect(record.summary.contains("port: 7 admitted, 4 authenticated, 3 refused (source rate 2, overload 1)"))
        let object = try #require(try JSONSerialization.jsonObject(with: record.jsonLine()) as? [String: Any])
        #expect(object["relay_connections"] as? Int == 3)
        let counts = try #require(object["port_counts"] as? [String: Any])
        #expect(counts["tls_connections"] as? Int == 5)
        let admission = try #require(counts["admission"] as? [String: Any])
        #expect(admission["admitted"] as? Int == 7 && admission["refused"] as? Int == 3
                && admission["refused_source_rate"] as? Int == 2 && admission["refused_overload"] as? Int == 1)
    }
}
