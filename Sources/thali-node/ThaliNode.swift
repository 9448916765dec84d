import ArgumentParser
import Foundation
import NIOCore
import ThaliBeacons
import ThaliNodeBenchmarks
import ThaliNodeCore
import ThaliSSDP
import ThaliSupport

/// `thali-node`: the command-line Thali peer, its demo, benchmarks and conformance tools.
@main
struct ThaliNode: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "thali-node",
        abstract: "A Thali peer: private discovery of contacts and authenticated delivery over local networks.",
        version: Version.text,
        subcommands: [Demo.self, Conformance.self, Bench.self, Discover.self, Identity.self, Contacts.self, Send.self, Outbox.self, Inbox.self, Events.self, Config.self, Run.self]
    )

    /// Parses and runs the command. Every error is one line on standard error (`error: ...`, control
    /// characters escaped) and a non-zero exit; help and version requests print as usual.
    static func main() async {
        // Everything this process creates in a data directory is private, whatever the user's umask.
        umask(0o077)
        // A closed pipe is a write error to handle (``StandardStream``), never a signal that kills the
        // process mid-write: `run | head -1` stops the node cleanly.
        signal(SIGPIPE, SIG_IGN)
        let arguments: [String]
        do {
            arguments = CommandLineArguments.normalized(try CommandLineArguments.validatedUTF8())
        } catch {
            report(error)
        }
        if let unknown = CommandLineArguments.unknownSubcommand(in: arguments, of: ThaliNode.self) {
            StandardStream.error.write("error: " + CommandLineArguments.oneLine(unknown) + "\n")
            Foundation.exit(ExitStatus.usage.rawValue)
        }
        do {
            var command = try parseAsRoot(arguments)
            // Test aid: checks that a documented command line parses (spec and README against the binary).
            if ProcessInfo.processInfo.environment[Self.parseOnlyEnvironmentKey] != nil { Foundation.exit(0) }
            if var asyncCommand = command as? AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
        } catch {
            report(error)
        }
    }

    /// What `error` means to a user: words for the system, Foundation, SQLite and NIO errors a command
    /// can meet (``SystemErrorText``), ArgumentParser's own text for the rest.
    static func userMessage(for error: any Error) -> String {
        if case SSDPDiscoveryService.StartError.noInterface(let address) = error {
            return "no local interface has the address \(address); give one of this machine's IPv4 addresses (see `ip -4 addr`)"
        }
        if case SSDPDiscoveryService.StartError.invalidAddress(let address) = error {
            return "\"\(address)\" cannot be used: the interface address must be one of this machine's IPv4 addresses, "
                + "and the SSDP group (ssdpMulticastAddress in config.json) an IPv4 multicast address (224.0.0.0 to 239.255.255.255)"
        }
        if case SocketAddressError.failedToParseIPString(let text) = error {
            return "\"\(text)\" is not an IPv4 address (check --address, --ssdp-group and config.json's ssdpMulticastAddress)"
        }
        let nsError = error as NSError
        if let failure = error as? CommandFailure { return failure.message }
        if error is NodeError || error is CancellationError || error is IOError || NodeStore.isDatabaseError(error)
            || nsError.domain == NSCocoaErrorDomain || nsError.domain == NSPOSIXErrorDomain {
            return SystemErrorText.describe(error)
        }
        return message(for: error)
    }

    /// The version of the `--json` output's schema (spec/node.md, "JSON output"): a change that renames or
    /// removes a key is a new version. 2: snake_case keys everywhere (issue 26).
    static let jsonOutputVersion = 2

    /// Names a variable in the environment that makes the binary stop after parsing its arguments
    /// (exit 0 if they parse): the tests check every command line of the README and the spec with it.
    static let parseOnlyEnvironmentKey = "THALI_NODE_PARSE_ONLY"

    /// Prints `error` as one line and exits with its code (``ExitStatus``; help and clean exits as
    /// ArgumentParser does).
    static func report(_ error: any Error) -> Never {
        let parserCode = exitCode(for: error)
        if error is CleanExit || (parserCode == .success && !(error is CommandFailure)) { exit(withError: error) }
        // `ExitCode(n)` carries no message: the command has said what it had to.
        if let code = error as? ExitCode { Foundation.exit(code.rawValue) }
        let status = ExitStatus.of(error)?.rawValue ?? (parserCode == .validationFailure ? ExitStatus.usage.rawValue : parserCode.rawValue)
        let message = userMessage(for: error)
        if !message.isEmpty { StandardStream.error.write("error: " + CommandLineArguments.oneLine(message) + "\n") }
        Foundation.exit(status)
    }
}

/// What the command line gives, made safe and regular before ArgumentParser sees it.
enum CommandLineArguments {
    /// An argument that is not valid UTF-8 (texts, names and paths must be).
    struct InvalidUTF8: Error, CustomStringConvertible {
        let index: Int
        let bytes: [UInt8]
        var description: String {
            "argument \(index) is not valid UTF-8 (\(Hex.encode(bytes.prefix(32)))\(bytes.count > 32 ? "…" : "")); texts, names and paths must be UTF-8"
        }
    }

    /// The arguments after the program name, refusing any that is not valid UTF-8 (Swift would replace
    /// the bad bytes with U+FFFD silently, and a text would be delivered changed).
    static func validatedUTF8() throws -> [String] {
        var arguments: [String] = []
        for index in 1..<Int(CommandLine.argc) {
            guard let pointer = CommandLine.unsafeArgv[index] else { continue }
            let bytes = Array(UnsafeBufferPointer(start: UnsafeRawPointer(pointer).assumingMemoryBound(to: UInt8.self),
                                                  count: strlen(pointer)))
            guard let text = String(validating: bytes, as: UTF8.self) else { throw InvalidUTF8(index: index, bytes: bytes) }
            arguments.append(text)
        }
        return arguments
    }

    /// Options every command shares, accepted before the subcommand too: moved after it.
    static let globalOptionsWithValue: Set<String> = ["--home"]

    /// `thali-node --home DIR contacts list` becomes `thali-node contacts list --home DIR`.
    static func normalized(_ arguments: [String]) -> [String] {
        var leading: [String] = []
        var rest = arguments[...]
        while let first = rest.first {
            if globalOptionsWithValue.contains(first), rest.count >= 2 {
                leading += rest.prefix(2)
                rest = rest.dropFirst(2)
            } else if let name = first.split(separator: "=", maxSplits: 1).first.map(String.init),
                      first.contains("="), globalOptionsWithValue.contains(name) {
                leading.append(first)
                rest = rest.dropFirst()
            } else {
                break
            }
        }
        guard !leading.isEmpty else { return arguments }
        var result = Array(rest)
        let terminator = result.firstIndex(of: "--") ?? result.endIndex
        result.insert(contentsOf: leading, at: terminator)
        return result
    }

    /// The complaint about the first word that should name a subcommand and does not, with the closest
    /// name if one is near (as git does): `unknown command 'contcts'; did you mean 'contacts'?`.
    static func unknownSubcommand(in arguments: [String], of root: any ParsableCommand.Type) -> String? {
        var command = root
        var path = [root._commandName]
        for argument in arguments {
            let subcommands = command.configuration.subcommands
            // A group's default subcommand (`contacts` lists) takes no word of its own: a word after the
            // group still names a subcommand, or is a typo of one.
            guard !subcommands.isEmpty, !argument.hasPrefix("-"), argument != "help" else { return nil }
            if let next = subcommands.first(where: { $0._commandName == argument || $0.configuration.aliases.contains(argument) }) {
                command = next
                path.append(argument)
                continue
            }
            let names = subcommands.map { $0._commandName }
            let closest = names.map { ($0, editDistance($0, argument)) }.min { $0.1 < $1.1 }
            let hint = closest.flatMap { $0.1 <= max(2, argument.count / 3) ? "did you mean '\($0.0)'?" : nil }
                ?? "see `\(path.joined(separator: " ")) --help`"
            return "unknown command '\(argument)' for `\(path.joined(separator: " "))`; \(hint)"
        }
        return nil
    }

    /// The Levenshtein distance between `a` and `b` (insertions, deletions, substitutions).
    static func editDistance(_ a: String, _ b: String) -> Int {
        let (a, b) = (Array(a), Array(b))
        var previous = Array(0...b.count)
        for i in 1...max(1, a.count) where !a.isEmpty {
            var current = [i] + Array(repeating: 0, count: b.count)
            for j in stride(from: 1, through: b.count, by: 1) {
                current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1))
            }
            previous = current
        }
        return a.isEmpty ? b.count : previous[b.count]
    }

    /// `text` on one line: newlines and other control characters escaped.
    static func oneLine(_ text: String) -> String {
        TerminalText.escaped(text.trimmingCharacters(in: .whitespacesAndNewlines))
    }
}

/// Text made safe for a terminal: every byte that came from another peer (texts, names, reasons) goes
/// through this before human output, so it cannot clear the screen, retitle the window, move the cursor
/// or overwrite a line. `--json` output carries the raw text (JSON escapes control characters itself).
enum TerminalText {
    /// `text` with newlines, tabs, other control characters (C0, DEL, C1, which start every terminal
    /// escape sequence) and the bidirectional overrides (which reorder what is shown) written as escapes.
    static func escaped(_ text: String) -> String {
        var result = ""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\n": result += "\\n"
            case "\r": result += "\\r"
            case "\t": result += "\\t"
            default:
                if isEscaped(scalar) {
                    result += String(format: "\\u{%X}", scalar.value)
                } else {
                    result.unicodeScalars.append(scalar)
                }
            }
        }
        return result
    }

    private static func isEscaped(_ scalar: Unicode.Scalar) -> Bool {
        scalar.properties.generalCategory == .control || FileNames.hasBidirectionalControl(String(scalar))
    }
}

/// Conformance tools other implementers run against their own wire formats.
struct Conformance: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Check wire formats against the conformance vectors, or probe another implementation's endpoint.",
        subcommands: [ConformanceBeacons.self, ConformanceVectors.self, ConformanceProbeCommand.self, ConformancePeerCommand.self, ConformanceTargetCommand.self, ConformanceBluetoothCommand.self]
    )
}
