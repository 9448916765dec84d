import Foundation
import GRDB

/// A contact: someone this node delivers to and accepts deliveries from.
public struct Contact: Sendable, Hashable, Codable, FetchableRecord, MutablePersistableRecord {
    public static let databaseTableName = "contact"
    /// The row id (stable; never reused after removal).
    public var id: Int64?
    /// The unique name the user gave.
    public var name: String
    /// The contact's public key, normalised (see ``ContactKey``).
    public var publicKey: String
    /// When the contact was added, in milliseconds since the epoch.
    public var addedAtMs: Int64

    /// Creates a contact record (not yet stored).
    public init(id: Int64? = nil, name: String, publicKey: String, addedAtMs: Int64) {
        self.id = id
        self.name = name
        self.publicKey = publicKey
        self.addedAtMs = addedAtMs
    }

    public mutating func didInsert(_ inserted: InsertionSuccess) { id = inserted.rowID }
}

/// Where an outbox item stands. Delivered items are removed, so they have no state.
public enum OutboxState: String, Sendable, Hashable, Codable, DatabaseValueConvertible {
    /// Waiting for (or in) delivery.
    case pending
    /// The receiver refused it (too large, bad name, expired); it is kept for the user to see and never
    /// offered again.
    case refused
}

/// An item queued for a contact.
public struct OutboxItem: Sendable, Hashable, Codable, FetchableRecord, PersistableRecord {
    public static let databaseTableName = "outboxItem"
    /// The idempotent item id (also the id in the receiver's inbox).
    public var id: UUID
    /// The contact it is for.
    public var contactID: Int64
    /// Text or file.
    public var kind: ItemKind
    /// The text, for a text item.
    public var text: String?
    /// The node's own copy of the file (under `outbox/`), for a file item.
    public var filePath: String?
    /// The file's name as the receiver will see it.
    public var fileName: String?
    /// Content length in bytes.
    public var size: Int64
    /// SHA-256 of the content.
    public var sha256: Data
    /// When it was queued (ms since the epoch).
    public var createdAtMs: Int64
    /// When it expires (ms since the epoch); it is dropped then, delivered or not.
    public var expiresAtMs: Int64
    /// Pending or refused.
    public var state: OutboxState
    /// How many bytes the receiver reported holding durably (for progress and resume).
    public var acknowledgedBytes: Int64
    /// Why the item is refused, or the last delivery problem.
    public var lastError: String?

    /// The offer that announces this item.
    public var offer: ItemOffer {
        ItemOffer(id: id, kind: kind, size: UInt64(max(0, size)), sha256: Array(sha256),
                  createdMilliseconds: UInt64(max(0, createdAtMs)), expiresMilliseconds: UInt64(max(0, expiresAtMs)),
                  name: fileName ?? "")
    }
}

/// An item received from a contact.
public struct InboxItem: Sendable, Hashable, Codable, FetchableRecord, MutablePersistableRecord {
    public static let databaseTableName = "inboxItem"
    /// The row id.
    public var rowID: Int64?
    /// The sender's item id; unique per sender key.
    public var itemID: UUID
    /// The sending contact's name when the item arrived.
    public var fromContact: String
    /// The sending contact's public key (identifies the sender even after a rename or removal).
    public var fromPublicKey: String
    /// Text or file.
    public var kind: ItemKind
    /// The text, for a text item.
    public var text: String?
    /// Where the received file is stored (under `inbox/`), for a file item.
    public var filePath: String?
    /// The file's name as sent.
    public var fileName: String?
    /// Content length in bytes.
    public var size: Int64
    /// SHA-256 of the content (verified on arrival).
    public var sha256: Data
    /// When the sender queued it (ms since the epoch).
    public var createdAtMs: Int64
    /// When it arrived (ms since the epoch).
    public var receivedAtMs: Int64

    public mutating func didInsert(_ inserted: InsertionSuccess) { rowID = inserted.rowID }
}
