import ArgumentParser
import Foundation
import ThaliBeacons
import ThaliNodeCore

/// Options every command that touches the data directory shares.
struct NodeOptions: ParsableArguments {
    @Option(name: .long, help: ArgumentHelp("The data directory (default: $THALI_HOME, else ~/.thali).", valueName: "dir"))
    var home: String?

    /// The resolved data directory.
    var nodeHome: NodeHome { NodeHome.resolve(explicit: home) }

    /// Loads the configuration (typed errors for an unreadable or invalid file) and opens the store,
    /// creating the data directory and the database if needed: for commands that change the node.
    func openStore() throws -> (NodeStore, NodeConfiguration) {
        let home = nodeHome
        let configuration = try NodeConfiguration.load(home: home)
        return (try NodeStore(home: home, limits: configuration.limits), configuration)
    }

    /// Like ``openStore()``, but creates nothing: the store is nil when the data directory has no
    /// database yet (then there is nothing to read). For read-only commands, and for commands whose
    /// first step is looking something up.
    func openExistingStore() throws -> (NodeStore?, NodeConfiguration) {
        let home = nodeHome
        let configuration = try NodeConfiguration.load(home: home)
        guard FileManager.default.fileExists(atPath: home.databasePath) else { return (nil, configuration) }
        return (try NodeStore(home: home, limits: configuration.limits), configuration)
    }
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

/// Prints JSON for scripts: sorted keys, one document (an empty array as `[]`).
func printJSON(_ value: some Encodable) throws {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
    let text = String(decoding: try encoder.encode(value), as: UTF8.self)
    // Foundation pretty-prints an empty array as "[", a blank line and "]".
    print(text.filter { !$0.isWhitespace } == "[]" ? "[]" : text)
}

/// Dates for people: ISO 8601 in UTC.
func formatMilliseconds(_ milliseconds: Int64) -> String {
    let formatter = ISO8601DateFormatter()
    formatter.formatOptions = [.withInternetDateTime]
    return formatter.string(from: Date(timeIntervalSince1970: Double(milliseconds) / 1000))
}

/// Lowercase hex of `data`.
func hex(_ data: Data) -> String { Hex.encode(data) }
