import ArgumentParser
import Foundation
import Synchronization
import ThaliNodeCore

/// `thali-node send CONTACT TEXT | --file PATH`: queue an item for store-and-forward delivery.
struct Send: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Queue a text or a file for a contact; it is delivered when the contact is reachable.")

    @OptionGroup var options: NodeOptions
    @Argument(help: "The contact's name.") var contact: String
    @Argument(help: "The text to send (or use --file).") var text: String?
    @Option(help: ArgumentHelp(
        "A file to send instead of a text: a regular file, or with --name a pipe such as <(command) or /dev/stdin (read up to the configuration's maxItemBytes). Named pipes (FIFOs) and devices are refused.",
        valueName: "path"))
    var file: String?
    @Option(help: ArgumentHelp("The name the contact receives the file under (default: the file's own name; required for a pipe).", valueName: "name"))
    var name: String?
    @Option(help: ArgumentHelp(
        "Drop the item if not delivered within this time: a number with s, m, h or d (default: the configuration's defaultItemExpirySeconds).",
        valueName: "duration"))
    var expiresIn: DurationArgument?
    @Flag(help: "Print the queued item as JSON.") var json = false

    func validate() throws {
        if (text == nil) == (file == nil) { throw ValidationError("give either a TEXT or --file PATH") }
        if name != nil && file == nil { throw ValidationError("--name names a file: give --file PATH too") }
    }

    struct Queued: Encodable {
        let id: String
        let contact: String
        let kind: String
        let fileName: String?
        let size: Int64
        let sha256: String
        let expires: String
    }

    func run() throws {
        // Only a node with an identity can ever deliver what it queues: say so now, not never.
        _ = try NodeIdentity.load(from: options.nodeHome)
        // Nothing is created for a contact that does not exist.
        let (existing, configuration) = try options.openExistingStore()
        guard let store = existing else { throw NodeError.unknownContact(contact) }
        let now = Date()
        let expiry = now.addingTimeInterval(Double(expiresIn?.seconds ?? configuration.defaultItemExpirySeconds))
        let item: OutboxItem
        if let file {
            let progress = CopyProgress()
            defer { progress.finish() }
            item = try store.enqueueFile(at: file, to: contact, name: name, expiresAt: expiry, now: now, progress: progress.update)
        } else {
            do {
                item = try store.enqueueText(text ?? "", to: contact, expiresAt: expiry, now: now)
            } catch NodeError.itemTooLarge(let size, let limit) {
                throw CommandFailure(exitCode: .dataError, message: "the text is \(size) bytes, over this node's limit for texts of \(limit) "
                                     + "(maxTextBytes in config.json): save it to a file and send that with --file")
            }
        }
        Events.nudgeRunningNode(on: options.nodeHome)
        let queued = Queued(id: item.id.uuidString, contact: contact, kind: item.kind.rawValue, fileName: item.fileName, size: item.size,
                            sha256: hex(item.sha256), expires: formatDate(item.expiresAt))
        if json { return try printJSON(queued) }
        print("queued \(queued.kind) \(queued.id) for \(contact) (\(queued.size) bytes, expires \(queued.expires))")
    }
}

/// `thali-node outbox [list|remove]`: what is waiting for delivery.
struct Outbox: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List queued items not yet delivered, or cancel one.",
        subcommands: [List.self, Remove.self], defaultSubcommand: List.self)

    /// `thali-node outbox remove ID...`: cancels queued items.
    struct Remove: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Cancel queued items: they are never offered again, and a file's copy is deleted.",
            discussion: "ID: the item's id or its first digits (at least 4; `run` and `outbox` show 8). --refused removes every item its receiver refused.",
            aliases: ["rm", "cancel"])
        @OptionGroup var options: NodeOptions
        @Argument(help: ArgumentHelp("The items' ids, or their first digits.", valueName: "id")) var ids: [String] = []
        @Flag(help: "Remove every item its receiver refused.") var refused = false
        @Flag(help: "Print the removed items as JSON.") var json = false

        func validate() throws {
            if ids.isEmpty && !refused { throw ValidationError("give the id of an item to remove (see `thali-node outbox`), or --refused") }
        }

        func run() throws {
            let (existing, _) = try options.openExistingStore()
            guard let store = existing else { throw NodeError.unknownItem(ids.first ?? "", box: "outbox") }
            var wanted = ids
            if refused { wanted += try store.outbox().filter { $0.state == .refused }.map(\.id.uuidString) }
            let removed = try store.removeOutboxItems(matching: wanted)
            if json { return try printJSON(removed.map { RemovedItem(id: $0.id.uuidString, kind: $0.kind.rawValue, fileName: $0.fileName, size: $0.size) }) }
            if removed.isEmpty { print("nothing to remove") }
            for item in removed {
                print(TerminalText.escaped("removed \(item.id.uuidString.prefix(8)) (\(item.kind == .text ? "a text" : "file \(item.fileName ?? "?")"), \(item.size) bytes)"))
            }
        }
    }
}

extension Outbox {
    /// `thali-node outbox [list]`.
    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List queued items not yet delivered.",
            discussion: "State: pending (offered when the contact is reachable), refused (by the receiver; kept to be seen; `outbox remove --refused` clears them), or expired (never offered again; `run` deletes it).")
        @OptionGroup var options: NodeOptions
        @Flag(help: "Print JSON for scripts.") var json = false

        struct Entry: Encodable {
            let id: String
            let contact: String
            let kind: String
            let text: String?
            let fileName: String?
            let size: Int64
            let sha256: String
            let acknowledgedBytes: Int64
            let state: String
            let created: String
            let expires: String
            let problem: String?
        }

        func run() throws {
            let (store, _) = try options.openExistingStore()
            let names = Dictionary(uniqueKeysWithValues: try (store?.contacts() ?? []).compactMap { c in c.id.map { ($0, c.name) } })
            let now = Date()
            let entries = try (store?.outbox() ?? []).map {
                // An expired item is no longer offered; `run` drops it at its next sweep.
                let state = $0.expiresAt <= now ? "expired" : $0.state.rawValue
                return Entry(id: $0.id.uuidString, contact: names[$0.contactID] ?? "?", kind: $0.kind.rawValue, text: $0.text,
                             fileName: $0.fileName, size: $0.size, sha256: hex($0.sha256), acknowledgedBytes: $0.acknowledgedBytes, state: state,
                             created: formatDate($0.createdAt), expires: formatDate($0.expiresAt), problem: $0.lastError)
            }
            if json { return try printJSON(entries) }
            if entries.isEmpty { print("outbox is empty") }
            for entry in entries {
                let what = entry.text.map { "\"\($0)\"" } ?? "\(entry.fileName ?? "?") (\(entry.size) bytes)"
                print(TerminalText.escaped("\(entry.id.prefix(8))  \(entry.created)  to \(entry.contact)  \(entry.state)  \(what)  expires \(entry.expires)"
                                           + (entry.problem.map { "  [\($0)]" } ?? "")))
            }
        }
    }
}

/// `send --file`'s progress while it copies a large file into the outbox, redrawn in place on standard
/// error when that is a terminal (a script sees nothing of it).
final class CopyProgress: Sendable {
    /// How often the line is redrawn.
    static let interval: TimeInterval = 0.2
    private let start = Date()
    private let state = Mutex<(lastShown: Date?, shown: Bool)>((nil, false))
    private let enabled = isatty(STDERR_FILENO) == 1

    /// Shows `copied` of `total` bytes, at most every ``interval`` and only after the first second.
    func update(_ copied: UInt64, _ total: UInt64?) {
        guard enabled else { return }
        let now = Date()
        let seconds = now.timeIntervalSince(start)
        let due = state.withLock { state -> Bool in
            guard seconds >= 1, now.timeIntervalSince(state.lastShown ?? .distantPast) >= Self.interval else { return false }
            state = (now, true)
            return true
        }
        guard due else { return }
        var line = "copying into the outbox: \(ByteCount.format(Int64(clamping: copied)))"
        if let total, total > 0 { line += " of \(ByteCount.format(Int64(clamping: total))) (\(copied * 100 / total) %)" }
        line += ", \(ByteCount.format(Int64(Double(copied) / seconds)))/s"
        StandardStream.error.write("\r\u{1B}[K" + line)
    }

    /// Clears the line, if one was shown.
    func finish() {
        if state.withLock({ $0.shown }) { StandardStream.error.write("\r\u{1B}[K") }
    }
}
