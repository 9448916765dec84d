import ArgumentParser
import Foundation
import ThaliNodeCore

/// `thali-node contacts add|list|remove`: the people this node delivers to and accepts deliveries from.
struct Contacts: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Manage contacts: the peers this node delivers to and accepts deliveries from.",
        subcommands: [Add.self, List.self, Remove.self], defaultSubcommand: List.self
    )

    struct Add: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Add a contact by name and public key.")
        @OptionGroup var options: NodeOptions
        @Argument(help: "A unique name for the contact.") var name: String
        @Argument(help: "The contact's secp256k1 public key (SEC1, hex or base64).") var publicKey: String
        @Flag(help: "Print JSON for scripts.") var json = false

        func validate() throws {
            // `contacts add KEY NAME`: the key in the name's place said "longer than 64 bytes".
            if (try? ContactKey.parse(name)) != nil && (try? ContactKey.parse(publicKey)) == nil {
                throw ValidationError("'\(name.prefix(16))…' is a public key and '\(publicKey)' is not: the name comes first, as `contacts add NAME KEY`")
            }
        }

        func run() throws {
            let (store, _) = try options.openStore()
            // Our own key is no contact; without an identity yet there is nothing to compare with.
            let own = try? NodeIdentity.load(from: options.nodeHome).publicKey
            let contact = try store.addContact(name: name, publicKey: publicKey, ownKey: own)
            if json { return try printJSON(List.Entry(contact)) }
            print("added contact \(contact.name) (\(contact.publicKey))")
        }
    }

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List contacts.")
        @OptionGroup var options: NodeOptions
        @Flag(help: "Print JSON for scripts.") var json = false

        struct Entry: Encodable {
            let name: String
            let publicKey: String
            let added: String

            init(_ contact: Contact) {
                (name, publicKey, added) = (contact.name, contact.publicKey, formatDate(contact.addedAt))
            }
        }

        func run() throws {
            let (store, _) = try options.openExistingStore()
            let entries = try (store?.contacts() ?? []).map(Entry.init)
            if json { return try printJSON(entries) }
            if entries.isEmpty { print("no contacts; add one with `thali-node contacts add NAME PUBLIC-KEY`") }
            for entry in entries { print("\(entry.name)\t\(entry.publicKey)") }
        }
    }

    struct Remove: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Remove a contact (received items stay in the inbox).",
            discussion: """
                A contact with items still queued for it is removed only with --force (or a yes on the terminal), \
                which deletes those items; never while a `thali-node run` uses the data directory.
                """)
        @OptionGroup var options: NodeOptions
        @Argument(help: "The contact's name.") var name: String
        @Flag(help: "Also delete the items queued for the contact.") var force = false
        @Flag(help: "Print JSON for scripts.") var json = false

        struct Removed: Encodable {
            let name: String
            let deletedItems: [String]
            let deletedBytes: Int64
        }

        func run() throws {
            guard let store = try options.openExistingStore().0 else { throw NodeError.unknownContact(name) }
            let contact = try store.contact(named: name)
            let queued = try store.outbox().filter { $0.contactID == contact.id }
            if !queued.isEmpty, let pid = RunLock.holder(of: store.home) {
                // The run would go on sending an item whose record is gone.
                throw NodeError.homeInUse(path: store.home.path, pid: pid)
            }
            var deleting = force
            if !queued.isEmpty && !force {
                let bytes = queued.reduce(0) { $0 + $1.size }
                deleting = confirm("Remove \(name) and delete \(queued.count) queued item\(queued.count == 1 ? "" : "s") (\(ByteCount.format(bytes)))?")
            }
            let deleted = try store.removeContact(named: name, deletingQueuedItems: deleting)
            let removed = Removed(name: name, deletedItems: deleted.map(\.id.uuidString),
                                  deletedBytes: deleted.reduce(0) { $0 + $1.size })
            if json { return try printJSON(removed) }
            print("removed contact \(name)" + (deleted.isEmpty ? ""
                : "; deleted \(deleted.count) queued item\(deleted.count == 1 ? "" : "s") (\(ByteCount.format(removed.deletedBytes)))"))
        }
    }
}
