import Foundation

/// A contact: someone this node delivers to and accepts deliveries from.
public struct Contact: Sendable, Hashable {
    /// The row id (stable; never reused after removal).
    public var id: Int64?
    /// The unique name the user gave.
    public var name: String
    /// The contact's public key, normalised (see ``ContactKey``).
    public var publicKey: String
    /// When the contact was added.
    public var addedAt: Date { Date(milliseconds: addedAtMs) }
    /// ``addedAt`` as stored: milliseconds since the epoch.
    var addedAtMs: Int64

    init(id: Int64? = nil, name: String, publicKey: String, addedAtMs: Int64) {
        self.id = id
        self.name = name
        self.publicKey = publicKey
        self.addedAtMs = addedAtMs
    }
}

/// Where an outbox item stands. Delivered items are removed, so they have no state.
public enum OutboxState: String, Sendable, Hashable, Codable {
    /// Waiting for (or in) delivery.
    case pending
    /// The receiver refused it (too large, bad name, expired); it is kept for the user to see and never
    /// offered again.
    case refused
}

/// An item queued for a contact.
public struct OutboxItem: Sendable, Hashable {
    /// The idempotent item id (also the id in the receiver's inbox).
    public var id: UUID
    /// The contact it is for (``Contact/id``).
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
    /// When it was queued.
    public var createdAt: Date { Date(milliseconds: createdAtMs) }
    /// When it expires; it is dropped then, delivered or not.
    public var expiresAt: Date { Date(milliseconds: expiresAtMs) }
    /// Pending or refused.
    public var state: OutboxState
    /// How many bytes the receiver reported holding durably (for progress and resume).
    public var acknowledgedBytes: Int64
    /// Why the item is refused, or the last delivery problem.
    public var lastError: String?
    /// ``createdAt`` as stored and sent: milliseconds since the epoch.
    var createdAtMs: Int64
    /// ``expiresAt`` as stored and sent: milliseconds since the epoch.
    var expiresAtMs: Int64

    init(id: UUID, contactID: Int64, kind: ItemKind, text: String?, filePath: String?, fileName: String?, size: Int64,
         sha256: Data, createdAtMs: Int64, expiresAtMs: Int64, state: OutboxState, acknowledgedBytes: Int64, lastError: String?) {
        self.id = id
        self.contactID = contactID
        self.kind = kind
        self.text = text
        self.filePath = filePath
        self.fileName = fileName
        self.size = size
        self.sha256 = sha256
        self.createdAtMs = createdAtMs
        self.expiresAtMs = expiresAtMs
        self.state = state
        self.acknowledgedBytes = acknowledgedBytes
        self.lastError = lastError
    }

    /// The offer that announces this item.
    var offer: ItemOffer {
        ItemOffer(id: id, kind: kind, size: UInt64(max(0, size)), sha256: Array(sha256),
                  createdMilliseconds: UInt64(max(0, createdAtMs)), expiresMilliseconds: UInt64(max(0, expiresAtMs)),
                  name: fileName ?? "")
    }
}

/// An item received from a contact.
public struct InboxItem: Sendable, Hashable {
    /// The item's place in the inbox, in order of arrival.
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
    /// When the sender queued it.
    public var createdAt: Date { Date(milliseconds: createdAtMs) }
    /// When it arrived.
    public var receivedAt: Date { Date(milliseconds: receivedAtMs) }
    /// ``createdAt`` as stored: milliseconds since the epoch.
    var createdAtMs: Int64
    /// ``receivedAt`` as stored: milliseconds since the epoch.
    var receivedAtMs: Int64

    init(rowID: Int64? = nil, itemID: UUID, fromContact: String, fromPublicKey: String, kind: ItemKind, text: String?,
         filePath: String?, fileName: String?, size: Int64, sha256: Data, createdAtMs: Int64, receivedAtMs: Int64) {
        self.rowID = rowID
        self.itemID = itemID
        self.fromContact = fromContact
        self.fromPublicKey = fromPublicKey
        self.kind = kind
        self.text = text
        self.filePath = filePath
        self.fileName = fileName
        self.size = size
        self.sha256 = sha256
        self.createdAtMs = createdAtMs
        self.receivedAtMs = receivedAtMs
    }
}
