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
        #expect(try line(PeerEventRecord(.relayReopened(contact: .sample("alice"), port: 6984)))
            == #"{"contact":"alice","contact_key":"\#(ContactIdentity.sample("alice").publicKey)","event":"relay_reopened","port":6984}"#)
        #expect(try line(PeerEventRecord(.relayClosed(contact: .sample("alice"), port: 6984)))
            == #"{"contact":"alice","contact_key":"\#(ContactIdentity.sample("alice").publicKey)","event":"relay_closed","port":6984}"#)
        let kept = PeerEventRecord(.relayPortUnavailable(contact: .sample("alice"), port: 6984,
                                                        reason: "port 6984 on 127.0.0.1 is in use by another process", instead: 41000))
        #expect(try line(kept) == #"{"contact":"alice","contact_key":"\#(ContactIdentity.sample("alice").publicKey)","event":"relay_port_unavailable","instead":41000,"port":6984,"#
            + #""reason":"port 6984 on 127.0.0.1 is in use by another process"}"#)
        #expect(kept?.summary == "relay: port 6984 for alice cannot be opened (port 6984 on 127.0.0.1 is in use by another process); "
            + "connections to 127.0.0.1:41000 reach alice's app instead")
        let pinned = PeerEventRecord(.relayPortUnavailable(contact: .sample("alice"), port: 6984, reason: "in use", instead: nil))
        #expect(pinned?.summary.hasSuffix("the session is closed and the node tries again") == true)
    }

    @Test func deadAppPortRecords() throws {
        let timedOut = PeerConnectionError(.timedOut, address: "127.0.0.1:40000")
        let record = try #require(PeerEventRecord(.relayAppUnreachable(contact: .sample("bob"), role: .accepting, error: timedOut)))
        #expect(record.summary == "relay: app port 127.0.0.1:40000 could not be reached (no connection to 127.0.0.1:40000 within "
            + "the connect timeout); the relayed connection from bob was closed")
        #expect(try line(PeerEventRecord(.relayAppUnreachable(contact: .sample("alice"), role: .connecting, error: nil)))
            == #"{"contact":"alice","contact_key":"\#(ContactIdentity.sample("alice").publicKey)","event":"relay_app_unreachable","reason":"closed by alice's node before any reply","role":"connecting"}"#)
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
        guard case .status(let line) = try NodeEvent(jsonLine: record.jsonLine()) else {
            Issue.record("the status line is no status")
            return
        }
        #expect(line.relayConnections == 3)
        #expect(line.port.tlsConnections == 5)
        let admission = line.port.admission
        #expect(admission["admitted"] == 7 && admission["refused"] == 3 && admission["refused_source_rate"] == 2 && admission["refused_overload"] == 1)
    }

    /// Discovery's counts reach the status line: beacons read and failed, and over Wi-Fi how late SSDP
    /// discovery's own loop has run (a starved peer in a crowd), which only the library's counters held.
    @Test func statusCarriesDiscoveryAndSSDPHealth() throws {
        var status = PeerStatus(location: nil, advertisingFor: [], peersSeen: [], matchedContacts: [],
                                sessionsInFlight: 0, inboxCount: 0, outboxCount: 0)
        status.discovery.beaconFetches = 40
        status.discovery.beaconFetchFailures = 3
        status.discovery.beaconFetchFailuresByKind = [.noConnection: 2, .responseTimedOut: 1]
        var health = PeerSSDPHealth()
        health.worstLoopLagMilliseconds = 420
        health.starvedFailureStreaks = 2
        health.sourcesIgnored = 1
        status.discovery.ssdp = health
        let record = PeerEventRecord(status)
        #expect(record.summary.hasSuffix("; beacons read 40, fetches failed 3, discovery's loop at most 420 ms late"))
        guard case .status(let line) = try NodeEvent(jsonLine: record.jsonLine()) else {
            Issue.record("the status line is no status")
            return
        }
        let discovery = line.discovery
        #expect(discovery.beaconFetches == 40 && discovery.beaconFetchFailures == 3)
        #expect(discovery.failuresByKind == ["no_connection": 2, "response_timed_out": 1])
        #expect(discovery.ssdp == ["worst_loop_lag_ms": 420, "announcement_pauses": 0, "starved_failure_streaks": 2,
                                   "narrowing_episodes": 0, "sources_ignored": 1])
        status.discovery.ssdp = nil  // no Wi-Fi binding: no SSDP figures, in words or in JSON
        #expect(!PeerEventRecord(status).summary.contains("loop"))
        let bluetoothOnly = try PeerEventRecord(status).jsonLine()
        #expect(!String(decoding: bluetoothOnly, as: UTF8.self).contains(#""ssdp""#))
        guard case .status(let withoutSSDP) = try NodeEvent(jsonLine: bluetoothOnly) else {
            Issue.record("the status line is no status")
            return
        }
        #expect(withoutSSDP.discovery.ssdp == nil)
    }
}
