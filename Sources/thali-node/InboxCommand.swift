import ArgumentParser
import Foundation
import ThaliNodeCore

/// `thali-node inbox [list|remove]`: what arrived.
struct Inbox: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List received items, or delete one.",
        subcommands: [List.self, Remove.self], defaultSubcommand: List.self)

    /// `thali-node inbox [list]`.
    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List received items.",
            discussion: "A received file deleted by hand is listed as missing until `thali-node inbox remove ID`.")
        @OptionGroup var options: NodeOptions
        @Flag(help: "Print JSON for scripts.") var json = false

        struct Entry: Encodable {
            let id: String
            let from: String
            let fromPublicKey: String
            let kind: String
            let text: String?
            let fileName: String?
            let filePath: String?
            let missing: Bool?
            let size: Int64
            let sha256: String
            let created: String
            let received: String
        }

        func run() throws {
            let (store, _) = try options.openExistingStore()
            let entries = try (store?.inbox() ?? []).map {
                Entry(id: $0.itemID.uuidString, from: $0.fromContact, fromPublicKey: $0.fromPublicKey, kind: $0.kind.rawValue,
                      text: $0.text, fileName: $0.fileName, filePath: $0.filePath,
                      missing: $0.filePath.map { !FileManager.default.fileExists(atPath: $0) }, size: $0.size,
                      sha256: hex($0.sha256), created: formatDate($0.createdAt), received: formatDate($0.receivedAt))
            }
            if json { return try printJSON(entries) }
            if entries.isEmpty { print("inbox is empty") }
            for entry in entries {
                // The text and names came from another peer: escaped, so they cannot drive the terminal.
                let place = entry.missing == true ? "missing: deleted from \(entry.filePath ?? "?")" : "at \(entry.filePath ?? "?")"
                let what = entry.text.map { "\"\($0)\"" } ?? "\(entry.fileName ?? "?") (\(entry.size) bytes) \(place)"
                print(TerminalText.escaped("\(entry.id.prefix(8))  \(entry.received)  from \(entry.from)  \(what)"))
            }
        }
    }

    /// `thali-node inbox remove ID...`: deletes received items and their files.
    struct Remove: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Delete received items: the entry and, for a file, the file.",
            discussion: "ID: the item's id or its first digits (at least 4; `inbox` shows 8).",
            aliases: ["rm", "delete"])
        @OptionGroup var options: NodeOptions
        @Argument(help: ArgumentHelp("The items' ids, or their first digits.", valueName: "id")) var ids: [String]
        @Flag(help: "Print the removed items as JSON.") var json = false

        func run() throws {
            let (existing, _) = try options.openExistingStore()
            guard let store = existing else { throw NodeError.unknownItem(ids.first ?? "", box: "inbox") }
            let removed = try store.removeInboxItems(matching: ids)
            if json {
                return try printJSON(removed.map { RemovedItem(id: $0.itemID.uuidString, kind: $0.kind.rawValue, fileName: $0.fileName, size: $0.size) })
            }
            for item in removed {
                print(TerminalText.escaped("removed \(item.itemID.uuidString.prefix(8)) from \(item.fromContact) "
                                           + "(\(item.kind == .text ? "a text" : "file \(item.fileName ?? "?")"), \(item.size) bytes)"))
            }
        }
    }
}

/// An item `outbox remove` or `inbox remove` removed, as `--json` prints it.
struct RemovedItem: Encodable {
    let id: String
    let kind: String
    let fileName: String?
    let size: Int64
}
