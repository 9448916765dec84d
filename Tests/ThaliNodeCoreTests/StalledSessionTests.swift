import Foundation
import Testing
import ThaliTestSupport
@testable import ThaliNodeCore

/// A session that authenticated and then stalls (the contact's node hangs mid-transfer): the node notices
/// it by itself, says so, and retries, so the item still arrives once the contact answers again.
@Suite("A stalled session", .serialized)
struct StalledSessionTests {
    func run(_ person: TestPeople.Person, port ssdpPort: Int, _ extra: [String] = []) throws -> RunningPeer {
        try RunningPeer(person.name, thaliNodeExecutable, [
            "run", "--home", person.home.path, "--address", "127.0.0.1", "--ssdp-port", String(ssdpPort), "--json",
            "--max-age", "5",
        ] + extra)
    }

    @Test("a contact's node that hangs after authenticating is reported as silent within the idle timeout and retried; the file arrives once it runs again")
    func hungSenderIsNoticedAndRetried() async throws {
        let people = try TestPeople(["alice", "bob"], label: "stall")
        let (alice, bob) = (try people["alice"], try people["bob"])
        // Alice gives a silent delivery stream 2 s (60 s by default).
        try Data(#"{"idleTimeoutSeconds": 2}"#.utf8).write(to: URL(fileURLWithPath: alice.home.configurationPath))
        let path = bob.home.path + "/big.bin"
        let content = Data(randomBytes(3 << 20))
        try content.write(to: URL(fileURLWithPath: path))
        let file = try bob.store.enqueueFile(at: path, to: "alice", expiresAt: Date().addingTimeInterval(600))

        let port = randomSSDPPort()
        // Bob sends at 256 KiB/s: the transfer is under way for seconds, long enough to freeze him in it.
        let alicePeer = try run(alice, port: port), bobPeer = try run(bob, port: port, ["--throttle", "262144"])
        defer {
            kill(bobPeer.pid, SIGCONT)
            alicePeer.kill()
            bobPeer.kill()
        }
        try await alicePeer.waitFor("the file's first bytes") { isEvent($0, "progress", ["id": file.id.uuidString]) }
        kill(bobPeer.pid, SIGSTOP)
        let stalled = try await alicePeer.waitFor("the stall reported", timeout: .seconds(20)) {
            isEvent($0, "connection_failed", ["contact": "bob"]) && ($0["reason"] as? String)?.contains("went silent") == true
        }
        #expect((stalled["reason"] as? String)?.contains("nothing sent or received for 2000 ms") == true, "\(stalled)")
        #expect(!alicePeer.events.contains { isEvent($0, "received", ["id": file.id.uuidString]) })
        kill(bobPeer.pid, SIGCONT)

        try await alicePeer.waitFor("the file after the retry", timeout: .seconds(60)) {
            isEvent($0, "received", ["id": file.id.uuidString])
        }
        try await bobPeer.waitFor("the file acknowledged", timeout: .seconds(30)) {
            isEvent($0, "delivered", ["id": file.id.uuidString])
        }
        let received = try #require(try alice.store.inbox().first { $0.itemID == file.id })
        #expect(try Data(contentsOf: URL(fileURLWithPath: try #require(received.filePath))) == content)
        #expect(try people.inbox(of: "alice").map(\.id) == [file.id])
    }
}
