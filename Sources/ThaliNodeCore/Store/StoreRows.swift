import Foundation
import GRDB

// The store's rows: GRDB records with the columns of the schema (`NodeStore.migrator`), kept apart from
// the public ``Contact``, ``OutboxItem`` and ``InboxItem`` so that the storage library stays behind the
// store's API. Each row holds its value and converts field for field.

/// A `contact` row.
struct ContactRow: Codable, FetchableRecord, MutablePersistableRecord {
    static let databaseTableName = "contact"
    var id: Int64?
    var name: String
    var publicKey: String
    var addedAtMs: Int64

    init(_ contact: Contact) {
        (id, name, publicKey, addedAtMs) = (contact.id, contact.name, contact.publicKey, contact.addedAtMs)
    }

    var value: Contact { Contact(id: id, name: name, publicKey: publicKey, addedAtMs: addedAtMs) }

    mutating func didInsert(_ inserted: InsertionSuccess) { id = inserted.rowID }
}

/// A column's value that none of its type's cases has: the database was written by something else.
struct UnknownStoredValue: Error, CustomStringConvertible {
    let table: String
    let column: String
    let value: String
    var description: String { "the \(table) table holds \"\(value)\" in its \(column) column, which this version does not know" }
}

/// An `outboxItem` row.
struct OutboxRow: Codable, FetchableRecord, PersistableRecord {
    static let databaseTableName = "outboxItem"
    var id: UUID
    var contactID: Int64
    var kind: String
    var text: String?
    var filePath: String?
    var fileName: String?
    var size: Int64
    var sha256: Data
    var createdAtMs: Int64
    var expiresAtMs: Int64
    var state: String
    var acknowledgedBytes: Int64
    var lastError: String?

    init(_ item: OutboxItem) {
        id = item.id
        contactID = item.contactID
        kind = item.kind.rawValue
        text = item.text
        filePath = item.filePath
        fileName = item.fileName
        size = item.size
        sha256 = item.sha256
        createdAtMs = item.createdAtMs
        expiresAtMs = item.expiresAtMs
        state = item.state.rawValue
        acknowledgedBytes = item.acknowledgedBytes
        lastError = item.lastError
    }

    func value() throws -> OutboxItem {
        guard let kind = ItemKind(rawValue: kind) else { throw UnknownStoredValue(table: Self.databaseTableName, column: "kind", value: kind) }
        guard let state = OutboxState(rawValue: state) else {
            throw UnknownStoredValue(table: Self.databaseTableName, column: "state", value: state)
        }
        return OutboxItem(id: id, contactID: contactID, kind: kind, text: text, filePath: filePath, fileName: fileName, size: size,
                          sha256: sha256, createdAtMs: createdAtMs, expiresAtMs: expiresAtMs, state: state,
                          acknowledgedBytes: acknowledgedBytes, lastError: lastError)
    }
}

/// An `inboxItem` row.
struct InboxRow: Codable, FetchableRecord, MutablePersistableRecord {
    static let databaseTableName = "inboxItem"
    var rowID: Int64?
    var itemID: UUID
    var fromContact: String
    var fromPublicKey: String
    var kind: String
    var text: String?
    var filePath: String?
    var fileName: String?
    var size: Int64
    var sha256: Data
    var createdAtMs: Int64
    var receivedAtMs: Int64

    init(_ item: InboxItem) {
        rowID = item.rowID
        itemID = item.itemID
        fromContact = item.fromContact
        fromPublicKey = item.fromPublicKey
        kind = item.kind.rawValue
        text = item.text
        filePath = item.filePath
        fileName = item.fileName
        size = item.size
        sha256 = item.sha256
        createdAtMs = item.createdAtMs
        receivedAtMs = item.receivedAtMs
    }

    func value() throws -> InboxItem {
        guard let kind = ItemKind(rawValue: kind) else { throw UnknownStoredValue(table: Self.databaseTableName, column: "kind", value: kind) }
        return InboxItem(rowID: rowID, itemID: itemID, fromContact: fromContact, fromPublicKey: fromPublicKey, kind: kind, text: text,
                         filePath: filePath, fileName: fileName, size: size, sha256: sha256, createdAtMs: createdAtMs,
                         receivedAtMs: receivedAtMs)
    }

    mutating func didInsert(_ inserted: InsertionSuccess) { rowID = inserted.rowID }
}
