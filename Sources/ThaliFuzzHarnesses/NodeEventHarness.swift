import Foundation
import ThaliNodeCore

/// One line of `thali-node run --json` or `thali-node events` as the demo and the tests read it back
/// (``NodeEvent/init(jsonLine:)``): another process's standard output, any bytes at all.
///
/// Invariants: a line that is no event is a typed error (the decoder's throws are typed: it cannot throw
/// another), never a crash; an event that decodes keeps its name, and its own line decodes to the same
/// event and is then written again byte for byte.
enum NodeEventHarness {
    static let name = "node-events"

    static let harness = FuzzHarness(name: name, summary: "the node's event lines read back as typed events", seeds: seeds) {
        (input: inout FuzzInput) throws(FuzzInvariantViolation) in
        let bytes = input.rest()
        let record: PeerEventRecord
        let event: NodeEvent
        do throws(NodeEventDecodingError) {
            record = try PeerEventRecord(jsonLine: bytes)
            event = try NodeEvent(record)
        } catch {
            try check(!error.description.isEmpty, name, "an error without words")
            return
        }
        try check(event.name == record.event, name, "\(record.event) decoded as \(event.name)")
        let line: Data
        do {
            line = try event.jsonLine()
        } catch {
            throw FuzzInvariantViolation(harness: name, detail: "\(event) cannot be written: \(error)")
        }
        guard let again = try? NodeEvent(jsonLine: line) else {
            throw FuzzInvariantViolation(harness: name, detail: "its own line does not decode: \(String(decoding: line, as: UTF8.self))")
        }
        try check(again == event, name, "\(event) came back as \(again)")
        try check((try? again.jsonLine()) == line, name, "written differently the second time: \(String(decoding: line, as: UTF8.self))")
    }

    /// Lines as `run --json` prints them: a few of each family, with `t`.
    static func seeds() -> [[UInt8]] {
        [
            #"{"event":"started","location":"http://10.0.0.2:4000/NotificationBeacons","t":0.012}"#,
            #"{"binding":"bluetooth","event":"peer_left","location":"bluetooth:00:AA:01:00:00:01","reason":"narrowed","t":3.5}"#,
            #"{"binding":"wifi","clean":false,"contact":"bob","event":"disconnected","reason":"connection to 10.0.0.2:4000 reset by the other side","remote":"10.0.0.2:4000","role":"connecting","t":9}"#,
            #"{"contact":"bob","event":"connection_failed","reason":"connection refused by 10.0.0.2:4000","retry_in_ms":1500,"t":1.25}"#,
            #"{"detail":"1001 connections within 5 s","effect":"port-closed","event":"limit_triggered","kind":"httpOverload","period_s":30.25,"t":4}"#,
            #"{"contact":"bob","detail":"refused by bob's node","event":"stream_refused","reason":"code 9: late","role":"connecting","t":2}"#,
            #"{"contact":"bob","event":"deferred","file_name":"big \"iso\".iso","id":"7A1B2C3D-0000-4000-8000-000000000001","kind":"file","reason":"not enough space","refusal":"no_space","retry_in_ms":300000,"size":52428800,"t":7.75}"#,
            #"{"contact":"alice","event":"received","id":"7A1B2C3D-0000-4000-8000-000000000001","kind":"text","size":12,"t":8,"text":"hello\u0085 bob \u202E"}"#,
            #"{"contact":"bob","event":"relay_app_unreachable","reason":"closed by bob's node before any reply","role":"connecting","t":5}"#,
            #"{"advertising_for":["bob"],"discovery":{"beacon_fetch_failures":1,"beacon_fetches":4,"failures_by_kind":{"timeout":1},"ssdp":{"announcement_pauses":0,"narrowing_episodes":0,"sources_ignored":0,"starved_failure_streaks":0,"worst_loop_lag_ms":3}},"event":"status","inbox":0,"limits_triggered":{"narrowed":2},"location":"http://10.0.0.2:4000/NotificationBeacons","matched_contacts":[{"binding":"bluetooth","location":"bluetooth:00:AA:01:00:00:01","name":"bob","relay_port":7000,"state":"gave-up"}],"outbox":1,"peers_seen":["bluetooth:00:AA:01:00:00:01"],"port_counts":{"admission":{"admitted":0,"refused":0},"beacon_requests":0,"timed_out":0,"tls_connections":0},"relay_connections":0,"sessions_in_flight":0,"t":10}"#,
            #"{"event":"expired","file_name":"a.txt","id":"7A1B2C3D-0000-4000-8000-000000000001","kind":"file","size":10,"t":11}"#,
            #"{"event":"stopped","reason":"SIGTERM","t":12.001}"#,
        ].map { Array($0.utf8) }
    }
}
