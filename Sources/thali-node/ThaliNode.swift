import ArgumentParser
import Foundation

/// `thali-node`: the command-line Thali peer, its demo, benchmarks and conformance tools.
@main
struct ThaliNode: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "thali-node",
        abstract: "A Thali peer: private discovery of contacts and authenticated delivery over local networks.",
        subcommands: [Demo.self, Conformance.self, Bench.self, Discover.self, Identity.self, Contacts.self, Send.self, Outbox.self, Inbox.self, Config.self, Run.self]
    )

    /// Parses and runs the command. Every error is one line on standard error (`error: ...`, control
    /// characters escaped) and a non-zero exit; help and version requests print as usual.
    static func main() async {
        let arguments: [String]
        do {
            arguments = CommandLineArguments.normalized(try CommandLineArguments.validatedUTF8())
        } catch {
            report(error)
        }
        do {
            var command = try parseAsRoot(arguments)
            if var asyncCommand = command as? AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
        } catch {
            report(error)
        }
    }

    /// Prints `error` as one line and exits with its code (help and clean exits as ArgumentParser does).
    static func report(_ error: any Error) -> Never {
        let code = exitCode(for: error)
        if code == .success || error is CleanExit { exit(withError: error) }
        let message = message(for: error)
        // `ExitCode(n)` carries no message: the command has said what it had to.
        if error is ExitCode || message.isEmpty { Foundation.exit(code.rawValue) }
        FileHandle.standardError.write(Data(("error: " + CommandLineArguments.oneLine(message) + "\n").utf8))
        Foundation.exit(code.rawValue)
    }
}

/// What the command line gives, made safe and regular before ArgumentParser sees it.
enum CommandLineArguments {
    /// An argument that is not valid UTF-8 (texts, names and paths must be).
    struct InvalidUTF8: Error, CustomStringConvertible {
        let index: Int
        let bytes: [UInt8]
        var description: String {
            "argument \(index) is not valid UTF-8 (\(bytes.prefix(32).map { String(format: "%02x", $0) }.joined())\(bytes.count > 32 ? "…" : "")); texts, names and paths must be UTF-8"
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

    /// `text` on one line: newlines and other control characters escaped.
    static func oneLine(_ text: String) -> String {
        var result = ""
        for scalar in text.trimmingCharacters(in: .whitespacesAndNewlines).unicodeScalars {
            switch scalar {
            case "\n": result += "\\n"
            case "\r": result += "\\r"
            case "\t": result += "\\t"
            default:
                if scalar.properties.generalCategory == .control {
                    result += String(format: "\\u{%X}", scalar.value)
                } else {
                    result.unicodeScalars.append(scalar)
                }
            }
        }
        return result
    }
}

/// Conformance tools other implementers run against their own wire formats.
struct Conformance: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Check wire formats against the conformance vectors, or probe another implementation's endpoint.",
        subcommands: [ConformanceBeacons.self, ConformanceProbeCommand.self, ConformancePeerCommand.self]
    )
}

/// Benchmarks that print figures (release builds only give meaningful numbers).
struct Bench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Measure the speed of the suite's layers.",
        subcommands: [BenchBeacons.self, BenchSSDP.self, BenchMux.self, BenchTLS.self, BenchBLE.self, BenchDelivery.self, BenchCrowd.self, BenchFlood.self]
    )
}
