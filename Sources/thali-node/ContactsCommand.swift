import ArgumentParser
import Foundation
import ThaliNodeCore

/// `thali-node contacts add|list|remove`: the people this node delivers to and accepts deliveries from.
struct Contacts: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Manage contacts: the peers this node delivers to and accepts deliveries from.",
        subcommands: [Add.self, List.self, Remove.self]
    )

    struct Add: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Add a contact by name and public key.")
        @OptionGroup var options: NodeOptions
        @Argument(help: "A unique name for the contact.") var name: String
        @Argument(help: "The contact's secp256k1 public key (SEC1, hex or base64).") var publicKey: String

        func run() throws {
            let (store, _) = try options.openStore()
            // Our own key is no contact; without an identity yet there is nothing to compare with.
            let own = try? NodeIdentity.load(from: options.nodeHome).publicKey
            let contact = try store.addContact(name: name, publicKey: publicKey, ownKey: own)
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
        }

        func run() throws {
            let (store, _) = try options.openExistingStore()
            let entries = try (store?.contacts() ?? []).map {
                Entry(name: $0.name, publicKey: $0.publicKey, added: formatMilliseconds($0.addedAtMs))
            }
            if json { return try printJSON(entries) }
            if entries.isEmpty { print("no contacts; add one with `thali-node contacts add NAME PUBLIC-KEY`") }
            for entry in entries { print("\(entry.name)\t\(entry.publicKey)") }
        }
    }

    struct Remove: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Remove a contact and the items queued for it (received items stay in the inbox).")
        @OptionGroup var options: NodeOptions
        @Argument(help: "The contact's name.") var name: String

        func run() throws {
            guard let store = try options.openExistingStore().0 else { throw NodeError.unknownContact(name) }
            try store.removeContact(named: name)
            print("removed contact \(name)")
        }
    }
}
