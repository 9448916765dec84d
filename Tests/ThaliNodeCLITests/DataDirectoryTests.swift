import Crypto
import Foundation
import Testing
import ThaliBeacons
import ThaliTestSupport
@testable import ThaliNodeCore

/// The data directory and the CLI as a new user meets them, round two (issue 26): a home that moves,
/// stays private, is locked by its `run`, and says so when it cannot be read; destructive commands that
/// ask first; peers' bytes that cannot drive the terminal. Each test runs the real binary.
@Suite("thali-node data directory", .serialized)
struct DataDirectoryTests {
    typealias Result = CommandLineUsabilityTests.Run

    /// Runs `thali-node` with `arguments`; `asNobody` runs it as user nobody (the tests run as root, who
    /// may read anything).
    func thaliNode(_ arguments: [String], asNobody: Bool = false) async throws -> Result {
        let executable = thaliNodeExecutable
        let (program, full) = asNobody
            ? ("setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", executable] + arguments)
            : (executable, arguments)
        let result = try await Task.detached { try ChildProcess.run(program, full, timeout: .seconds(20)) }.value
        return Result(status: result.status, output: result.output)
    }

    /// Expects a non-zero exit with one `error: ...` line containing `text`.
    func expectError(_ result: Result, containing text: String, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(result.status != 0, "\(result.output)", sourceLocation: sourceLocation)
        #expect(result.lines.count == 1 && result.output.hasPrefix("error: "), "\(result.output)", sourceLocation: sourceLocation)
        #expect(result.output.contains(text), "\(result.output)", sourceLocation: sourceLocation)
    }

    /// A data directory with an identity and a contact `bob`, made through the CLI.
    func node(_ label: String) async throws -> TemporaryHome {
        let temporary = TemporaryHome(label)
        let home = temporary.home.path
        let created = try await thaliNode(["identity", "create", "--home", home])
        #expect(created.status == 0, "\(created.output)")
        let added = try await thaliNode(["contacts", "add", "bob", randomPublicKey(), "--home", home])
        #expect(added.status == 0, "\(added.output)")
        return temporary
    }

    /// Puts a received item from `bob` into `home`'s inbox the way a delivery session commits one.
    @discardableResult
    func receive(_ content: Data, kind: ItemKind, name: String = "", into home: NodeHome) throws -> UUID {
        let store = try NodeStore(home: home)
        let contact = try store.contact(named: "bob")
        let offer = ItemOffer(id: UUID(), kind: kind, size: UInt64(content.count), sha256: Array(SHA256.hash(data: content)),
                              createdMilliseconds: UInt64(Date().millisecondsSinceEpoch),
                              expiresMilliseconds: UInt64(Date().millisecondsSinceEpoch + 600_000), name: name)
        try content.write(to: URL(fileURLWithPath: store.partialPath(for: offer.id, from: contact)))
        let result = try store.commitReceived(offer, from: contact)
        guard case .stored = result else {
            Issue.record("the item was not stored: \(result)")
            return offer.id
        }
        return offer.id
    }

    /// The JSON array a `--json` listing printed.
    func jsonArray(_ result: Result, sourceLocation: SourceLocation = #_sourceLocation) throws -> [[String: Any]] {
        let parsed = try JSONSerialization.jsonObject(with: Data(result.output.utf8)) as? [[String: Any]]
        return try #require(parsed, "\(result.output)", sourceLocation: sourceLocation)
    }

    /// The permission bits of `path`.
    func mode(_ path: String) -> Int {
        ((try? FileManager.default.attributesOfItem(atPath: path))?[.posixPermissions] as? Int) ?? -1
    }

    // MARK: 1. A movable home

    @Test("a moved data directory lists its received files where they are now; old absolute paths are migrated")
    func movedHome() async throws {
        let original = try await node("move")
        let moved = TemporaryHome("moved")
        let content = Data("received before the move".utf8)
        let received = try receive(content, kind: .file, name: "report.txt", into: original.home)
        let source = original.home.path + "-source.bin"
        try Data("queued before the move".utf8).write(to: URL(fileURLWithPath: source))
        defer { try? FileManager.default.removeItem(atPath: source) }
        #expect(try await thaliNode(["send", "bob", "--file", source, "--home", original.home.path]).status == 0)
        #expect(rename(original.home.path, moved.home.path) == 0)

        let inbox = try jsonArray(try await thaliNode(["inbox", "--json", "--home", moved.home.path]))
        let path = try #require(inbox.first { $0["id"] as? String == received.uuidString }?["file_path"] as? String)
        #expect(path == moved.home.path + "/inbox/\(received.uuidString)/report.txt")
        #expect(FileManager.default.contents(atPath: path) == content)
        let queued = try #require(try NodeStore(home: moved.home).outbox().first?.filePath)
        #expect(FileManager.default.contents(atPath: queued) == Data("queued before the move".utf8))

        // A database written by a version that stored absolute paths (under some old location).
        try NodeStore(home: moved.home).executeForTesting("""
            UPDATE outboxItem SET filePath = '/nowhere/old-home/' || filePath;
            UPDATE inboxItem SET filePath = '/nowhere/old-home/' || filePath;
            DELETE FROM grdb_migrations WHERE identifier = 'v2-relative-paths';
            """)
        let migrated = try jsonArray(try await thaliNode(["inbox", "--json", "--home", moved.home.path]))
        #expect(migrated.first?["file_path"] as? String == path)
        let store = try NodeStore(home: moved.home)
        #expect(try store.outbox().first?.filePath == queued)
        #expect(try store.appliedMigrations() == ["v1", "v2-relative-paths", "v3-offer-deferral"])
    }

    // MARK: 2. Destructive commands ask

    @Test("contacts remove keeps a contact with queued items unless --force, and then says what it deleted")
    func removeContactWithQueuedItems() async throws {
        let temporary = try await node("remove")
        let home = temporary.home.path
        #expect(try await thaliNode(["send", "bob", "a text", "--home", home]).status == 0)
        #expect(try await thaliNode(["send", "bob", "another", "--home", home]).status == 0)
        let refused = try await thaliNode(["contacts", "remove", "bob", "--home", home])
        expectError(refused, containing: "contact \"bob\" has 2 queued items (13 bytes) that removing it would delete; use --force")
        #expect(try NodeStore(home: temporary.home).outbox().count == 2)
        #expect(try NodeStore(home: temporary.home).contacts().map(\.name) == ["bob"])

        let forced = try await thaliNode(["contacts", "remove", "bob", "--force", "--home", home])
        #expect(forced.status == 0, "\(forced.output)")
        #expect(forced.output == "removed contact bob; deleted 2 queued items (13 bytes)\n", "\(forced.output)")
        #expect(try NodeStore(home: temporary.home).outbox().isEmpty)
        // Without queued items nothing needs forcing.
        #expect(try await thaliNode(["contacts", "add", "carol", randomPublicKey(), "--home", home]).status == 0)
        let plain = try await thaliNode(["contacts", "remove", "carol", "--json", "--home", home])
        #expect(plain.status == 0, "\(plain.output)")
        #expect(plain.output.contains("\"deleted_items\" : ["), "\(plain.output)")
    }

    /// Runs `thali-node arguments` on a terminal (script(1)) whose input is `answer` and a newline.
    func onTerminal(_ arguments: [String], answering answer: String) async throws -> (status: Int32, output: String) {
        let command = ([thaliNodeExecutable] + arguments).map { "'\($0)'" }.joined(separator: " ")
        return try await Task.detached {
            try ChildProcess.run("/bin/sh", ["-c", "printf '\(answer)\\n' | script -qec \"\(command)\" /dev/null"], timeout: .seconds(20))
        }.value
    }

    @Test("on a terminal, contacts remove asks before deleting queued items, and no keeps them")
    func removeContactAsks() async throws {
        let temporary = try await node("remove-ask")
        let home = temporary.home.path
        #expect(try await thaliNode(["send", "bob", "a text", "--home", home]).status == 0)
        let answering = { answer in try await self.onTerminal(["contacts", "remove", "bob", "--home", home], answering: answer) }
        let declined = try await answering("n")
        #expect(declined.status == 73, "\(declined.output)")  // EX_CANTCREAT: it holds data, --force removes it
        #expect(declined.output.contains("Remove bob and delete 1 queued item (6 bytes)? [y/N]"), "\(declined.output)")
        #expect(try NodeStore(home: temporary.home).outbox().count == 1)
        let accepted = try await answering("y")
        #expect(accepted.status == 0, "\(accepted.output)")
        #expect(accepted.output.contains("removed contact bob; deleted 1 queued item (6 bytes)"), "\(accepted.output)")
        #expect(try NodeStore(home: temporary.home).outbox().isEmpty)
    }

    @Test("identity create --force keeps the replaced key beside the new one")
    func identityReplacementKeepsOldKey() async throws {
        let temporary = try await node("identity")
        let old = try #require(FileManager.default.contents(atPath: temporary.home.identityPath))
        let replaced = try await thaliNode(["identity", "create", "--force", "--json", "--home", temporary.home.path])
        #expect(replaced.status == 0, "\(replaced.output)")
        let description = try #require(try JSONSerialization.jsonObject(with: Data(replaced.output.utf8)) as? [String: Any])
        let kept = try #require(description["old_key_file"] as? String, "\(replaced.output)")
        #expect(kept.hasPrefix(temporary.home.identityPath + ".replaced-"))
        #expect(FileManager.default.contents(atPath: kept) == old)
        #expect(mode(kept) == 0o600)
        #expect(FileManager.default.contents(atPath: temporary.home.identityPath) != old)

        // On a terminal, without --force, it asks (as ssh-keygen does); no changes nothing.
        let current = FileManager.default.contents(atPath: temporary.home.identityPath)
        let declined = try await onTerminal(["identity", "create", "--home", temporary.home.path], answering: "n")
        #expect(declined.status == 73 && declined.output.contains("exists. Replace it"), "\(declined.output)")
        #expect(FileManager.default.contents(atPath: temporary.home.identityPath) == current)
        let accepted = try await onTerminal(["identity", "create", "--home", temporary.home.path], answering: "y")
        #expect(accepted.status == 0 && accepted.output.contains("old key kept at"), "\(accepted.output)")
        #expect(FileManager.default.contents(atPath: temporary.home.identityPath) != current)
        // Both replaced keys are kept, also when replaced within the same second.
        let oldKeys = try FileManager.default.contentsOfDirectory(atPath: temporary.home.path).filter { $0.hasPrefix("identity.key.replaced-") }
        #expect(oldKeys.count == 2, "\(oldKeys)")
    }

    // MARK: 4. Private whatever the parent's mode

    @Test("an existing 0755 home is made 0700 with a notice; the database files are created 0600")
    func privateHome() async throws {
        let temporary = TemporaryHome("mode")
        try FileManager.default.createDirectory(atPath: temporary.home.path, withIntermediateDirectories: true,
                                                attributes: [.posixPermissions: 0o755])
        let added = try await thaliNode(["contacts", "add", "bob", randomPublicKey(), "--home", temporary.home.path])
        #expect(added.status == 0, "\(added.output)")
        #expect(added.output.contains("notice: \(temporary.home.path) was readable by others (mode 0755); made it 0700"),
                "\(added.output)")
        #expect(try await thaliNode(["identity", "create", "--home", temporary.home.path]).status == 0)
        #expect(mode(temporary.home.path) == 0o700)
        for suffix in ["", "-wal", "-shm"] where FileManager.default.fileExists(atPath: temporary.home.databasePath + suffix) {
            #expect(mode(temporary.home.databasePath + suffix) == 0o600, "node.sqlite\(suffix)")
        }
        #expect(mode(temporary.home.databasePath) == 0o600)
        for directory in [temporary.home.inboxDirectory, temporary.home.outboxDirectory, temporary.home.partialDirectory] {
            #expect(mode(directory) == 0o700, "\(directory)")
        }
        // The queued file's copy too, whatever the umask.
        let source = temporary.home.path + "-source.txt"
        try Data("x".utf8).write(to: URL(fileURLWithPath: source))
        defer { try? FileManager.default.removeItem(atPath: source) }
        #expect(try await thaliNode(["send", "bob", "--file", source, "--home", temporary.home.path]).status == 0)
        let copy = try #require(try NodeStore(home: temporary.home).outbox().first?.filePath)
        #expect(mode(copy) == 0o600)
    }

    // MARK: 5. Peers' bytes cannot drive the terminal

    @Test("inbox escapes control characters of received texts; --json keeps them")
    func receivedTextEscaped() async throws {
        let temporary = try await node("escape")
        let hostile = "clear\u{1B}[2J title\u{1B}]0;owned\u{07} \rFAKE LINE \u{202E}txt.exe"
        try receive(Data(hostile.utf8), kind: .text, into: temporary.home)
        let shown = try await thaliNode(["inbox", "--home", temporary.home.path])
        #expect(shown.status == 0, "\(shown.output)")
        for byte: UInt8 in [0x1B, 0x07, 0x0D] { #expect(!shown.output.utf8.contains(byte), "\(shown.output)") }
        #expect(!shown.output.contains("\u{202E}"))
        #expect(shown.output.contains(#"clear\u{1B}[2J title\u{1B}]0;owned\u{7} \rFAKE LINE \u{202E}txt.exe"#), "\(shown.output)")
        let json = try jsonArray(try await thaliNode(["inbox", "--json", "--home", temporary.home.path]))
        #expect(json.first?["text"] as? String == hostile)
    }

    // MARK: 6. A home that cannot be read is an error, never "empty"

    @Test("another user's 0700 home, a --home that is a file and an emptied database are errors, not empty")
    func unreadableHome() async throws {
        let temporary = try await node("unreadable")
        let home = temporary.home.path
        #expect(try await thaliNode(["send", "bob", "hello", "--home", home]).status == 0)
        for command in [["inbox"], ["outbox"], ["contacts", "list"], ["identity", "show"]] {
            let result = try await thaliNode(command + ["--home", home], asNobody: true)
            expectError(result, containing: "cannot use data directory \(home): permission denied (owner root, mode 0700)")
        }
        let file = home + "-file"
        try Data("not a directory".utf8).write(to: URL(fileURLWithPath: file))
        defer { try? FileManager.default.removeItem(atPath: file) }
        for command in [["inbox"], ["contacts", "list"], ["identity", "show"], ["contacts", "add", "x", randomPublicKey()]] {
            expectError(try await thaliNode(command + ["--home", file]), containing: "\(file): it is not a directory")
        }

        try receive(Data("a received file".utf8), kind: .file, name: "a.txt", into: temporary.home)
        for suffix in ["-wal", "-shm"] { try? FileManager.default.removeItem(atPath: temporary.home.databasePath + suffix) }
        #expect(truncate(temporary.home.databasePath, 0) == 0)
        expectError(try await thaliNode(["inbox", "--home", home]),
                    containing: "it is empty (0 bytes) but inbox/ and outbox/ hold 1 entry")
        #expect(try FileManager.default.attributesOfItem(atPath: temporary.home.databasePath)[.size] as? Int == 0)
    }

    @Test("a home its owner made read-only is named in words, not an SQLite error")
    func readOnlyHome() async throws {
        let temporary = try await node("read-only")
        let home = temporary.home.path
        #expect(chown(home, 65534, 65534) == 0 && chmod(home, 0o500) == 0)
        for entry in try FileManager.default.subpathsOfDirectory(atPath: home) { #expect(chown(home + "/" + entry, 65534, 65534) == 0) }
        let result = try await thaliNode(["contacts", "list", "--home", home], asNobody: true)
        expectError(result, containing: "cannot use data directory \(home): permission denied (mode 0500): it must be readable and writable by you")
        #expect(!result.output.contains("SQLite"), "\(result.output)")
        #expect(chmod(home, 0o700) == 0)
    }

    @Test("a corrupt database is named in words with what to do")
    func corruptDatabase() async throws {
        let temporary = try await node("corrupt")
        for suffix in ["-wal", "-shm"] { try? FileManager.default.removeItem(atPath: temporary.home.databasePath + suffix) }
        try Data(repeating: 0x41, count: 8192).write(to: URL(fileURLWithPath: temporary.home.databasePath))
        let result = try await thaliNode(["contacts", "list", "--home", temporary.home.path])
        expectError(result, containing: "the database is damaged")
        #expect(result.output.contains("restore it from a backup"), "\(result.output)")
        #expect(!result.output.contains("SQLite error"), "\(result.output)")
    }

    // MARK: run

    /// `thali-node run` for `person` on loopback, JSON lines unless `human`.
    func run(_ person: TestPeople.Person, home: String? = nil, port: Int, human: Bool = false, _ extra: [String] = []) throws -> RunningPeer {
        try RunningPeer(person.name, thaliNodeExecutable, [
            "run", "--home", home ?? person.home.path, "--address", "127.0.0.1", "--ssdp-port", String(port), "--max-age", "5",
        ] + (human ? [] : ["--json"]) + extra)
    }

    /// Waits until `peer` printed a line containing `text`; returns that line.
    @discardableResult
    func waitForLine(_ peer: RunningPeer, containing text: String, timeout: Duration = .seconds(30)) async throws -> Substring {
        do {
            return try await peer.waitForOutputLine(containing: text, timeout: timeout)
        } catch {
            Issue.record("\(error)")
            return ""
        }
    }

    @Test("a sender whose data directory was moved delivers its queued file from the new place")
    func movedSenderDelivers() async throws {
        let people = try TestPeople(["alice", "bob"], label: "moved-run")
        let (alice, bob) = (try people["alice"], try people["bob"])
        let content = Data(randomBytes(50_000))
        let source = alice.home.path + "/photo.bin"
        try content.write(to: URL(fileURLWithPath: source))
        let item = try alice.store.enqueueFile(at: source, to: "bob", expiresAt: Date().addingTimeInterval(600))
        let moved = TemporaryHome("moved-alice")
        #expect(rename(alice.home.path, moved.home.path) == 0)
        let port = randomSSDPPort()
        let alicePeer = try run(alice, home: moved.home.path, port: port), bobPeer = try run(bob, port: port)
        try await bobPeer.waitFor("the file") { $0.receivedItem?.id == item.id }
        try await alicePeer.waitFor("the delivery") { $0.deliveredID == item.id }
        let received = try #require(try bob.store.inbox().first { $0.itemID == item.id }?.filePath)
        #expect(FileManager.default.contents(atPath: received) == content)
        #expect(!alicePeer.output.contains("missing"), "\(alicePeer.output)")
    }

    /// Alice (JSON lines, `aliceOptions`) with `text` queued for Bob (readable lines), both running.
    func aliceSending(_ text: String, toReadableBob label: String, aliceOptions: [String] = []) throws
        -> (people: TestPeople, alice: RunningPeer, bob: RunningPeer) {
        let people = try TestPeople(["alice", "bob"], label: label)
        _ = try people["alice"].store.enqueueText(text, to: "bob", expiresAt: Date().addingTimeInterval(600))
        let port = randomSSDPPort()
        return (people, try run(try people["alice"], port: port, aliceOptions), try run(try people["bob"], port: port, human: true))
    }

    @Test("run prints a contact's text with its control characters escaped")
    func runEscapesReceivedText() async throws {
        let (people, alicePeer, bobPeer) = try aliceSending("hi\u{1B}[2J\u{1B}]0;owned\u{07}\rFAKE LINE", toReadableBob: "run-escape")
        let line = try await waitForLine(bobPeer, containing: "received from alice")
        #expect(line.contains(#"hi\u{1B}[2J\u{1B}]0;owned\u{7}\rFAKE LINE"#), "\(line)")
        for byte: UInt8 in [0x1B, 0x07, 0x0D] { #expect(!bobPeer.output.utf8.contains(byte), "\(bobPeer.output)") }
        withExtendedLifetime((people, alicePeer)) {}
    }

    @Test("run's readable lines round the retry delay (--json keeps retry_in_ms)")
    func runRoundsDurations() async throws {
        // One connection per source per 10 s: Bob's beacon fetch takes it, so his PSK-TLS connections fail.
        let (people, alicePeer, bobPeer) = try aliceSending("hi", toReadableBob: "run-round", aliceOptions: ["--per-source-limit", "1"])
        let line = try await waitForLine(bobPeer, containing: "retrying in")
        #expect(line.contains(/retrying in \d+\.\d\d s$/), "\(line)")
        #expect(!bobPeer.output.contains(/\d\.\d{4,}/), "\(bobPeer.output)")
        withExtendedLifetime((people, alicePeer)) {}
    }

    @Test("a second run on the same home refuses, naming the holder; a killed run leaves no stale lock")
    func runLock() async throws {
        let people = try TestPeople(["alice", "bob"], label: "lock")
        let alice = try people["alice"]
        _ = try alice.store.enqueueText("queued", to: "bob", expiresAt: Date().addingTimeInterval(600))
        let port = randomSSDPPort()
        let first = try run(alice, port: port)
        try await first.waitFor("started") { $0.isStarted }
        let second = try await thaliNode(["run", "--home", alice.home.path, "--address", "127.0.0.1", "--ssdp-port", String(port)])
        expectError(second, containing: "\(alice.home.path) is in use by another running peer (a `thali-node run` or an app) (pid \(first.pid))")
        // Removing a contact whose items the run is delivering waits for the run to stop.
        expectError(try await thaliNode(["contacts", "remove", "bob", "--force", "--home", alice.home.path]),
                    containing: "(pid \(first.pid))")
        #expect(try alice.store.contacts().map(\.name) == ["bob"])
        #expect(first.kill(signal: SIGKILL) == 128 + SIGKILL)
        let third = try run(alice, port: port, ["--duration", "0.5"])
        try await third.waitFor("stopped") { $0.stopReason == "duration" }
    }

    @Test("outbox shows expired items as expired, and run reports each one it deletes")
    func expiredItems() async throws {
        let people = try TestPeople(["alice", "bob"], label: "expired")
        let alice = try people["alice"]
        let queuedAt = Date().addingTimeInterval(-60)
        let item = try alice.store.enqueueText("too late", to: "bob", expiresAt: queuedAt.addingTimeInterval(1), now: queuedAt)
        let listed = try jsonArray(try await thaliNode(["outbox", "--json", "--home", alice.home.path]))
        #expect(listed.first?["state"] as? String == "expired")
        let shown = try await thaliNode(["outbox", "--home", alice.home.path])
        #expect(shown.output.contains("expired  \"too late\""), "\(shown.output)")
        let peer = try run(alice, port: randomSSDPPort(), ["--duration", "1"])
        try await peer.waitFor("the expired event") {
            if case .expired(let expired) = $0 { expired.id == item.id && expired.kind == .text } else { false }
        }
        try await peer.waitFor("stopped") { $0.stopReason != nil }
        #expect(try alice.store.outbox().isEmpty)
    }

    // MARK: 10. Errors in words

    /// `thali-node arguments` in a mount namespace of its own where `directory` is a 1 MB tmpfs: a full
    /// disk for that directory only, gone with the process.
    func onSmallDisk(_ directory: String, _ arguments: [String]) -> (String, [String]) {
        let quoted = arguments.map { "'" + $0.replacingOccurrences(of: "'", with: "'\\''") + "'" }.joined(separator: " ")
        return ("unshare", ["--mount", "sh", "-c",
                            "mount -t tmpfs -o size=1m tmpfs '\(directory)' && exec '\(thaliNodeExecutable)' \(quoted)"])
    }

    @Test("a full disk while queuing a file is blamed on the data directory, in words")
    func diskFullWhileQueuing() async throws {
        let temporary = try await node("full-send")
        let source = temporary.home.path + "-3mb.bin"
        try Data(count: 3_000_000).write(to: URL(fileURLWithPath: source))
        defer { try? FileManager.default.removeItem(atPath: source) }
        let (program, arguments) = onSmallDisk(temporary.home.outboxDirectory,
                                               ["send", "bob", "--file", source, "--home", temporary.home.path])
        let raw = try await Task.detached { try ChildProcess.run(program, arguments, timeout: .seconds(20)) }.value
        let result = Result(status: raw.status, output: raw.output)
        expectError(result, containing: "cannot use data directory \(temporary.home.outboxDirectory)/")
        #expect(result.output.contains(": the disk is full; free some space and try again"), "\(result.output)")
        #expect(!result.output.contains("cannot read") && !result.output.contains("Error Domain"), "\(result.output)")
        #expect(try NodeStore(home: temporary.home).outbox().isEmpty)
    }

    @Test("discover on an address no interface has says so in words, not noInterface(address:)")
    func discoverOnMissingAddress() async throws {
        let result = try await thaliNode(["discover", "--interface-address", "10.9.9.9", "--duration", "1"])
        expectError(result, containing: "no local interface has the address 10.9.9.9; give one of this machine's IPv4 addresses")
        #expect(!result.output.contains("noInterface"), "\(result.output)")
    }

    @Test("a disk too small to receive on is one reason in words, not Foundation's error")
    func diskFullWhileReceiving() async throws {
        let people = try TestPeople(["alice", "bob"], label: "full-receive")
        let (alice, bob) = (try people["alice"], try people["bob"])
        let source = alice.home.path + "/3mb.bin"
        try Data(randomBytes(3_000_000)).write(to: URL(fileURLWithPath: source))
        _ = try alice.store.enqueueFile(at: source, to: "bob", expiresAt: Date().addingTimeInterval(600))
        let port = randomSSDPPort()
        let alicePeer = try run(alice, port: port)
        let (program, arguments) = onSmallDisk(bob.home.partialDirectory, [
            "run", "--home", bob.home.path, "--address", "127.0.0.1", "--ssdp-port", String(port), "--max-age", "5", "--json",
        ])
        let bobPeer = try RunningPeer("bob", program, arguments)
        // Version 4: the offer is refused for now (the free space is checked before a byte comes), in words.
        let refused = try await bobPeer.waitFor("the refusal") {
            if case .delivery(_, .refusedOffer(_, .noSpace, _)) = $0 { true } else { false }
        }
        guard case .delivery(_, .refusedOffer(_, _, let reason)) = refused else { return }
        #expect(reason.hasPrefix("not enough space: "), "\(refused)")
        #expect(reason.contains(" free in \(bob.home.partialDirectory)"), "\(refused)")
        #expect(!bobPeer.output.contains("NSCocoaErrorDomain") && !alicePeer.output.contains("NSCocoaErrorDomain"),
                "\(bobPeer.output)")
    }

    // MARK: 9. Small surprises

    @Test("--home \"\" is refused; the identity hint names the --home in use; a failed run creates nothing")
    func homeOptionAndHints() async throws {
        expectError(try await thaliNode(["contacts", "list", "--home", ""]), containing: "--home is empty")
        let temporary = TemporaryHome("hint")
        try temporary.home.create()
        expectError(try await thaliNode(["send", "bob", "hi", "--home", temporary.home.path]),
                    containing: "create one with `thali-node identity create --home \(temporary.home.path)`")
        let absent = TemporaryHome("absent")
        expectError(try await thaliNode(["run", "--home", absent.home.path, "--address", "127.0.0.1"]),
                    containing: "no identity at \(absent.home.identityPath)")
        #expect(!FileManager.default.fileExists(atPath: absent.home.path), "run left a data directory behind")
    }
}
