import Foundation
import Synchronization
import Testing
import ThaliBeacons
import ThaliTestSupport
@testable import ThaliNodeCore
#if canImport(Glibc)
import Glibc
#endif

/// `thali-node` as a person uses it every day (issue 37): output that goes away, files that change while
/// they are queued, items to cancel or delete, exit codes a script can tell apart. Each test runs the
/// real binary.
@Suite("thali-node every day", .serialized, .timeLimit(.minutes(3)))
struct DailyUseTests {
    typealias Result = (status: Int32, output: String)

    func thaliNode(_ arguments: [String], timeout: Duration = .seconds(30)) async throws -> Result {
        let executable = CommandLineTests.executable
        return try await Task.detached { try ChildProcess.run(executable, arguments, timeout: timeout) }.value
    }

    /// `script` run by /bin/sh with `$T` the binary.
    func shell(_ script: String, timeout: Duration = .seconds(30)) async throws -> Result {
        let executable = CommandLineTests.executable
        return try await Task.detached {
            try ChildProcess.run("/bin/sh", ["-c", script], environment: ["T": executable], timeout: timeout)
        }.value
    }

    func runArguments(_ home: String, _ extra: [String] = []) -> [String] {
        ["run", "--home", home, "--address", "127.0.0.1", "--ssdp-port", String(randomSSDPPort())] + extra
    }

    // MARK: Output that goes away (item 1)

    @Test("run | head -1 stops at once with exit 0, releasing its lock and events socket; > /dev/full stops with 74 and one line")
    func outputGoingAwayStopsCleanly() async throws {
        let people = try TestPeople(["alice"], label: "pipe")
        let home = try people["alice"].home.path
        let run = runArguments(home, ["--duration", "20"]).map { "'\($0)'" }.joined(separator: " ")
        // The exit status of `run` itself, written where `head` cannot eat it.
        let piped = try await shell("{ \"$T\" \(run); echo \"status=$?\" >&2; } | head -1", timeout: .seconds(15))
        #expect(piped.output.contains("status=0"), "\(piped.output)")
        #expect(!piped.output.contains("Fatal error"), "\(piped.output)")
        #expect(piped.output.contains("listening at"), "\(piped.output)")
        #expect(!FileManager.default.fileExists(atPath: try people["alice"].home.eventsSocketPath))
        #expect(RunLock.holder(of: try people["alice"].home) == nil)

        let full = try await shell("\"$T\" \(run) > /dev/full", timeout: .seconds(15))
        #expect(full.status == 74, "\(full.output)")
        #expect(full.output == "error: standard output failed (No space left on device, errno 28); the node stopped cleanly\n", "\(full.output)")
        #expect(!FileManager.default.fileExists(atPath: try people["alice"].home.eventsSocketPath))
    }

    @Test("run | tee, tee gone and then SIGINT: the node stops with exit 0 and the lines before are in the file")
    func teeThenInterrupt() async throws {
        let people = try TestPeople(["alice"], label: "tee")
        let home = try people["alice"].home.path
        let log = home + "-tee.log"
        defer { unlink(log) }
        let run = runArguments(home, ["--duration", "30", "--status-interval", "0.2"]).map { "'\($0)'" }.joined(separator: " ")
        // tee ends first (as Ctrl-C ends it first; SIGTERM here: a script's background job ignores SIGINT),
        // then the node gets SIGINT with lines still to print.
        // Only this pipeline's tee ($! is the last command of a background pipeline): `pkill tee` would end
        // every tee on the machine, the test command's own among them.
        let script = """
            { "$T" \(run); echo "status=$?" >&2; } | tee '\(log)' > /dev/null &
            tee_pid=$!
            sleep 1; kill -TERM "$tee_pid"; sleep 0.5; pkill -INT -f -- '--home \(home) '; wait
            """
        let result = try await shell(script, timeout: .seconds(20))
        #expect(result.output.contains("status=0"), "\(result.output)")
        #expect(!result.output.contains("Fatal error"), "\(result.output)")
        #expect(try String(contentsOfFile: log, encoding: .utf8).contains("listening at"))
        #expect(RunLock.holder(of: try people["alice"].home) == nil)
    }

    // MARK: Files (items 2, 6, 15)

    @Test("a file written while send --file copies it is refused in words, and nothing is queued")
    func fileChangingWhileCopied() async throws {
        let people = try TestPeople(["alice", "bob"], label: "torn")
        let home = try people["alice"].home.path
        let path = home + "-big.bin"
        defer { unlink(path) }
        try Data(count: 96 << 20).write(to: URL(fileURLWithPath: path))
        // A writer that keeps rewriting the first bytes, before and during the copy, until the send ends.
        let done = Atomic<Bool>(false)
        let writer = Thread {
            let descriptor = open(path, O_WRONLY)
            defer { close(descriptor) }
            var byte: UInt8 = 1
            while !done.load(ordering: .relaxed) {
                _ = pwrite(descriptor, &byte, 1, 0)
                byte &+= 1
                usleep(500)  // paces the writer (a busy loop would take a core); nothing waits for a result
            }
        }
        writer.start()
        let result = try await thaliNode(["send", "bob", "--file", path, "--home", home])
        done.store(true, ordering: .relaxed)
        #expect(result.status == 65, "\(result.output)")
        #expect(result.output.contains("changed while it was read (it was written to); nothing was queued"), "\(result.output)")
        #expect(try people["alice"].store.outbox().isEmpty)
        #expect(try FileManager.default.contentsOfDirectory(atPath: home + "/outbox").isEmpty)
    }

    @Test("a file over maxItemBytes is refused before it is read, naming its true size; a long text is pointed to --file")
    func oversizedRefusedAtOnce() async throws {
        let people = try TestPeople(["alice", "bob"], label: "oversize")
        let home = try people["alice"].home.path
        let path = home + "-sparse.bin"
        defer { unlink(path) }
        let descriptor = open(path, O_CREAT | O_WRONLY, 0o600)
        #expect(ftruncate(descriptor, 3 << 30) == 0)  // 3 GiB, sparse
        close(descriptor)
        let result = try await thaliNode(["send", "bob", "--file", path, "--home", home])
        #expect(result.status == 65, "\(result.output)")
        #expect(result.output.contains("the item is 3.0 GiB (3221225472 bytes), over this node's limit"), "\(result.output)")
        let text = String(repeating: "x", count: 100_000)
        let long = try await thaliNode(["send", "bob", text, "--home", home])
        #expect(long.status == 65, "\(long.output)")
        #expect(long.output.contains("--file"), "\(long.output)")
    }

    @Test("a copy an interrupted send --file left is removed by the next command, which says so; one being made is kept")
    func interruptedCopyCleaned() async throws {
        let people = try TestPeople(["alice", "bob"], label: "copying")
        let home = try people["alice"].home.path
        let left = home + "/outbox/\(UUID().uuidString).copying"
        try Data(count: 3_000_000).write(to: URL(fileURLWithPath: left))
        // A copy in progress holds its lock: another command leaves it alone.
        let held = home + "/outbox/\(UUID().uuidString).copying"
        try Data(count: 10).write(to: URL(fileURLWithPath: held))
        let descriptor = open(held, O_RDONLY)
        defer { close(descriptor) }
        #expect(flock(descriptor, LOCK_EX) == 0)
        let result = try await thaliNode(["outbox", "--home", home])
        #expect(result.status == 0, "\(result.output)")
        #expect(result.output.contains("notice: removed outbox/\(URL(fileURLWithPath: left).lastPathComponent) (2.9 MiB)"), "\(result.output)")
        #expect(!FileManager.default.fileExists(atPath: left))
        #expect(FileManager.default.fileExists(atPath: held))
    }

    // MARK: Removing items (item 5)

    @Test("outbox remove cancels one item by its short id, --refused clears refused ones, a wrong id changes nothing")
    func outboxRemove() async throws {
        let people = try TestPeople(["alice", "bob"], label: "outbox-rm")
        let alice = try people["alice"]
        let home = alice.home.path
        let expiry = Date().addingTimeInterval(600)
        let first = try alice.store.enqueueText("one", to: "bob", expiresAt: expiry)
        let second = try alice.store.enqueueText("two", to: "bob", expiresAt: expiry)
        let path = home + "-f.bin"
        defer { unlink(path) }
        try Data(count: 1000).write(to: URL(fileURLWithPath: path))
        let file = try alice.store.enqueueFile(at: path, to: "bob", expiresAt: expiry)
        try alice.store.markRefused(second.id, reason: "test")

        let listing = try await thaliNode(["outbox", "--home", home])
        #expect(listing.output.contains(String(first.id.uuidString.prefix(8))), "\(listing.output)")
        // All or nothing: one id that names no item removes none.
        let wrong = try await thaliNode(["outbox", "remove", String(first.id.uuidString.prefix(8)), "ffff0000", "--home", home])
        #expect(wrong.status == 65, "\(wrong.output)")
        #expect(wrong.output.contains("no item \"ffff0000\" in the outbox"), "\(wrong.output)")
        #expect(try alice.store.outbox().count == 3)

        let removed = try await thaliNode(["outbox", "rm", String(file.id.uuidString.prefix(8)).lowercased(), "--home", home])
        #expect(removed.status == 0, "\(removed.output)")
        #expect(removed.output.contains("removed \(file.id.uuidString.prefix(8)) (file "), "\(removed.output)")
        #expect(!FileManager.default.fileExists(atPath: home + "/outbox/\(file.id.uuidString)"))
        let refused = try await thaliNode(["outbox", "remove", "--refused", "--home", home])
        #expect(refused.status == 0, "\(refused.output)")
        #expect(try alice.store.outbox().map(\.id) == [first.id])
    }

    @Test("a received file with a direction override is stored under a safe name; deleted by hand it is listed as missing; inbox remove deletes it")
    func receivedFileNamesAndInboxRemove() async throws {
        let people = try TestPeople(["alice", "bob"], label: "inbox-rm")
        let (alice, bob) = (try people["alice"], try people["bob"])
        let path = alice.home.path + "-photo.bin"
        defer { unlink(path) }
        try Data("not a picture".utf8).write(to: URL(fileURLWithPath: path))
        let file = try alice.store.enqueueFile(at: path, to: "bob", expiresAt: Date().addingTimeInterval(600))
        // What another implementation may send (this one refuses such a name when queuing): shown as
        // "photoexe.jpg", it is an executable.
        let spoofing = "photo\u{202E}gpj.exe"
        try await alice.store.pool.write { db in
            try db.execute(sql: "UPDATE outboxItem SET fileName = ? WHERE id = ?", arguments: [spoofing, file.id])
        }
        let port = randomSSDPPort()
        let arguments = { (home: String) in ["run", "--home", home, "--address", "127.0.0.1", "--ssdp-port", String(port), "--json", "--max-age", "5"] }
        let alicePeer = try RunningPeer("alice", CommandLineTests.executable, arguments(alice.home.path))
        let bobPeer = try RunningPeer("bob", CommandLineTests.executable, arguments(bob.home.path))
        try await bobPeer.waitFor("the file") { $0.receivedItem?.id == file.id }
        #expect(alicePeer.kill(signal: SIGTERM) == 0 && bobPeer.kill(signal: SIGTERM) == 0)

        let item = try #require(try bob.store.inbox().first)
        #expect(item.fileName == spoofing)
        let stored = try #require(item.filePath)
        #expect(URL(fileURLWithPath: stored).lastPathComponent == "photo_gpj.exe")
        #expect(try Data(contentsOf: URL(fileURLWithPath: stored)) == Data("not a picture".utf8))
        let listing = try await thaliNode(["inbox", "--home", bob.home.path])
        #expect(listing.output.contains("photo\\u{202E}gpj.exe"), "\(listing.output)")
        #expect(listing.output.contains("at \(stored)"), "\(listing.output)")

        try FileManager.default.removeItem(atPath: stored)
        let missing = try await thaliNode(["inbox", "--home", bob.home.path])
        #expect(missing.output.contains("missing: deleted from \(stored)"), "\(missing.output)")
        let removed = try await thaliNode(["inbox", "remove", String(file.id.uuidString.prefix(6)), "--home", bob.home.path])
        #expect(removed.status == 0, "\(removed.output)")
        #expect(try bob.store.inbox().isEmpty)
        #expect(!FileManager.default.fileExists(atPath: bob.home.inboxDirectory + "/" + file.id.uuidString))
    }

    // MARK: Refusals in words (item 9)

    @Test("a file over the receiver's maxItemBytes: the receiver says what it refused and its limit, the sender says it in words")
    func refusalInWordsOnBothSides() async throws {
        let people = try TestPeople(["alice", "bob"], label: "refusal-words")
        let (alice, bob) = (try people["alice"], try people["bob"])
        try Data(#"{"maxItemBytes": 1048576}"#.utf8).write(to: URL(fileURLWithPath: bob.home.configurationPath))
        let path = alice.home.path + "/big.bin"
        try Data(count: 3 << 20).write(to: URL(fileURLWithPath: path))
        let file = try alice.store.enqueueFile(at: path, to: "bob", expiresAt: Date().addingTimeInterval(600))
        let port = String(randomSSDPPort())
        let arguments = { (home: String) in ["run", "--home", home, "--address", "127.0.0.1", "--ssdp-port", port, "--json"] }
        let sender = try RunningPeer("alice", CommandLineTests.executable, arguments(alice.home.path))
        let receiver = try RunningPeer("bob", CommandLineTests.executable, arguments(bob.home.path))
        defer { _ = sender.kill(); _ = receiver.kill() }
        let refused = try await receiver.waitFor("the receiver's refusal") {
            if case .delivery(_, .refusedOffer(let item, .tooLarge, _)) = $0 { item.id == file.id && item.fileName == "big.bin" } else { false }
        }
        guard case .delivery(_, .refusedOffer(_, _, let reason)) = refused else { return }
        #expect(reason == "larger than this node's limit of 1.0 MiB (maxItemBytes)", "\(refused)")
        let told = try await sender.waitFor("the sender's refusal") {
            if case .delivery(_, .refused(let item, _)) = $0 { item.id == file.id } else { false }
        }
        // The line's reason is the refusal's words (not decoded: they follow from it), as it came.
        #expect(String(decoding: try told.jsonLine(), as: UTF8.self).contains(#""reason":"larger than what bob accepts""#), "\(told)")
        #expect(!sender.output.contains("tooLarge") && !receiver.output.contains("tooLarge"), "\(sender.output)")
        #expect(try alice.store.outboxItem(id: file.id)?.state == .refused)
    }

    // MARK: Names (item 17)

    @Test("direction controls are refused in contact names and in the names of files to send")
    func directionControlsRefused() async throws {
        let people = try TestPeople(["alice", "bob"], label: "bidi")
        let home = try people["alice"].home.path
        let key = PrivateKey().publicKey.hexString(compressed: true)
        let contact = try await thaliNode(["contacts", "add", "ev\u{202E}lis", key, "--home", home])
        #expect(contact.status == 64, "\(contact.output)")
        #expect(contact.output.contains("direction control"), "\(contact.output)")
        let path = home + "-doc.txt"
        defer { unlink(path) }
        try Data("x".utf8).write(to: URL(fileURLWithPath: path))
        let send = try await thaliNode(["send", "bob", "--file", path, "--name", "invoice\u{202E}fdp.exe", "--home", home])
        #expect(send.status == 65, "\(send.output)")
        #expect(send.output.contains("direction-changing"), "\(send.output)")
    }

    // MARK: Progress (item 7)

    @Test("progress: redrawn in place with rate and time left on a terminal, plain lines with the rate elsewhere")
    func progressForPeople() async throws {
        let people = try TestPeople(["alice", "bob"], label: "progress")
        let (alice, bob) = (try people["alice"], try people["bob"])
        let path = alice.home.path + "-p.bin"
        defer { unlink(path) }
        try Data(randomBytes(4_000_000)).write(to: URL(fileURLWithPath: path))
        let queued = try await thaliNode(["send", "bob", "--file", path, "--home", alice.home.path])
        #expect(queued.status == 0, "\(queued.output)")
        let id = try #require(try alice.store.outbox().first?.id)
        let port = String(randomSSDPPort())
        // 1 MB/s: a transfer of about 4 s, so that several reports come.
        let sender = try ChildProcess(CommandLineTests.executable, ["run", "--home", alice.home.path, "--address", "127.0.0.1",
                                                                  "--ssdp-port", port, "--throttle", "1000000"])
        defer { _ = sender.terminate() }
        let receiver = try ChildProcess("script", ["-qec", "'\(CommandLineTests.executable)' run --home \(bob.home.path) --address 127.0.0.1 --ssdp-port \(port)", "/dev/null"])
        defer { _ = receiver.terminate() }
        try await sender.waitForOutput(containing: "delivered \(id.uuidString.prefix(8))", timeout: .seconds(30))
        try await receiver.waitForOutput(containing: "100 %", timeout: .seconds(10))
        let short = String(id.uuidString.prefix(8))
        // Not a terminal: plain lines, each with the rate; no cursor control.
        let plain = sender.output.split(separator: "\n").filter { $0.contains("\(short) with bob:") }
        #expect(plain.count >= 2 && plain.count <= 5, "\(sender.output)")
        #expect(plain.contains { $0.contains("KiB/s") && $0.contains("s left") }, "\(sender.output)")
        #expect(!sender.output.contains("\u{1B}["), "\(sender.output)")
        // A terminal: one line redrawn (carriage return, erase line), with rate and time left.
        #expect(receiver.output.contains("\r\u{1B}[K"), "\(receiver.output)")
        #expect(receiver.output.contains("KiB/s"), "\(receiver.output)")
        #expect(receiver.output.split(separator: "\n").filter { $0.contains("\(short) with alice:") }.count == 1, "\(receiver.output)")
        // One line per event: no log line beside the readable one (the logs' info level said it again).
        #expect(!sender.output.contains("info thali.node") && !receiver.output.contains("info thali.node"), "\(sender.output)")
    }

    // MARK: discover and --json (items 13, 14)

    @Test("discover: bad input lines are refused with the line and change nothing; run's option names work; --json everywhere")
    func discoverInputAndNames() async throws {
        let people = try TestPeople(["alice", "bob"], label: "discover")
        let home = try people["alice"].home.path
        let discover = try ChildProcess(CommandLineTests.executable, [
            "discover", "--home", home, "--address", "127.0.0.1", "--ssdp-port", String(randomSSDPPort()),
            "--ssdp-group", "239.255.255.250", "--port", "0", "--beacons-hex", "0102", "--json",
        ])
        defer { _ = discover.terminate() }
        try await discover.waitForOutput(containing: #""event":"started""#)
        for line in ["beacons zz", "beacons 010", "background maybe", "", "   ", "frobnicate now"] { discover.write(line + "\n") }
        discover.write("background on\nstop\n")
        #expect(try await discover.waitForExit(timeout: .seconds(10)) == 0)
        let lines = discover.output.split(separator: "\n").map(String.init)
        let errors = lines.filter { $0.contains(#""event":"error""#) }
        #expect(errors.count == 4, "\(discover.output)")
        #expect(errors.contains { $0.contains("is not hex bytes") && $0.contains(#""line":"beacons zz""#) }, "\(discover.output)")
        #expect(errors.contains { $0.contains(#""line":"beacons 010""#) }, "\(discover.output)")
        #expect(errors.contains { $0.contains("background takes on or off") }, "\(discover.output)")
        #expect(errors.contains { $0.contains("unknown command 'frobnicate'") && $0.contains(#""line":"frobnicate now""#) }, "\(discover.output)")
        // Advertising never stopped: no `advertising` event with an empty USN.
        #expect(!lines.contains { $0.contains(#""event":"advertising""#) }, "\(discover.output)")
        #expect(lines.contains { $0.contains(#""event":"background""#) && $0.contains(#""on":true"#) }, "\(discover.output)")
        #expect(lines.contains { $0.contains(#""worst_loop_lag_ms""#) }, "\(discover.output)")

        #expect(try await thaliNode(["config", "show", "--json", "--home", home]).status == 0)
        let queued = try await thaliNode(["send", "bob", "--file", "/etc/hostname", "--json", "--home", home])
        #expect(queued.output.contains(#""file_name" : "hostname""#), "\(queued.output)")
        let outbox = try await thaliNode(["outbox", "--json", "--home", home])
        #expect(outbox.output.contains(#""sha256" : ""#), "\(outbox.output)")
        // A contact with nothing queued: its `deleted_items` is `[]`, not "[", a blank line and "]".
        #expect(try await thaliNode(["contacts", "add", "carol", PrivateKey().publicKey.hexString(compressed: true), "--home", home]).status == 0)
        let removed = try await thaliNode(["contacts", "remove", "carol", "--json", "--home", home])
        #expect(removed.status == 0, "\(removed.output)")
        #expect(removed.output.contains(#""deleted_items" : []"#), "\(removed.output)")
    }

    // MARK: Relay pins (item 4)

    @Test("relay pins refused at start: two contacts on one port, the node's own port, a port held now, an unknown contact")
    func relayPinsCheckedAtStart() async throws {
        let people = try TestPeople(["alice", "bob", "carol"], label: "pins")
        let home = try people["alice"].home.path
        let base = runArguments(home, ["--app-port", "9", "--duration", "1"])
        let twice = try await thaliNode(base + ["--relay-port", "bob=16000", "--relay-port", "carol=16000"])
        #expect(twice.status == 64, "\(twice.output)")
        #expect(twice.output.contains("port 16000 is pinned for bob and carol"), "\(twice.output)")
        let own = try await thaliNode(base + ["--port", "16001", "--relay-port", "bob=16001"])
        #expect(own.status == 64, "\(own.output)")
        #expect(own.output.contains("is this node's own port"), "\(own.output)")
        let held = try #require(freeLoopbackPort())
        let holder = try #require(listeningSocket(port: held))
        defer { close(holder) }
        let taken = try await thaliNode(base + ["--relay-port", "bob=\(held)"])
        #expect(taken.status == 69, "\(taken.output)")
        #expect(taken.output.contains("port \(held) on 127.0.0.1 cannot be used: in use by another process"), "\(taken.output)")
        let unknown = try await thaliNode(base + ["--relay-port", "dave=16002"])
        #expect(unknown.status == 65, "\(unknown.output)")
        #expect(unknown.output.contains("unknown contact \"dave\""), "\(unknown.output)")
    }

    @Test("a node whose apps only connect out needs no --app-port; its pinned port taken after start gives way to a free one, and delivery goes on")
    func relayClientWithoutAppPort() async throws {
        let people = try TestPeople(["alice", "bob"], label: "relay-client")
        let (alice, bob) = (try people["alice"], try people["bob"])
        let text = try alice.store.enqueueText("beside the relay", to: "bob", expiresAt: Date().addingTimeInterval(600))
        // Alice's app: an echo server, a process of its own.
        let echo = try ChildProcess("python3", ["-c", """
            import socket, threading
            s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); print(s.getsockname()[1], flush=True)
            def serve(c):
                while (d := c.recv(65536)): c.sendall(d)
                c.close()
            while True:
                c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
            """])
        defer { _ = echo.terminate() }
        try await echo.waitForOutput(containing: "\n")
        let appPort = try #require(Int(echo.output.trimmingCharacters(in: .whitespacesAndNewlines)))
        let pinned = try #require(freeLoopbackPort())
        let port = String(randomSSDPPort())
        let bobPeer = try RunningPeer("bob", CommandLineTests.executable, ["run", "--home", bob.home.path, "--address", "127.0.0.1",
                                                                          "--ssdp-port", port, "--json", "--relay-port", "alice=\(pinned)"])
        defer { _ = bobPeer.kill() }
        try await bobPeer.waitFor("started") { $0.isStarted }
        // Another process takes the pinned port after bob checked it at start.
        let holder = try #require(listeningSocket(port: pinned))
        defer { close(holder) }
        let alicePeer = try RunningPeer("alice", CommandLineTests.executable, ["run", "--home", alice.home.path, "--address", "127.0.0.1",
                                                                              "--ssdp-port", port, "--json", "--app-port", String(appPort)])
        defer { _ = alicePeer.kill() }
        let moved = try await bobPeer.waitFor("the relay on another port") {
            if case .relayPortUnavailable("alice", _, _, _) = $0 { true } else { false }
        }
        guard case .relayPortUnavailable(_, _, _, let other) = moved, let instead = other else {
            Issue.record("no port instead: \(moved)")
            return
        }
        #expect(instead != pinned)
        try await bobPeer.waitFor("alice's text") { $0.receivedItem?.id == text.id }
        let reply = try await Task.detached { try echoThrough(port: instead, "ping through the relay\n") }.value
        #expect(reply == "ping through the relay\n")
    }

    // MARK: Words and codes (items 8, 11, 12, 16)

    @Test("one table of exit codes: usage 64, unknown things 65, missing input 66, nothing running 69, exists 73")
    func exitCodes() async throws {
        let people = try TestPeople(["alice", "bob"], label: "codes")
        let home = try people["alice"].home.path
        let cases: [([String], Int32, String)] = [
            (runArguments(home, ["--ssdp-group", "1.2.3.4"]), 64, "is not an IPv4 multicast address"),
            (runArguments(home, ["--ssdp-group", "foo"]), 64, "is not an IPv4 multicast address"),
            (runArguments(home, ["--status-interval", "-1"]), 64, "--status-interval must not be negative"),
            (["send", "nobody", "hi", "--home", home], 65, "unknown contact \"nobody\""),
            (["send", "bob", "--file", home + "/nothing-here", "--home", home], 66, "no such file"),
            (["events", "--home", home], 69, "no node is running"),
            (["identity", "create", "--home", home], 73, "an identity exists already"),
            (["contacts", "add", PrivateKey().publicKey.hexString(compressed: true), "carol", "--home", home], 64,
             "the name comes first, as `contacts add NAME KEY`"),
        ]
        #expect(try await thaliNode(["config", "init", "--home", home]).status == 0)
        let again = try await thaliNode(["config", "init", "--home", home])
        #expect(again.status == 73, "\(again.output)")
        for (arguments, status, text) in cases {
            let result = try await thaliNode(arguments)
            #expect(result.status == status, "\(arguments): \(result.output)")
            #expect(result.output.hasPrefix("error: ") && result.output.contains(text), "\(arguments): \(result.output)")
            // No Swift internals, as `invalidAddress("1.2.3.4")` or `failedToParseIPString("foo")` were.
            #expect(result.output.range(of: #"[A-Za-z]\(""#, options: .regularExpression) == nil, "\(result.output)")
        }
    }

    @Test("a group command alone runs its default (contacts lists, with --home before it); a typo after a group is named")
    func groupCommands() async throws {
        let people = try TestPeople(["alice", "bob"], label: "groups")
        let home = try people["alice"].home.path
        let list = try await thaliNode(["--home", home, "contacts"])
        #expect(list.status == 0, "\(list.output)")
        #expect(list.output.contains("bob"), "\(list.output)")
        let typo = try await thaliNode(["--home", home, "contacts", "lst"])
        #expect(typo.status == 64, "\(typo.output)")
        #expect(typo.output.contains("did you mean 'list'?"), "\(typo.output)")
    }

    @Test("run --address 127.0.0.2 works: Linux routes all of 127/8 to lo")
    func anyLoopbackAddress() async throws {
        let people = try TestPeople(["alice"], label: "lo2")
        let result = try await thaliNode(["run", "--home", try people["alice"].home.path, "--address", "127.0.0.2",
                                          "--ssdp-port", String(randomSSDPPort()), "--duration", "1"])
        #expect(result.status == 0, "\(result.output)")
        #expect(result.output.contains("listening at http://127.0.0.2:"), "\(result.output)")
    }

    @Test("a data directory on a read-only file system is named as such, not as a mode chmod would fix")
    func readOnlyFileSystem() async throws {
        let people = try TestPeople(["alice", "bob"], label: "ro")
        let mountPoint = try people["alice"].home.path + "-ro"
        try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: mountPoint) }
        let key = PrivateKey().publicKey.hexString(compressed: true)
        let mounted = try await shell("""
            mount -t tmpfs -o size=4m tmpfs '\(mountPoint)' && "$T" identity create --home '\(mountPoint)/home' >/dev/null \
            && "$T" contacts add bob \(key) --home '\(mountPoint)/home' >/dev/null && mount -o remount,ro '\(mountPoint)'
            """)
        defer { _ = try? ChildProcess.run("umount", [mountPoint], timeout: .seconds(10)) }
        try #require(mounted.status == 0, "\(mounted.output)")
        for arguments in [["inbox"], ["send", "bob", "hi"], ["contacts", "list"]] {
            let result = try await thaliNode(arguments + ["--home", mountPoint + "/home"])
            #expect(result.status == 74, "\(arguments): \(result.output)")
            #expect(result.output.contains("read-only file system"), "\(arguments): \(result.output)")
            #expect(!result.output.contains("chmod"), "\(arguments): \(result.output)")
        }
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
func freeLoopbackPort() -> Int? {
    guard let descriptor = listeningSocket(port: 0) else { return nil }
    defer { close(descriptor) }
    var bound = sockaddr_in()
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &bound) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) } }
    return Int(UInt16(bigEndian: bound.sin_port))
}

/// A socket listening on 127.0.0.1:`port` (0: any), or nil.
func listeningSocket(port: Int) -> Int32? {
    let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = in_port_t(UInt16(port).bigEndian)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    let bound = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
    guard descriptor >= 0, bound == 0, listen(descriptor, 4) == 0 else {
        close(descriptor)
        return nil
    }
    return descriptor
}

/// Sends `line` to 127.0.0.1:`port` and reads back as many bytes (an echo through the relay).
func echoThrough(port: Int, _ line: String) throws -> String {
    let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(descriptor) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = in_port_t(UInt16(port).bigEndian)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var timeout = timeval(tv_sec: 10, tv_usec: 0)
    setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    let connected = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
    guard connected == 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
    let bytes = Array(line.utf8)
    _ = bytes.withUnsafeBytes { send(descriptor, $0.baseAddress, $0.count, 0) }
    var received: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 4096)
    while received.count < bytes.count {
        let count = buffer.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, 0) }
        guard count > 0 else { break }
        received += buffer.prefix(count)
    }
    return String(decoding: received, as: UTF8.self)
}
