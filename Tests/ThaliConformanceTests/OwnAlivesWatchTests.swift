import Foundation
import Testing
import ThaliMutants
import ThaliNodeTestSupport
import ThaliTestSupport

@testable import ThaliConformance

/// peer/ssdp/own-alives-dropped [SSDP-3.3] reads `peer_appeared` events, which an implementation reports
/// once, when a peer is new. These runs take the adapter's `events` verb late, or the implementation
/// announcing early, and check that the case never PASSes on reports it could not have seen.
@Suite("Conformance peer mode: own alives graded only while followed", .serialized,
       .enabled(if: TestEnvironment.available(PackagePaths.thaliNode() != nil)))
struct OwnAlivesWatchTests {
    /// How the adapter and the implementation are set up for one run.
    struct Setup: CustomTestStringConvertible, Sendable {
        let label: String
        /// `THALI_MUTANT` of the implementation, if any.
        let mutant: Mutant?
        /// Seconds the adapter's `events` verb sleeps before it follows.
        let eventsDelay: String
        /// Seconds each event line is held before the suite reads it (a buffering adapter); nil: none.
        var lineDelay: String? = nil
        /// Whether an item is queued for the suite (so the implementation announces) before the run.
        let queuedBefore: Bool
        /// The verdict expected, and a part of its text.
        let verdict: String, actual: String
        var testDescription: String { label }
    }

    static let setups = [
        // Every report reaches the suite 1.5 s late, after the probe that caused it gave up: an earlier
        // probe's late report counts (it was made before any send).
        Setup(label: "every event 1.5 s late", mutant: nil, eventsDelay: "0", lineDelay: "1.5",
              queuedBefore: false, verdict: "PASS", actual: "reported the suite's probe"),
        // Its one report of itself came before the events were followed: the case PASSed on main.
        Setup(label: "mutant heard itself, events followed 0.5 s late", mutant: .ssdpHearsItself, eventsDelay: "0.5",
              queuedBefore: false, verdict: "FAIL", actual: "for its own location"),
        Setup(label: "events followed only after the step timeout", mutant: nil, eventsDelay: "6",
              queuedBefore: false, verdict: "INCONCLUSIVE", actual: "reported the suite only after"),
        Setup(label: "announcing before the suite queued anything", mutant: nil, eventsDelay: "0",
              queuedBefore: true, verdict: "INCONCLUSIVE", actual: "before the suite queued anything"),
    ]

    @Test("the own-alives case grades only what the implementation's followed events could show", arguments: setups)
    func gradedOnlyWhileFollowed(_ setup: Setup) async throws {
        let node = try PeerModeTests.node()
        let prepared = try PeerModeTests.prepareImplementation()
        if setup.queuedBefore {
            _ = try ChildProcess.run(node, ["--home", prepared.iut, "send", "conformance", "queued before the run"], timeout: .seconds(20))
        }
        let implementation = try await prepared.start(environment: setup.mutant.map { [Mutant.environmentVariable: $0.rawValue] })
        defer { implementation.remove() }
        // An adapter whose `events` verb starts following late, as a slow shim or a slow runtime would,
        // or holds each line (each in its own subshell, so the delays do not add up).
        let shim = implementation.suite + "/late-events.sh"
        let follow = setup.lineDelay.map {
            "\(node) \"$@\" | while IFS= read -r line; do (sleep \($0); printf '%s\\n' \"$line\") & done; wait; exit"
        } ?? "exec \(node) \"$@\""
        try """
            #!/bin/sh
            if [ "$3" = events ]; then sleep \(setup.eventsDelay); \(follow); fi
            exec \(node) "$@"

            """.write(toFile: shim, atomically: true, encoding: .utf8)
        #expect(chmod(shim, 0o700) == 0)
        if setup.queuedBefore {
            // Its first alive has gone out.
            _ = try await implementation.peer.waitFor("advertising") {
                if case .advertising(let contacts) = $0 { return !contacts.isEmpty } else { return false }
            }
        }
        let jsonPath = implementation.suite + "/report.json"
        let run = try ChildProcess(node, ["conformance", "peer", "--peer-key", implementation.iutKey, "--identity", implementation.suite + "/identity.key",
                                          "--address", "127.0.0.1", "--ssdp-port", String(implementation.ssdpPort),
                                          "--step-timeout-s", "5", "--discovery-timeout-s", "5",
                                          "--adapter", "\(shim) --home \(implementation.iut)", "--json-out", jsonPath])
        _ = try await run.waitForExit(timeout: .seconds(120))
        let report = try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: jsonPath))) as? [String: Any]
        let results = try #require(report?["results"] as? [[String: Any]], "\(run.output)")
        let result = try #require(results.first { $0["id"] as? String == PeerConformance.Cases.ownAlivesDropped.id })
        #expect(result["verdict"] as? String == setup.verdict, "\(result)\n\(run.output)")
        #expect((result["actual"] as? String)?.contains(setup.actual) == true, "\(result)")
    }
}
