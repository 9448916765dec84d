import Foundation
import GRDB

extension NodeStore {
    /// Removes the copies into the outbox that an interrupted `send --file` left behind (`<id>.copying`;
    /// one being made now is left alone) and returns their names and sizes, for the caller to report.
    public func removeInterruptedCopies() -> [(name: String, bytes: UInt64)] {
        FileContent.removeInterruptedCopies(in: home.outboxDirectory)
    }

    /// Removes the queued items whose ids start with `idPrefixes` (each at least
    /// ``minimumIDPrefixLength`` hex digits, any case, dashes optional: the 8 that `run` shows will do),
    /// with their file copies: cancelled, never offered again. All or nothing: a prefix that names no item,
    /// or several, removes none. A `run` sending one now ends that session without it.
    @discardableResult
    public func removeOutboxItems(matching idPrefixes: [String]) throws -> [OutboxItem] {
        let items = try pool.write { db -> [OutboxItem] in
            let rows = try OutboxRow.fetchAll(db)
            let chosen = try idPrefixes.map { prefix in
                try Self.single(rows.filter { Self.id($0.id, matches: prefix) }, prefix, box: "outbox", id: \.id)
            }
            var seen = Set<UUID>()
            let unique = chosen.filter { seen.insert($0.id).inserted }
            _ = try OutboxRow.deleteAll(db, keys: unique.map(\.id))
            return try unique.map { try $0.value() }
        }
        for path in items.compactMap(\.filePath) { try? FileManager.default.removeItem(atPath: home.absolute(path)) }
        return items
    }

    /// Removes the received items whose ids start with `idPrefixes` from the inbox, with their files if
    /// they are still there; all or nothing, as ``removeOutboxItems(matching:)``. If a sender offers one
    /// again (its `ack` was lost), it arrives again.
    @discardableResult
    public func removeInboxItems(matching idPrefixes: [String]) throws -> [InboxItem] {
        let items = try pool.write { db -> [InboxItem] in
            let rows = try InboxRow.fetchAll(db)
            let chosen = try idPrefixes.map { prefix in
                try Self.single(rows.filter { Self.id($0.itemID, matches: prefix) }, prefix, box: "inbox", id: \.itemID)
            }
            var seen = Set<Int64?>()
            let unique = chosen.filter { seen.insert($0.rowID).inserted }
            for row in unique { _ = try InboxRow.filter(Column("rowID") == row.rowID).deleteAll(db) }
            return try unique.map { try $0.value() }
        }
        for item in items {
            guard let path = item.filePath else { continue }
            // `inbox/<id>/<name>`: the item's own directory goes with its file.
            let file = URL(fileURLWithPath: home.absolute(path))
            try? FileManager.default.removeItem(at: file)
            let directory = file.deletingLastPathComponent()
            if directory.lastPathComponent == item.itemID.uuidString { try? FileManager.default.removeItem(at: directory) }
        }
        return items
    }

    /// The fewest hex digits of an id that ``removeOutboxItems(matching:)`` and
    /// ``removeInboxItems(matching:)`` take (fewer would too easily name another item than meant).
    public static let minimumIDPrefixLength = 4

    private static func id(_ id: UUID, matches prefix: String) -> Bool {
        let wanted = prefix.replacingOccurrences(of: "-", with: "").uppercased()
        guard wanted.count >= minimumIDPrefixLength else { return false }
        return id.uuidString.replacingOccurrences(of: "-", with: "").hasPrefix(wanted)
    }

    /// The one row of `rows` (those matching `prefix`), or the error that names none or several.
    private static func single<Row>(_ rows: [Row], _ prefix: String, box: String, id: (Row) -> UUID) throws -> Row {
        guard rows.count <= 1 else {
            throw NodeError.ambiguousItem(prefix, box: box, candidates: rows.map { id($0).uuidString }.sorted())
        }
        guard let row = rows.first else { throw NodeError.unknownItem(prefix, box: box) }
        return row
    }
}
