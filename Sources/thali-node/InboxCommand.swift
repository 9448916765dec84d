import ArgumentParser
import Foundation
import ThaliNodeCore

/// `thali-node inbox`: what arrived.
struct Inbox: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "List received items.")
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
        let size: Int64
        let sha256: String
        let created: String
        let received: String
    }

    func run() throws {
        let (store, _) = try options.openExistingStore()
        let entries = try (store?.inbox() ?? []).map {
            Entry(id: $0.itemID.uuidString, from: $0.fromContact, fromPublicKey: $0.fromPublicKey, kind: $0.kind.rawValue,
                  text: $0.text, fileName: $0.fileName, filePath: $0.filePath, size: $0.size, sha256: hex($0.sha256),
                  created: formatDate($0.createdAt), received: formatDate($0.receivedAt))
        }
        if json { return try printJSON(entries) }
        if entries.isEmpty { print("inbox is empty") }
        for entry in entries {
            // The text and names came from another peer: escaped, so they cannot drive the terminal.
            let what = entry.text.map { "\"\($0)\"" }
                ?? "\(entry.fileName ?? "?") (\(entry.size) bytes) at \(entry.filePath ?? "?")"
            print(TerminalText.escaped("\(entry.received)  from \(entry.from)  \(what)"))
        }
    }
}
