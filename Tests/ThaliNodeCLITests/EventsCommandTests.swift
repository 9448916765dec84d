import Foundation
import Testing
import ThaliNodeTestSupport
import ThaliTestSupport
@testable import ThaliNodeCore

/// `thali-node events`: another process follows a running node's events, as the conformance adapter does.
@Suite("thali-node events", .serialized)
struct EventsCommandTests {
    @Test("events prints a running node's events as JSON lines while run prints readable lines, and ends when the run stops")
    func followsARunningNode() async throws {
        let people = try TestPeople(["alice", "bob"], label: "events")
        let (alice, bob) = (try people["alice"], try people["bob"])
        let text = try alice.store.enqueueText("hello bob", to: "bob", expiresAt: Date().addingTimeInterval(600))
        let port = randomSSDPPort()
        // Readable lines on run's own output: the feed is JSON whatever run prints.
        let alicePeer = try RunningPeer("alice", thaliNodeExecutable, [
            "run", "--home", alice.home.path, "--address", "127.0.0.1", "--ssdp-port", String(port), "--max-age", "5",
            "--status-interval", "0.5",
        ])
        let socketPath = alice.home.eventsSocketPath
        try await waitUntil("alice's events.sock") { alicePeer.output.contains("listening at") && FileManager.default.fileExists(atPath: socketPath) }
        let mode = try #require(try FileManager.default.attributesOfItem(atPath: socketPath)[.posixPermissions] as? Int)
        #expect(mode & 0o077 == 0, "events.sock mode \(String(mode, radix: 8))")

        let follower = try RunningPeer("events", thaliNodeExecutable, ["events", "--home", alice.home.path])
        try await follower.waitForLine("a status") { $0.event.statusSnapshot != nil && $0.t != nil }
        let bobPeer = try RunningPeer("bob", thaliNodeExecutable, [
            "run", "--home", bob.home.path, "--address", "127.0.0.1", "--ssdp-port", String(port), "--max-age", "5", "--json",
        ])
        try await follower.waitFor("the delivery", timeout: .seconds(30)) { $0.deliveredID == text.id }
        try await follower.waitFor("connected") { if case .connected("bob", _, _, _) = $0 { true } else { false } }
        #expect(bobPeer.kill(signal: SIGTERM) == 0)
        // Bob's stop ends the session with close_notify: a clean end.
        // (Its `clean` is there: a `disconnected` line without it does not decode.)
        try await follower.waitFor("the session's end") { if case .disconnected("bob", _, _, _, _) = $0 { true } else { false } }

        #expect(alicePeer.kill(signal: SIGTERM) == 0)
        try await follower.waitFor("stopped") { $0.stopReason == "SIGTERM" }
        try await waitUntil("events to exit with the run") { follower.hasExited }
        #expect(follower.kill() == 0)
        #expect(!FileManager.default.fileExists(atPath: socketPath), "the run removes events.sock as it stops")
        // Readable lines on run's own output, JSON on the feed.
        #expect(!alicePeer.output.contains("\"event\""))
    }

    @Test("events on a data directory no node runs on says so")
    func noRunningNode() async throws {
        let people = try TestPeople(["carol"], label: "events-none")
        let result = try await Task.detached {
            try ChildProcess.run(thaliNodeExecutable, ["events", "--home", try people["carol"].home.path], timeout: .seconds(20))
        }.value
        #expect(result.status != 0)
        #expect(result.output.contains("no node is running on"), "\(result.output)")
    }

    private func waitUntil(_ what: String, timeout: Duration = .seconds(20), _ condition: () throws -> Bool) async throws {
        if try await ThaliTestSupport.waitUntil(timeout: timeout, every: .milliseconds(50), condition) { return }
        Issue.record("\(what) did not happen within \(timeout)")
        throw CancellationError()
    }
}
