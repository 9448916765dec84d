import ArgumentParser
import Foundation
import ThaliBeacons
import ThaliNodeCore
import ThaliSupport

/// Options every command that touches the data directory shares.
struct NodeOptions: ParsableArguments {
    @Option(name: .long, help: ArgumentHelp("The data directory (default: $THALI_HOME, else ~/.thali).", valueName: "dir"))
    var home: String?

    func validate() throws {
        if home?.isEmpty == true {
            throw ValidationError("--home is empty; give a directory, or leave the option out to use $THALI_HOME or ~/.thali")
        }
    }

    /// The resolved data directory.
    var nodeHome: NodeHome { NodeHome.resolve(explicit: home) }

    /// The data directory, checked: an error (never "empty") if it exists but this user cannot use it
    /// (`writing`: change it), and made private with a notice on standard error if others could read it.
    func checkedHome(writing: Bool) throws -> NodeHome {
        let home = nodeHome
        try home.checkUsable(writing: writing)
        for notice in home.makePrivate() { printNotice(notice) }
        return home
    }

    /// Loads the configuration (typed errors for an unreadable or invalid file) and opens the store,
    /// creating the data directory and the database if needed: for commands that change the node.
    func openStore() throws -> (NodeStore, NodeConfiguration) {
        let home = try checkedHome(writing: true)
        let configuration = try NodeConfiguration.load(home: home)
        return (Self.reportingInterruptedCopies(try NodeStore(home: home, limits: configuration.limits)), configuration)
    }

    /// `store`, once the copies an interrupted `send --file` left in the outbox are gone, each named in
    /// a notice (they are never queued, and they can be large).
    private static func reportingInterruptedCopies(_ store: NodeStore) -> NodeStore {
        for copy in store.removeInterruptedCopies() {
            printNotice("removed outbox/\(copy.name) (\(ByteCount.format(Int64(clamping: copy.bytes)))): the partial copy of a file "
                        + "whose `send --file` was interrupted; nothing of it was queued")
        }
        return store
    }

    /// Like ``openStore()``, but creates nothing: the store is nil when the data directory has no
    /// database yet (then there is nothing to read). For read-only commands, and for commands whose
    /// first step is looking something up.
    func openExistingStore() throws -> (NodeStore?, NodeConfiguration) {
        let home = try checkedHome(writing: false)
        let configuration = try NodeConfiguration.load(home: home)
        guard FileManager.default.fileExists(atPath: home.databasePath) else { return (nil, configuration) }
        // SQLite writes beside the database even to read it (WAL): say so in words, not "SQLite error 14".
        try home.checkUsable(writing: true)
        return (Self.reportingInterruptedCopies(try NodeStore(home: home, limits: configuration.limits)), configuration)
    }
}

/// A line on standard error that is no error: `notice: ...`.
func printNotice(_ text: String) {
    StandardStream.error.write("notice: " + CommandLineArguments.oneLine(text) + "\n")
}

/// Asks `question` on the terminal and returns whether the answer is yes; false at once (asking nothing)
/// when standard input or error is not a terminal, as in scripts.
func confirm(_ question: String) -> Bool {
    guard isatty(0) == 1, isatty(2) == 1 else { return false }
    StandardStream.error.write(question + " [y/N] ")
    guard let answer = readLine() else { return false }
    return ["y", "yes"].contains(answer.trimmingCharacters(in: .whitespaces).lowercased())
}

/// Durations on the command line: a number with an optional unit `s`, `m`, `h` or `d` (seconds if none).
struct DurationArgument: ExpressibleByArgument, Sendable {
    /// The duration in seconds.
    let seconds: Int

    init?(argument: String) {
        let units: [Character: Int] = ["s": 1, "m": 60, "h": 3600, "d": 86400]
        var text = argument.trimmingCharacters(in: .whitespaces)
        var multiplier = 1
        if let last = text.last, let unit = units[last] {
            multiplier = unit
            text.removeLast()
        }
        guard let value = Int(text), value > 0, value <= Int(Int32.max) / multiplier else { return nil }
        seconds = value * multiplier
    }

    static var defaultCompletionKind: CompletionKind { .default }
}

/// Prints JSON for scripts: snake_case keys (as `run --json`'s events; see spec/node.md, "JSON output"),
/// sorted, one document (an empty array as `[]`).
func printJSON(_ value: some Encodable) throws {
    let encoder = JSONEncoder()
    encoder.keyEncodingStrategy = .convertToSnakeCase
    encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
    let text = String(decoding: try encoder.encode(value), as: UTF8.self)
    // Foundation pretty-prints an empty array as "[", a blank line and "]", at any depth.
    print(text.replacing(/\[\s*\n\s*\n\s*\]/, with: "[]"))
}

/// `text` (a Swift name such as `datagramsReceived`) in the JSON output's snake_case (`datagrams_received`).
func snakeCased(_ text: String) -> String {
    var result = ""
    for character in text {
        if character.isUppercase {
            if !result.isEmpty { result.append("_") }
            result += character.lowercased()
        } else {
            result.append(character)
        }
    }
    return result
}

/// Dates for people: ISO 8601 in UTC.
func formatDate(_ date: Date) -> String {
    let formatter = ISO8601DateFormatter()
    formatter.formatOptions = [.withInternetDateTime]
    return formatter.string(from: date)
}

/// Lowercase hex of `data`.
func hex(_ data: Data) -> String { Hex.encode(data) }
