import Foundation
import Testing
import ThaliBeacons
import ThaliTestSupport
@testable import ThaliNodeCore

/// The CLI as a new user meets it (issue 10): every mistake gives one clear line on standard error, a
/// non-zero exit, and changes nothing. Each test runs the real binary.
@Suite("thali-node command line: mistakes", .serialized)
struct CommandLineUsabilityTests {
    struct Run {
        let status: Int32
        let output: String
        var lines: [Substring] { output.split(separator: "\n") }
    }

    func thaliNode(_ arguments: [String]) async throws -> Run {
        let executable = CommandLineTests.executable
        let result = try await Task.detached { try ChildProcess.run(executable, arguments, timeout: .seconds(20)) }.value
        return Run(status: result.status, output: result.output)
    }

    /// A shell line (for arguments Swift strings cannot carry, such as invalid UTF-8).
    func shell(_ script: String) async throws -> Run {
        let executable = CommandLineTests.executable
        let result = try await Task.detached {
            try ChildProcess.run("/bin/sh", ["-c", script], environment: ["THALI_NODE": executable], timeout: .seconds(20))
        }.value
        return Run(status: result.status, output: result.output)
    }

    /// Every file under `path` with its size and modification time, and what the store holds:
    /// "nothing changed" is this, equal. (SQLite may checkpoint its journal into the database file when a
    /// process opens it, which changes the file but not what it holds, so the database is compared by content.)
    func snapshot(_ path: String) -> [String: String] {
        var entries: [String: String] = [:]
        guard let enumerator = FileManager.default.enumerator(atPath: path) else { return entries }
        for case let relative as String in enumerator {
            if relative.hasPrefix("node.sqlite") {
                entries[relative] = "present"
                continue
            }
            let attributes = try? FileManager.default.attributesOfItem(atPath: path + "/" + relative)
            entries[relative] = "\(attributes?[.size] ?? 0) \(attributes?[.modificationDate] ?? "")"
        }
        if FileManager.default.fileExists(atPath: path + "/node.sqlite"), let store = try? NodeStore(home: NodeHome(path: path)) {
            entries["contacts"] = (try? store.contacts().map { "\($0.name)=\($0.publicKey)" }.joined(separator: ",")) ?? "?"
            entries["outbox"] = (try? store.outbox().map { "\($0.id)" }.joined(separator: ",")) ?? "?"
            entries["inbox"] = (try? store.inbox().map { "\($0.itemID)" }.joined(separator: ",")) ?? "?"
        }
        return entries
    }

    /// Expects one `error: ...` line containing `text`, a non-zero exit, and the data directory unchanged.
    func expectRefusal(_ run: () async throws -> Run, containing text: String, home: String,
                       sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let before = snapshot(home)
        let result = try await run()
        #expect(result.status != 0, "\(result.output)", sourceLocation: sourceLocation)
        #expect(result.lines.count == 1, "one line: \(result.output)", sourceLocation: sourceLocation)
        #expect(result.output.hasPrefix("error: "), "\(result.output)", sourceLocation: sourceLocation)
        #expect(result.output.contains(text), "\(result.output)", sourceLocation: sourceLocation)
        #expect(snapshot(home) == before, "nothing changed in \(home)", sourceLocation: sourceLocation)
    }

    /// A data directory with an identity and a contact `bob`.
    func node(_ label: String) async throws -> (TemporaryHome, String) {
        let temporary = TemporaryHome(label)
        let home = temporary.home.path
        #expect(try await thaliNode(["identity", "create", "--home", home]).status == 0)
        let bob = PrivateKey().publicKey.hexString(compressed: true)
        #expect(try await thaliNode(["contacts", "add", "bob", bob, "--home", home]).status == 0)
        return (temporary, home)
    }

    @Test("send --file refuses a FIFO without a writer, a device and an unnamed pipe at once; reads a named pipe")
    func sendFileKinds() async throws {
        let (temporary, home) = try await node("cli-fifo")
        defer { withExtendedLifetime(temporary) {} }
        let fifo = temporary.home.path + "-fifo"
        #expect(mkfifo(fifo, 0o600) == 0)
        defer { unlink(fifo) }
        try await expectRefusal({ try await thaliNode(["send", "bob", "--file", fifo, "--home", home]) },
                                containing: "a named pipe (FIFO; opening it waits for a writer), not a regular file", home: home)
        try await expectRefusal({ try await shell("exec \"$THALI_NODE\" send bob --file /dev/stdin --name x --home '\(home)' < /dev/null") },
                                containing: "/dev/stdin: a device, not a regular file", home: home)
        try await expectRefusal({ try await shell("printf 'piped bytes' | \"$THALI_NODE\" send bob --file /dev/stdin --home '\(home)'") },
                                containing: "/dev/stdin: a pipe; give the name the contact receives it under with --name", home: home)
        let limited = #"{"maxItemBytes": 4}"#
        try Data(limited.utf8).write(to: URL(fileURLWithPath: temporary.home.configurationPath))
        try await expectRefusal({ try await shell("printf 'piped bytes' | \"$THALI_NODE\" send bob --file /dev/stdin --name big.txt --home '\(home)'") },
                                containing: "over this node's limit of 4 bytes", home: home)
        try FileManager.default.removeItem(atPath: temporary.home.configurationPath)

        let piped = try await shell("printf 'piped bytes' | \"$THALI_NODE\" send bob --file /dev/stdin --name piped.txt --home '\(home)'")
        #expect(piped.status == 0, "\(piped.output)")
        let item = try #require(try NodeStore(home: temporary.home).outbox().first)
        #expect(item.fileName == "piped.txt" && item.size == 11)
        #expect(try Data(contentsOf: URL(fileURLWithPath: try #require(item.filePath))) == Data("piped bytes".utf8))
    }

    @Test("send --file --name sets the delivered name; --name without --file is refused")
    func sendName() async throws {
        let (temporary, home) = try await node("cli-name")
        defer { withExtendedLifetime(temporary) {} }
        let path = temporary.home.path + "-report.bin"
        try Data([1, 2, 3]).write(to: URL(fileURLWithPath: path))
        defer { try? FileManager.default.removeItem(atPath: path) }
        let queued = try await thaliNode(["send", "bob", "--file", path, "--name", "report.pdf", "--home", home])
        #expect(queued.status == 0, "\(queued.output)")
        let outbox = try await thaliNode(["outbox", "--json", "--home", home])
        #expect(outbox.output.contains("\"file_name\" : \"report.pdf\""), "\(outbox.output)")
        try await expectRefusal({ try await thaliNode(["send", "bob", "hi", "--name", "x", "--home", home]) },
                                containing: "--name names a file", home: home)
    }

    @Test("a text that is not valid UTF-8 is refused, not delivered changed")
    func invalidUTF8Text() async throws {
        let (temporary, home) = try await node("cli-utf8")
        defer { withExtendedLifetime(temporary) {} }
        try await expectRefusal({ try await shell("exec \"$THALI_NODE\" send bob \"$(printf 'caf\\351')\" --home '\(home)'") },
                                containing: "is not valid UTF-8 (636166e9)", home: home)
    }

    @Test("a key with a typo, a 0x prefix or the wrong length says which encodings were tried and why each failed")
    func keyInput() async throws {
        let (temporary, home) = try await node("cli-key")
        defer { withExtendedLifetime(temporary) {} }
        let key = PrivateKey().publicKey.hexString(compressed: true)
        try await expectRefusal({ try await thaliNode(["contacts", "add", "carol", String(key.dropLast()) + "g", "--home", home]) },
                                containing: "as hex: 'g' at position 66 is not a hex digit; as base64", home: home)
        try await expectRefusal({ try await thaliNode(["contacts", "add", "carol", String(key.dropLast()), "--home", home]) },
                                containing: "as hex: 65 digits, an odd number", home: home)
        let added = try await thaliNode(["contacts", "add", "carol", "0x" + key, "--home", home])
        #expect(added.status == 0, "a 0x prefix is hex: \(added.output)")
        try await expectRefusal({ try await thaliNode(["contacts", "add", "dave", "0x02ab", "--home", home]) },
                                containing: "as hex, 2 bytes: expected a 33-byte", home: home)
    }

    @Test("config init on an existing file, differing ports and a name with a newline: one line each")
    func oneLineErrors() async throws {
        let (temporary, home) = try await node("cli-lines")
        defer { withExtendedLifetime(temporary) {} }
        #expect(try await thaliNode(["config", "init", "--home", home]).status == 0)
        try await expectRefusal({ try await thaliNode(["config", "init", "--home", home]) },
                                containing: "config.json exists; use --force to replace it", home: home)
        var configuration = try String(contentsOfFile: temporary.home.configurationPath, encoding: .utf8)
        configuration = configuration.replacingOccurrences(of: "\"deliveryPort\" : 0", with: "\"deliveryPort\" : 4000")
            .replacingOccurrences(of: "\"beaconPort\" : 0", with: "\"beaconPort\" : 4001")
        try configuration.write(toFile: temporary.home.configurationPath, atomically: true, encoding: .utf8)
        try await expectRefusal({ try await thaliNode(["run", "--address", "127.0.0.1", "--home", home]) },
                                containing: "deliveryPort 4000 and beaconPort 4001 differ", home: home)
        try await expectRefusal({ try await thaliNode(["contacts", "add", "eve\nmallory", PrivateKey().publicKey.hexString(compressed: true), "--home", home]) },
                                containing: "\"eve\\nmallory\"", home: home)
    }

    @Test("invalid JSON in config.json names the line and the column")
    func jsonPosition() async throws {
        let (temporary, home) = try await node("cli-json")
        defer { withExtendedLifetime(temporary) {} }
        try Data("{\n  \"ssdpPort\": 1900,\n  \"logLevel\": info\n}\n".utf8).write(to: URL(fileURLWithPath: temporary.home.configurationPath))
        try await expectRefusal({ try await thaliNode(["config", "show", "--home", home]) },
                                containing: "line 3, column 15", home: home)
        try Data("{ \"ssdpPort\": ".utf8).write(to: URL(fileURLWithPath: temporary.home.configurationPath))
        try await expectRefusal({ try await thaliNode(["contacts", "list", "--home", home]) },
                                containing: "line 1, column 15: unexpected end", home: home)
        try Data("{ \"dhGroup\": \"ffdhe1024\" }".utf8).write(to: URL(fileURLWithPath: temporary.home.configurationPath))
        try await expectRefusal({ try await thaliNode(["config", "show", "--home", home]) },
                                containing: "\"dhGroup\": \"ffdhe1024\" must be one of ffdhe2048, ffdhe3072, ffdhe4096", home: home)
    }

    @Test("read-only commands on a fresh data directory create nothing")
    func readOnlyCommandsWriteNothing() async throws {
        let temporary = TemporaryHome("cli-readonly")
        defer { withExtendedLifetime(temporary) {} }
        let home = temporary.home.path
        for arguments in [["contacts", "list"], ["inbox"], ["inbox", "--json"], ["outbox"], ["config", "show"]] {
            let result = try await thaliNode(arguments + ["--home", home])
            #expect(result.status == 0, "\(arguments): \(result.output)")
            #expect(!FileManager.default.fileExists(atPath: home), "\(arguments) created \(home)")
        }
        let empty = try await thaliNode(["inbox", "--json", "--home", home])
        #expect(empty.output == "[]\n")
        // Commands that only look something up refuse without creating it either.
        try await expectRefusal({ try await thaliNode(["contacts", "remove", "bob", "--home", home]) },
                                containing: "unknown contact \"bob\"", home: home)
        #expect(!FileManager.default.fileExists(atPath: home))
    }

    @Test("--home is accepted before the subcommand too")
    func globalOptionFirst() async throws {
        let (temporary, home) = try await node("cli-global")
        defer { withExtendedLifetime(temporary) {} }
        let before = try await thaliNode(["--home", home, "contacts", "list"])
        #expect(before.status == 0, "\(before.output)")
        #expect(before.output.contains("bob"))
        let equals = try await thaliNode(["--home=\(home)", "contacts", "list"])
        #expect(equals.output.contains("bob"), "\(equals.output)")
    }

    @Test("conformance peer refuses its timing options out of range, in one line naming the option")
    func conformancePeerTimingOptions() async throws {
        let key = PrivateKey().publicKey.hexString(compressed: true)
        for (option, value) in [("--searches-at-once", "0"), ("--close-notify-timeout-ms", "700000"), ("--announcement-wait-ms", "600001"),
                                ("--renegotiation-timeout-ms", "999999"), ("--search-delay-tolerance-ms", "600001")] {
            let run = try await thaliNode(["conformance", "peer", "--peer-key", key, "--identity", "/nonexistent", option, value])
            #expect(run.status != 0 && run.lines.count == 1 && run.output.contains(option), "\(option): \(run.output)")
        }
    }
}
