import Foundation
import NIOConcurrencyHelpers
import Testing
// The helpers these tests share with the library's (TemporaryHome, TestPeople, BlueZMock, ...) live in
// ThaliNodeTestSupport and ThaliBluetoothTestSupport; re-exported here so that every file of this target sees them.
@_exported import ThaliNodeTestSupport
@_exported import ThaliBluetoothTestSupport
@testable import ThaliNodeCore

/// The `thali-node` built beside this test bundle.
var thaliNodeExecutable: String { CommandLineTests.executable }

/// Runs the built `thali-node` executable as a separate process, the way a user does.
@Suite("thali-node command line")
struct CommandLineTests {
    /// The `thali-node` built beside this test bundle.
    static var executable: String { PackagePaths.thaliNode() ?? PackagePaths.root() + "/.build/debug/thali-node" }

    struct Run {
        let status: Int32
        let output: String
    }

    func thaliNode(_ arguments: [String], environment: [String: String] = [:]) async throws -> Run {
        let executable = Self.executable
        let result = try await Task.detached { try ChildProcess.run(executable, arguments, environment: environment) }.value
        return Run(status: result.status, output: result.output)
    }

    @Test("contacts, send, outbox and inbox work on a fresh data directory given by --home")
    func happyPath() async throws {
        let temporary = TemporaryHome("cli")
        let home = ["--home", temporary.home.path]
        let created = try await thaliNode(["identity", "create", "--json"] + home)
        #expect(created.status == 0, "\(created.output)")
        let identity = try NodeIdentity.load(from: temporary.home)
        #expect(created.output.contains(identity.publicKey.hexString(compressed: true)))
        let shown = try await thaliNode(["identity", "show"] + home)
        #expect(shown.output.contains("public key: \(identity.publicKey.hexString(compressed: true))"), "\(shown.output)")
        let again = try await thaliNode(["identity", "create"] + home)
        #expect(again.status != 0)
        #expect(again.output.contains("an identity exists already"), "\(again.output)")
        let ownKey = try await thaliNode(["contacts", "add", "me", identity.publicKey.hexString(compressed: false)] + home)
        #expect(ownKey.status != 0)
        #expect(ownKey.output.contains("own key"), "\(ownKey.output)")

        let key = randomPublicKey()
        let added = try await thaliNode(["contacts", "add", "bob", key] + home)
        #expect(added.status == 0, "\(added.output)")
        let list = try await thaliNode(["contacts", "list", "--json"] + home)
        #expect(list.output.contains("\"name\" : \"bob\""))
        #expect(list.output.contains(key))

        let sent = try await thaliNode(["send", "bob", "hello from the CLI", "--expires-in", "2h", "--json"] + home)
        #expect(sent.status == 0, "\(sent.output)")
        let file = temporary.home.path + "/notes.txt"
        try Data("some notes".utf8).write(to: URL(fileURLWithPath: file))
        let sentFile = try await thaliNode(["send", "bob", "--file", file] + home)
        #expect(sentFile.status == 0, "\(sentFile.output)")

        let store = try NodeStore(home: temporary.home)
        let outbox = try store.outbox()
        #expect(outbox.map(\.kind) == [.text, .file] || outbox.map(\.kind) == [.file, .text])
        let text = try #require(outbox.first { $0.kind == .text })
        #expect(text.text == "hello from the CLI")
        #expect(abs(text.expiresAt.timeIntervalSince(text.createdAt) - 7_200) < 0.001)
        #expect(sent.output.contains(text.id.uuidString))

        let outboxJSON = try await thaliNode(["outbox", "--json"] + home)
        #expect(outboxJSON.output.contains("notes.txt"))
        let inbox = try await thaliNode(["inbox", "--json"] + home)
        #expect(inbox.status == 0)
        #expect(inbox.output.trimmingCharacters(in: .whitespacesAndNewlines) == "[\n\n]"
                || inbox.output.trimmingCharacters(in: .whitespacesAndNewlines) == "[]")

        let removed = try await thaliNode(["contacts", "remove", "bob", "--force"] + home)
        #expect(removed.status == 0)
        #expect(try store.outbox().isEmpty)
    }

    @Test("send nudges the node running on the data directory through its events socket, and no one when none runs")
    func sendNudgesTheRunningNode() async throws {
        let temporary = TemporaryHome("cli-nudge")
        let home = ["--home", temporary.home.path]
        #expect(try await thaliNode(["identity", "create"] + home).status == 0)
        #expect(try await thaliNode(["contacts", "add", "bob", randomPublicKey()] + home).status == 0)
        // The test plays the running node: its events socket, and later its run lock.
        let nudges = NIOLockedValueBox(0)
        let feed = try await NodeEventFeed.start(at: temporary.home.eventsSocketPath, nudged: { nudges.withLockedValue { $0 += 1 } })
        let unlocked = try await thaliNode(["send", "bob", "while no node holds the lock"] + home)
        #expect(unlocked.status == 0, "\(unlocked.output)")
        let lock = try RunLock(home: temporary.home)
        let locked = try await thaliNode(["send", "bob", "while a node runs"] + home)
        #expect(locked.status == 0, "\(locked.output)")
        #expect(try await waitUntil(timeout: .seconds(10), every: .milliseconds(20)) { nudges.withLockedValue { $0 } >= 1 })
        // The send without a running node (no lock) left the socket alone: only the second one nudged.
        #expect(nudges.withLockedValue { $0 } == 1)
        await feed.close()
        withExtendedLifetime(lock) {}
    }

    @Test("THALI_HOME selects the data directory when --home is absent")
    func thaliHomeEnvironment() async throws {
        let temporary = TemporaryHome("cli-env")
        let run = try await thaliNode(["contacts", "add", "carol", randomPublicKey()],
                                      environment: ["THALI_HOME": temporary.home.path])
        #expect(run.status == 0, "\(run.output)")
        #expect(try NodeStore(home: temporary.home).contacts().map(\.name) == ["carol"])
    }

    @Test("a missing identity is a clear error for identity show and for send")
    func missingIdentity() async throws {
        let temporary = TemporaryHome("cli-noid")
        let home = ["--home", temporary.home.path]
        let show = try await thaliNode(["identity", "show"] + home)
        #expect(show.status != 0)
        #expect(show.output.contains("no identity at \(temporary.home.identityPath)"), "\(show.output)")
        #expect(show.output.contains("thali-node identity create"))
        _ = try await thaliNode(["contacts", "add", "bob", randomPublicKey()] + home)
        let send = try await thaliNode(["send", "bob", "hi"] + home)
        #expect(send.status != 0)
        #expect(send.output.contains("no identity at \(temporary.home.identityPath)"), "\(send.output)")
        #expect(try NodeStore(home: temporary.home).outbox().isEmpty)
    }

    @Test("sending to an unknown contact fails with a clear message and queues nothing")
    func unknownContact() async throws {
        let temporary = TemporaryHome("cli-unknown")
        _ = try NodeIdentity.create(in: temporary.home)
        let run = try await thaliNode(["send", "nobody", "hi", "--home", temporary.home.path])
        #expect(run.status != 0)
        #expect(run.output.contains("unknown contact \"nobody\""), "\(run.output)")
        #expect(try NodeStore(home: temporary.home).outbox().isEmpty)
    }

    @Test("an invalid configuration fails every command with the file and the key")
    func invalidConfiguration() async throws {
        let temporary = TemporaryHome("cli-config")
        try temporary.home.create()
        try Data(#"{"logLevel": "loud"}"#.utf8).write(to: URL(fileURLWithPath: temporary.home.configurationPath))
        let run = try await thaliNode(["contacts", "list", "--home", temporary.home.path])
        #expect(run.status != 0)
        #expect(run.output.contains(temporary.home.configurationPath), "\(run.output)")
        #expect(run.output.contains("\"logLevel\""), "\(run.output)")
    }

    @Test("an unreadable configuration fails with its path")
    func unreadableConfiguration() async throws {
        let temporary = TemporaryHome("cli-unreadable")
        try temporary.home.create()
        try FileManager.default.createDirectory(atPath: temporary.home.configurationPath, withIntermediateDirectories: true)
        let run = try await thaliNode(["inbox", "--home", temporary.home.path])
        #expect(run.status != 0)
        #expect(run.output.contains("cannot read configuration \(temporary.home.configurationPath)"), "\(run.output)")
    }

    @Test("bad arguments: an invalid key, both a text and a file, a bad duration, an unreadable file")
    func badArguments() async throws {
        let temporary = TemporaryHome("cli-args")
        let home = ["--home", temporary.home.path]
        _ = try NodeIdentity.create(in: temporary.home)
        let badKey = try await thaliNode(["contacts", "add", "bob", "not-a-key"] + home)
        #expect(badKey.status != 0)
        #expect(badKey.output.contains("invalid public key"), "\(badKey.output)")
        _ = try await thaliNode(["contacts", "add", "bob", randomPublicKey()] + home)
        let both = try await thaliNode(["send", "bob", "text", "--file", "/etc/hostname"] + home)
        #expect(both.status != 0)
        #expect(both.output.contains("either a TEXT or --file"), "\(both.output)")
        let duration = try await thaliNode(["send", "bob", "text", "--expires-in", "soon"] + home)
        #expect(duration.status != 0)
        let missing = try await thaliNode(["send", "bob", "--file", temporary.home.path + "/nope"] + home)
        #expect(missing.status != 0)
        #expect(missing.output.contains("no such file"), "\(missing.output)")
    }

    @Test("config init writes every key; config show reads it back")
    func configInitAndShow() async throws {
        let temporary = TemporaryHome("cli-cfg")
        let home = ["--home", temporary.home.path]
        let written = try await thaliNode(["config", "init"] + home)
        #expect(written.status == 0, "\(written.output)")
        #expect(try NodeConfiguration.load(home: temporary.home) == NodeConfiguration())
        let shown = try await thaliNode(["config", "show"] + home)
        for key in NodeConfiguration.keys { #expect(shown.output.contains("\"\(key)\""), "\(key)") }
        let again = try await thaliNode(["config", "init"] + home)
        #expect(again.status != 0)
    }
}
