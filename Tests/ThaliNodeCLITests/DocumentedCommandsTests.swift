import Foundation
import Testing
import ThaliTestSupport
@testable import ThaliNodeCore

/// The conventions a user brings from other command-line tools (issue 26): the documentation and the
/// binary agree, mistakes get suggestions, exit codes mean one thing.
@Suite("thali-node: documented commands and conventions", .serialized)
struct DocumentedCommandsTests {
    /// Every `thali-node ...` command line of `text`: lines of its code blocks and inline code spans.
    static func commandLines(in text: String) -> [String] {
        var lines: [String] = []
        var inCodeBlock = false
        var continued: String?
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            if trimmed.hasPrefix("```") {
                inCodeBlock.toggle()
                continue
            }
            if inCodeBlock {
                // A line ending in a backslash goes on in the next one.
                if let start = continued ?? (trimmed.hasPrefix("thali-node ") ? "" : nil) {
                    let joined = start + trimmed
                    if joined.hasSuffix("\\") {
                        continued = String(joined.dropLast()) + " "
                    } else {
                        continued = nil
                        lines.append(joined)
                    }
                }
                continue
            }
            for match in trimmed.matches(of: /`(thali-node [^`]+)`/) { lines.append(String(match.output.1)) }
        }
        return lines
    }

    /// The argument lists a documented line stands for: comments cut, `[optional]` parts included,
    /// `a|b|c` alternatives expanded, placeholders (`PUBLIC-KEY`, `KEY`, `PATH`, `FILE...`, `URL`, `HOST:PORT`)
    /// replaced by values of their kind.
    static func argumentLists(for line: String, publicKey: String, path: String) -> [[String]] {
        var text = line
        if let comment = text.range(of: " #") { text = String(text[..<comment.lowerBound]) }
        text = text.replacingOccurrences(of: "[", with: "").replacingOccurrences(of: "]", with: "")
        var words: [String] = []
        var current = ""
        var quoted = false
        for character in text {
            if character == "\"" {
                quoted.toggle()
            } else if character == " " && !quoted {
                if !current.isEmpty { words.append(current) }
                current = ""
            } else {
                current.append(character)
            }
        }
        if !current.isEmpty { words.append(current) }
        let placeholders = ["PUBLIC-KEY": publicKey, "KEY": publicKey, "YOUR-KEY": publicKey, "PATH": path, "FILE": path,
                            "NAME": "bob", "URL": "http://127.0.0.1:9"]
        let addresses = ["HOST:PORT": "127.0.0.1:9", "IPv4:PORT": "127.0.0.1:9"]
        var lists: [[String]] = [[]]
        for word in words.dropFirst() {
            var word = word
            for ellipsis in ["…", "..."] where word.hasSuffix(ellipsis) { word = String(word.dropLast(ellipsis.count)) }
            if word.isEmpty { continue }
            word = placeholders[word] ?? word
            for (placeholder, value) in addresses { word = word.replacingOccurrences(of: placeholder, with: value) }
            let alternatives = !word.hasPrefix("-") && word.contains("|") ? word.split(separator: "|").map(String.init) : [word]
            lists = lists.flatMap { list in alternatives.map { list + [$0] } }
        }
        return lists
    }

    /// Runs the binary on `arguments` up to the end of parsing and validation.
    func parse(_ arguments: [String]) async throws -> (status: Int32, output: String) {
        let executable = thaliNodeExecutable
        return try await Task.detached {
            try ChildProcess.run(executable, arguments, environment: ["THALI_NODE_PARSE_ONLY": "1"], timeout: .seconds(20))
        }.value
    }

    @Test("every thali-node command line of README.md and spec/ parses with the binary")
    func documentedCommandLinesParse() async throws {
        let root = PackagePaths.root()
        let files = ["README.md"] + (try FileManager.default.contentsOfDirectory(atPath: root + "/spec"))
            .filter { $0.hasSuffix(".md") }.sorted().map { "spec/" + $0 }
        let path = root + "/README.md"
        let key = randomPublicKey()
        var checked = 0
        for file in files {
            let text = try String(contentsOfFile: root + "/" + file, encoding: .utf8)
            for line in Self.commandLines(in: text) {
                // `thali-node --home DIR` alone names the program with a data directory (an adapter command), no command.
                for arguments in Self.argumentLists(for: line, publicKey: key, path: path) where arguments.first != "--home" || arguments.count > 2 {
                    var result = try await parse(arguments)
                    // Prose names a command without its arguments ("checked by `thali-node conformance
                    // beacons`"): then the command must exist.
                    if result.status != 0 && result.output.contains("Missing expected argument") {
                        result = try await parse(arguments + ["--help"])
                    }
                    #expect(result.status == 0, "\(file): `\(line)` as \(arguments): \(result.output)")
                    checked += 1
                }
            }
        }
        #expect(checked >= 25, "only \(checked) command lines found")
    }

    func thaliNode(_ arguments: [String]) async throws -> (status: Int32, output: String) {
        let executable = thaliNodeExecutable
        return try await Task.detached { try ChildProcess.run(executable, arguments, timeout: .seconds(20)) }.value
    }

    @Test("a mistyped subcommand or option gets the nearest one, exit 64")
    func suggestions() async throws {
        let temporary = TemporaryHome("suggest")
        let subcommand = try await thaliNode(["contcts", "list", "--home", temporary.home.path])
        #expect(subcommand.status == 64, "\(subcommand.output)")
        #expect(subcommand.output == "error: unknown command 'contcts' for `thali-node`; did you mean 'contacts'?\n", "\(subcommand.output)")
        let nested = try await thaliNode(["identity", "shwo"])
        #expect(nested.output.contains("unknown command 'shwo' for `thali-node identity`; did you mean 'show'?"), "\(nested.output)")
        let option = try await thaliNode(["run", "--adress", "127.0.0.1", "--home", temporary.home.path])
        #expect(option.status == 64, "\(option.output)")
        #expect(option.output.contains("Unknown option '--adress'. Did you mean '--address'?"), "\(option.output)")
        #expect(!option.output.contains("bluetooth"), "\(option.output)")
        #expect(!FileManager.default.fileExists(atPath: temporary.home.path))
    }

    @Test("add, remove, config init and conformance beacons print JSON with --json; config.json ends with a newline")
    func jsonEverywhere() async throws {
        let temporary = TemporaryHome("json")
        let home = temporary.home.path
        let key = randomPublicKey()
        let added = try await thaliNode(["contacts", "add", "bob", key, "--json", "--home", home])
        let contact = try JSONSerialization.jsonObject(with: Data(added.output.utf8)) as? [String: Any]
        #expect(contact?["public_key"] as? String == key, "\(added.output)")
        let written = try await thaliNode(["config", "init", "--json", "--home", home])
        let configuration = try JSONSerialization.jsonObject(with: Data(written.output.utf8)) as? [String: Any]
        #expect(configuration?["configuration_file"] as? String == temporary.home.configurationPath, "\(written.output)")
        #expect(try Data(contentsOf: URL(fileURLWithPath: temporary.home.configurationPath)).last == UInt8(ascii: "\n"))
        let vectors = PackagePaths.root() + "/spec/vectors"
        let file = try #require(try FileManager.default.contentsOfDirectory(atPath: vectors).first { $0.hasSuffix(".json") })
        let checked = try await thaliNode(["conformance", "beacons", "--json", vectors + "/" + file])
        let report = try JSONSerialization.jsonObject(with: Data(checked.output.utf8)) as? [String: Any]
        #expect(report?["failed"] as? Int == 0 && (report?["passed"] as? Int ?? 0) > 0, "\(checked.output)")
        let listed = try await thaliNode(["contacts", "list", "--json", "--home", home])
        #expect(listed.output.contains("\"public_key\""), "\(listed.output)")
        #expect(!listed.output.contains("publicKey"), "\(listed.output)")
        // `thali-node 0.1.0 (commit abcdef1)`, the commit when built from a checkout; then the output version.
        let version = try await thaliNode(["--version"])
        let lines = version.output.split(separator: "\n", omittingEmptySubsequences: false)
        #expect(version.status == 0 && lines.count == 3 && lines[2].isEmpty, "\(version.output)")
        let match = try? #/thali-node \d+\.\d+\.\d+( \(commit [0-9a-f]{7,}(?:-dirty)?\))?/#.wholeMatch(in: String(lines[0]))
        let fromCheckout = FileManager.default.fileExists(atPath: PackagePaths.root() + "/.git")
        #expect(match != nil && (match?.output.1 != nil) == fromCheckout, "\(version.output)")
        #expect(lines.count > 1 && lines[1] == "JSON output version 2", "\(version.output)")
        let duplicate = try await thaliNode(["contacts", "add", "bobby", key, "--home", home])
        #expect(duplicate.output.contains("this public key is already contact \"bob\"'s"), "\(duplicate.output)")
        #expect(!duplicate.output.contains("invalid public key"), "\(duplicate.output)")
    }
}
