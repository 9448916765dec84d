import Crypto
import Foundation
import GRDB
import NIOConcurrencyHelpers
import ThaliBeacons
#if canImport(Glibc)
import Glibc
#endif

/// The node's durable state: contacts, the outbox, the inbox. A real SQLite file (`node.sqlite`, WAL
/// mode) under the data directory, with schema migrations; files live beside it (see ``NodeHome``).
///
/// Every change that must be atomic with a file operation (committing a received file, removing a
/// delivered one) happens in one transaction, so a process killed at any moment leaves either the old or
/// the new state, and a rerun converges to exactly one copy of every item.
///
/// Its methods block (SQLite with full durability, file copies): call them from a command-line tool, a
/// blocking pool or a dedicated thread, never from an event loop. The delivery sessions do so on a
/// `NIOThreadPool`. Several processes may open the same data directory (SQLite serialises their writes).
public final class NodeStore: Sendable {
    /// The data directory.
    public let home: NodeHome
    /// The limits queued items are checked against.
    public let limits: DeliveryLimits
    let pool: DatabasePool
    private let sessions = NIOLockedValueBox<Set<SessionKey>>([])
    private let expiryObservers = NIOLockedValueBox<[@Sendable ([OutboxItem]) -> Void]>([])
    /// Durable transactions committed since the store was opened (``durableWrite(_:)``): the inbox
    /// commits, which tests count to see texts committed as a group.
    let durableCommits = NIOLockedValueBox(0)

    /// Opens (creating if needed) the store in `home`, migrating its schema to the current version.
    /// Refuses a database file of 0 bytes beside received or queued files (it was truncated or replaced:
    /// a fresh database would forget them). The database files are made private (0600).
    public init(home: NodeHome, limits: DeliveryLimits = .default) throws {
        self.home = home
        self.limits = limits
        try home.create()
        if let entries = home.orphanedEntriesBesideEmptyDatabase() {
            throw NodeError.storeUnavailable(path: home.databasePath, reason: """
                it is empty (0 bytes) but inbox/ and outbox/ hold \(entries) entr\(entries == 1 ? "y" : "ies"): it was truncated or replaced. \
                Restore it from a backup, or move it aside to start afresh (the received files stay in inbox/)
                """)
        }
        // SQLite gives its journal files the database file's mode: create that one private.
        let descriptor = open(home.databasePath, O_WRONLY | O_CREAT | O_CLOEXEC, NodeHome.fileMode)
        if descriptor >= 0 { close(descriptor) }
        do {
            var configuration = Configuration()
            configuration.foreignKeysEnabled = true
            configuration.busyMode = .timeout(10)
            pool = try DatabasePool(path: home.databasePath, configuration: configuration)
            try NodeStore.migrator.migrate(pool)
        } catch {
            throw NodeError.storeUnavailable(path: home.databasePath, reason: SystemErrorText.describe(error))
        }
        home.makePrivate()
        removeLeftoverDeliveredCopies()
    }

    /// The schema, one registered migration per version. Never edit a shipped migration; add one.
    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.create(table: "contact") { t in
                t.autoIncrementedPrimaryKey("id")
                t.column("name", .text).notNull().unique()
                t.column("publicKey", .text).notNull().unique()
                t.column("addedAtMs", .integer).notNull()
            }
            try db.create(table: "outboxItem") { t in
                t.primaryKey("id", .blob)
                t.column("contactID", .integer).notNull().indexed()
                    .references("contact", onDelete: .cascade)
                t.column("kind", .text).notNull()
                t.column("text", .text)
                t.column("filePath", .text)
                t.column("fileName", .text)
                t.column("size", .integer).notNull()
                t.column("sha256", .blob).notNull()
                t.column("createdAtMs", .integer).notNull()
                t.column("expiresAtMs", .integer).notNull().indexed()
                t.column("state", .text).notNull().defaults(to: OutboxState.pending.rawValue)
                t.column("acknowledgedBytes", .integer).notNull().defaults(to: 0)
                t.column("lastError", .text)
            }
            try db.create(table: "inboxItem") { t in
                t.autoIncrementedPrimaryKey("rowID")
                t.column("itemID", .blob).notNull()
                t.column("fromContact", .text).notNull()
                t.column("fromPublicKey", .text).notNull()
                t.column("kind", .text).notNull()
                t.column("text", .text)
                t.column("filePath", .text)
                t.column("fileName", .text)
                t.column("size", .integer).notNull()
                t.column("sha256", .blob).notNull()
                t.column("createdAtMs", .integer).notNull()
                t.column("receivedAtMs", .integer).notNull()
                t.uniqueKey(["fromPublicKey", "itemID"])
            }
        }
        // v1 stored absolute file paths, so a moved data directory lost its queued and received files.
        // Paths are relative to the data directory from v2 on; the old ones are rewritten from their own
        // shape (`…/outbox/<id>`, `…/inbox/<id>/<name>`; a delivered name has no slash), wherever the
        // directory was when they were written.
        migrator.registerMigration("v2-relative-paths") { db in
            for (table, key, kept) in [("outboxItem", "id", 2), ("inboxItem", "rowID", 3)] {
                let rows = try Row.fetchAll(db, sql: "SELECT \(key) AS key, filePath FROM \(table) WHERE filePath LIKE '/%'")
                for row in rows {
                    let path: String = row["filePath"]
                    let components = path.split(separator: "/", omittingEmptySubsequences: false)
                    guard components.count > kept else { continue }
                    let relative = components.suffix(kept).joined(separator: "/")
                    try db.execute(sql: "UPDATE \(table) SET filePath = ? WHERE \(key) = ?",
                                   arguments: [relative, row["key"] as DatabaseValue])
                }
            }
        }
        // An item its receiver cannot hold now (a temporary refusal) waits until `retryAtMs` before it is
        // offered again; `deferrals` counts such refusals in a row, for the growing wait
        // (NodeStore+Deferral.swift).
        migrator.registerMigration("v3-offer-deferral") { db in
            try db.alter(table: "outboxItem") { t in
                t.add(column: "retryAtMs", .integer)
                t.add(column: "deferrals", .integer).notNull().defaults(to: 0)
            }
        }
        return migrator
    }

    /// The migrations applied to the database, in order.
    public func appliedMigrations() throws -> [String] {
        try pool.read { db in try NodeStore.migrator.appliedMigrations(db) }
    }

    /// Runs `sql` as is: for tests that recreate the state an older version left.
    func executeForTesting(_ sql: String) throws {
        try pool.write { db in try db.execute(sql: sql) }
    }

    /// What moves whenever a transaction commits to the store, by this process or another: the
    /// modification times and sizes of the database file and its write-ahead log. Comparing two stamps
    /// costs two `stat`s, not a query.
    struct ChangeStamp: Hashable, Sendable {
        /// Modification time (ns since 1970) and size of `node.sqlite` and `node.sqlite-wal`.
        let files: [Int64]

        /// How long after a commit a stamp may still equal the next commit's (file times advance in
        /// kernel ticks, and a log restarted after a checkpoint is overwritten without growing).
        static let settleTime: Int64 = 100_000_000

        /// Whether the newest change is older than ``settleTime`` at `now` (ns since 1970): then a later
        /// commit is bound to move the stamp.
        func isSettled(now: Int64 = ChangeStamp.now()) -> Bool {
            let newest = stride(from: 0, to: files.count, by: 2).map { files[$0] }.max() ?? 0
            return now - newest >= Self.settleTime
        }

        static func now() -> Int64 {
            var time = timespec()
            clock_gettime(CLOCK_REALTIME, &time)
            return Int64(time.tv_sec) * 1_000_000_000 + Int64(time.tv_nsec)
        }
    }

    /// The store's ``ChangeStamp`` now.
    func changeStamp() -> ChangeStamp {
        var files: [Int64] = []
        for path in [home.databasePath, home.databasePath + "-wal"] {
            var info = stat()
            if stat(path, &info) == 0 {
                files += [Int64(info.st_mtim.tv_sec) * 1_000_000_000 + Int64(info.st_mtim.tv_nsec), Int64(info.st_size)]
            } else {
                files += [-1, -1]
            }
        }
        return ChangeStamp(files: files)
    }

    /// The SQLite journal mode (`wal`).
    public func journalMode() throws -> String {
        try pool.read { db in try String.fetchOne(db, sql: "PRAGMA journal_mode") ?? "" }
    }

    // MARK: Sessions

    /// The direction of a delivery session.
    public enum SessionRole: String, Sendable, Hashable {
        /// This node delivers its outbox to the contact.
        case sending
        /// This node receives into its inbox from the contact.
        case receiving
    }

    struct SessionKey: Hashable {
        let contactID: Int64
        let role: SessionRole
    }

    /// Claims the one session of `role` with `contact` this store may run at a time (two receivers of the
    /// same item would share its partial file); throws ``NodeError/sessionInProgress(contact:role:)`` if
    /// it is taken. Sessions call this themselves.
    func claimSession(_ role: SessionRole, with contact: Contact) throws {
        let key = SessionKey(contactID: contact.id ?? 0, role: role)
        let claimed = sessions.withLockedValue { $0.insert(key).inserted }
        if !claimed { throw NodeError.sessionInProgress(contact: contact.name, role: role.rawValue) }
    }

    /// Runs `body` holding the claim of the one session in `role` with `contact`, released when `body`
    /// ends. If another session holds it, runs `onRefusal` (the caller closes its connection) and throws
    /// ``NodeError/sessionInProgress(contact:role:)`` without running `body`.
    func withSessionClaim<T>(_ role: SessionRole, with contact: Contact, onRefusal: () async -> Void,
                             _ body: () async throws -> T) async throws -> T {
        guard contact.id != nil else { throw NodeError.unknownContact(contact.name) }
        do {
            try claimSession(role, with: contact)
        } catch {
            await onRefusal()
            throw error
        }
        defer { releaseSession(role, with: contact) }
        return try await body()
    }

    /// Whether a session in `role` with `contact` currently holds its claim (observes without claiming).
    func hasSession(_ role: SessionRole, with contact: Contact) -> Bool {
        let key = SessionKey(contactID: contact.id ?? 0, role: role)
        return sessions.withLockedValue { $0.contains(key) }
    }

    /// Releases a claim made by ``claimSession(_:with:)``.
    func releaseSession(_ role: SessionRole, with contact: Contact) {
        let key = SessionKey(contactID: contact.id ?? 0, role: role)
        _ = sessions.withLockedValue { $0.remove(key) }
    }

    // MARK: Contacts

    /// Adds a contact. `publicKey` is validated and normalised by ``ContactKey/normalize(_:)``; it may not
    /// be `ownKey` (this node's identity), nor the key of another contact.
    @discardableResult
    public func addContact(name: String, publicKey: String, ownKey: PublicKey? = nil, now: Date = Date()) throws -> Contact {
        try ContactNames.validate(name)
        let key = try ContactKey.normalize(publicKey)
        if let ownKey, ownKey.hexString(compressed: true) == key {
            throw NodeError.invalidPublicKey(publicKey, reason: "this is the node's own key")
        }
        return try pool.write { db in
            if try ContactRow.filter(Column("name") == name).fetchOne(db) != nil { throw NodeError.contactExists(name) }
            if let holder = try ContactRow.filter(Column("publicKey") == key).fetchOne(db) {
                throw NodeError.contactKeyExists(holder: holder.name)
            }
            var row = ContactRow(Contact(name: name, publicKey: key, addedAtMs: now.milliseconds))
            try row.insert(db)
            return row.value
        }
    }

    /// All contacts, by name.
    public func contacts() throws -> [Contact] {
        try pool.read { db in try ContactRow.order(Column("name")).fetchAll(db) }.map(\.value)
    }

    /// The contact named `name`; throws ``NodeError/unknownContact(_:)`` if there is none.
    public func contact(named name: String) throws -> Contact {
        guard let contact = try pool.read({ db in try ContactRow.filter(Column("name") == name).fetchOne(db) })?.value else {
            throw NodeError.unknownContact(name)
        }
        return contact
    }

    /// The contact whose public key is `publicKey` (normalised first), if any. The layer that authenticates
    /// a peer uses this to name the contact a session runs with.
    public func contact(publicKey: String) throws -> Contact? {
        let key = try ContactKey.normalize(publicKey)
        return try pool.read { db in try ContactRow.filter(Column("publicKey") == key).fetchOne(db) }?.value
    }

    /// The contact whose identity key is `key` (as authenticated by a beacon match and PSK-TLS), if any:
    /// the `authenticatedPeer` of a delivery session.
    public func contact(for key: PublicKey) throws -> Contact? {
        let canonical = key.hexString(compressed: true)
        return try pool.read { db in try ContactRow.filter(Column("publicKey") == canonical).fetchOne(db) }?.value
    }

    /// Removes the contact named `name`, the items queued for it (their file copies too) and its partial
    /// files. The inbox keeps what it received from the contact. Unless `deletingQueuedItems`, a contact
    /// with queued items is kept and ``NodeError/contactHasQueuedItems(_:count:bytes:)`` says what would go.
    /// Returns the items deleted.
    @discardableResult
    public func removeContact(named name: String, deletingQueuedItems: Bool = true) throws -> [OutboxItem] {
        let (id, items) = try pool.write { db -> (Int64, [OutboxItem]) in
            guard let contact = try ContactRow.filter(Column("name") == name).fetchOne(db), let id = contact.id else {
                throw NodeError.unknownContact(name)
            }
            let items = try OutboxRow.filter(Column("contactID") == id).fetchAll(db).map { resolved(try $0.value()) }
            if !items.isEmpty && !deletingQueuedItems {
                throw NodeError.contactHasQueuedItems(name, count: items.count, bytes: items.reduce(0) { $0 + $1.size })
            }
            _ = try ContactRow.deleteOne(db, key: id)
            return (id, items)
        }
        for file in items.compactMap(\.filePath) { try? FileManager.default.removeItem(atPath: file) }
        let partials = (try? FileManager.default.contentsOfDirectory(atPath: home.partialDirectory)) ?? []
        for partial in partials where partial.hasPrefix("\(id)-") {
            try? FileManager.default.removeItem(atPath: home.partialDirectory + "/" + partial)
        }
        return items
    }

    // MARK: Outbox

    /// Queues a text for `contactName`. Idempotent: queuing the same `id` again returns the stored item.
    @discardableResult
    public func enqueueText(_ text: String, to contactName: String, expiresAt: Date, id: UUID = UUID(),
                            now: Date = Date()) throws -> OutboxItem {
        let bytes = Array(text.utf8)
        guard UInt64(bytes.count) <= limits.maxTextBytes else {
            throw NodeError.itemTooLarge(size: UInt64(bytes.count), limit: limits.maxTextBytes)
        }
        guard expiresAt > now else { throw NodeError.invalidExpiry("\(expiresAt)") }
        let contact = try contact(named: contactName)
        let item = OutboxItem(id: id, contactID: contact.id ?? 0, kind: .text, text: text, filePath: nil, fileName: nil,
                              size: Int64(bytes.count), sha256: Data(SHA256.hash(data: bytes)),
                              createdAtMs: now.milliseconds, expiresAtMs: expiresAt.milliseconds, state: .pending,
                              acknowledgedBytes: 0, lastError: nil)
        return try insertIdempotently(item)
    }

    /// Queues the regular file at `path` for `contactName` under `name` (default: the file's own name):
    /// the node copies it under `outbox/` (hashing it on the way), so the delivered content is what was
    /// queued. With an explicit `name`, `path` may also be a pipe this process inherited (`/dev/stdin`,
    /// `/dev/fd/N` as `<(cmd)` gives), read to its end within `maxItemBytes`. Named pipes (FIFOs), devices,
    /// sockets and directories are refused (``NodeError/unreadableFile(path:reason:)``), a file over the
    /// limit at once, and a file written while it is copied after the copy
    /// (``NodeError/fileChangedWhileRead(path:what:)``). `progress` hears the bytes copied so far and the
    /// file's size. Idempotent on `id`.
    @discardableResult
    public func enqueueFile(at path: String, to contactName: String, name: String? = nil, expiresAt: Date,
                            id: UUID = UUID(), now: Date = Date(),
                            progress: ((_ copied: UInt64, _ total: UInt64?) -> Void)? = nil) throws -> OutboxItem {
        let named = name != nil
        let name = name ?? URL(fileURLWithPath: path).lastPathComponent
        guard FileNames.isSafe(name), !FileNames.hasBidirectionalControl(name), name.utf8.count <= limits.maxNameBytes else {
            throw NodeError.invalidFileName(name)
        }
        guard expiresAt > now else { throw NodeError.invalidExpiry("\(expiresAt)") }
        let contact = try contact(named: contactName)
        if let existing = try outboxItem(id: id) { return existing }
        let copy = home.outboxDirectory + "/" + id.uuidString
        let (size, digest) = try FileContent.copy(from: path, to: copy, limit: limits.maxItemBytes, acceptingPipe: named,
                                                  progress: progress)
        let item = OutboxItem(id: id, contactID: contact.id ?? 0, kind: .file, text: nil, filePath: home.relative(copy), fileName: name,
                              size: Int64(size), sha256: Data(digest), createdAtMs: now.milliseconds,
                              expiresAtMs: expiresAt.milliseconds, state: .pending, acknowledgedBytes: 0, lastError: nil)
        do {
            return try insertIdempotently(item)
        } catch {
            try? FileManager.default.removeItem(atPath: copy)
            throw error
        }
    }

    private func insertIdempotently(_ item: OutboxItem) throws -> OutboxItem {
        resolved(try pool.write { db in
            try OutboxRow(item).insert(db, onConflict: .ignore)
            return try OutboxRow.fetchOne(db, key: item.id)?.value() ?? item
        })
    }

    /// `item` with its recorded file path (relative to the data directory) made absolute.
    private func resolved(_ item: OutboxItem) -> OutboxItem {
        var item = item
        item.filePath = item.filePath.map(home.absolute)
        return item
    }

    /// `item` with its recorded file path (relative to the data directory) made absolute.
    private func resolved(_ item: InboxItem) -> InboxItem {
        var item = item
        item.filePath = item.filePath.map(home.absolute)
        return item
    }

    /// The outbox item `id`, if it is still queued.
    public func outboxItem(id: UUID) throws -> OutboxItem? {
        try pool.read { db in try OutboxRow.fetchOne(db, key: id)?.value() }.map(resolved)
    }

    /// Whether `error` came from the store's database (SQLite, through GRDB): a full disk, a locked or
    /// damaged file. An app tells these from its own errors without importing GRDB.
    public static func isDatabaseError(_ error: any Error) -> Bool {
        error is DatabaseError
    }

    /// How many items are queued (pending and refused): counted in SQL, none read.
    public func outboxCount() throws -> Int {
        try pool.read { db in try OutboxRow.fetchCount(db) }
    }

    /// Every queued item (pending and refused), oldest first.
    public func outbox() throws -> [OutboxItem] {
        try pool.read { db in try OutboxRow.order(Column("createdAtMs"), Column("id")).fetchAll(db).map { try $0.value() } }.map(resolved)
    }

    /// The contacts that have pending, unexpired items due at `now` (not deferred to a later retry
    /// time): the ones to advertise beacons for.
    public func contactsWithPendingItems(now: Date = Date()) throws -> [Contact] {
        try pool.read { db in
            try ContactRow.filter(sql: """
                id IN (SELECT contactID FROM outboxItem WHERE state = ? AND expiresAtMs > ? AND (retryAtMs IS NULL OR retryAtMs <= ?))
                """, arguments: [OutboxState.pending.rawValue, now.milliseconds, now.milliseconds])
                .order(Column("name")).fetchAll(db)
        }.map(\.value)
    }

    /// The pending, unexpired items for `contact` due at `now` (an item its receiver could not hold
    /// waits for its retry time), oldest first: what a session offers it.
    public func pendingItems(for contact: Contact, now: Date = Date()) throws -> [OutboxItem] {
        try pool.read { db in
            try OutboxRow
                .filter(Column("contactID") == contact.id && Column("state") == OutboxState.pending.rawValue
                        && Column("expiresAtMs") > now.milliseconds
                        && (Column("retryAtMs") == nil || Column("retryAtMs") <= now.milliseconds))
                .order(Column("createdAtMs"), Column("id")).fetchAll(db).map { try $0.value() }
        }.map(resolved)
    }

    /// Drops every item expired at `now` (delivered or not, refused too) with its file copy; returns them
    /// and tells the observers (``observeExpiry(_:)``).
    @discardableResult
    public func sweepExpired(now: Date = Date()) throws -> [OutboxItem] {
        let expired = try pool.write { db in
            let items = try OutboxRow.filter(Column("expiresAtMs") <= now.milliseconds).fetchAll(db).map { try $0.value() }
            _ = try OutboxRow.filter(Column("expiresAtMs") <= now.milliseconds).deleteAll(db)
            return items
        }.map(resolved)
        for file in expired.compactMap(\.filePath) { try? FileManager.default.removeItem(atPath: file) }
        if !expired.isEmpty {
            for observer in expiryObservers.withLockedValue({ $0 }) { observer(expired) }
        }
        return expired
    }

    /// Calls `observer` with the items each sweep drops because they expired undelivered (whoever sweeps:
    /// the advertiser, a delivery session), so that `run` can report them.
    public func observeExpiry(_ observer: @escaping @Sendable ([OutboxItem]) -> Void) {
        expiryObservers.withLockedValue { $0.append(observer) }
    }

    /// Removes a delivered item (the receiver acknowledged it or already had it) and its file copy.
    func markDelivered(_ id: UUID) throws {
        try markDelivered([id])
    }

    /// Removes delivered items and their file copies in one transaction (a batch the receiver answered).
    func markDelivered(_ ids: [UUID]) throws {
        for file in try deleteDelivered(ids) { try? FileManager.default.removeItem(atPath: file) }
    }

    /// Removes delivered items in one transaction and sets their file copies aside (renamed with
    /// ``deliveredCopySuffix``, in the outbox), returning the set-aside paths for the caller to delete
    /// later (``removeSetAsideCopies(_:)``): deleting a large file can take long (a file system mounted
    /// with `discard` trims its blocks as it unlinks, 0.2 s for 256 MiB here), and a delivery session need
    /// not wait for it. A copy set aside by a process that then dies goes when the store is next opened.
    @discardableResult
    func markDeliveredSettingAsideCopies(_ ids: [UUID]) throws -> [String] {
        // rename, not FileManager's move: it replaces a copy of the same item set aside before.
        try deleteDelivered(ids).compactMap { file in
            rename(file, file + Self.deliveredCopySuffix) == 0 ? file + Self.deliveredCopySuffix : nil
        }
    }

    /// Deletes file copies that ``markDeliveredSettingAsideCopies(_:)`` set aside; returns how many.
    @discardableResult
    func removeSetAsideCopies(_ paths: [String]) -> Int {
        paths.reduce(0) { removed, path in
            removed + ((try? FileManager.default.removeItem(atPath: path)) != nil ? 1 : 0)
        }
    }

    /// Deletes every set-aside copy in the outbox (those a process left when it died before deleting
    /// them); the store does this once when it opens. Returns how many.
    @discardableResult
    func removeLeftoverDeliveredCopies() -> Int {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: home.outboxDirectory)) ?? []
        return removeSetAsideCopies(names.filter { $0.hasSuffix(Self.deliveredCopySuffix) }.map { home.outboxDirectory + "/" + $0 })
    }

    /// The suffix of a delivered item's file copy set aside for removal.
    static let deliveredCopySuffix = ".delivered"

    /// Deletes delivered items in one transaction; returns their file copies' paths.
    private func deleteDelivered(_ ids: [UUID]) throws -> [String] {
        guard !ids.isEmpty else { return [] }
        return try pool.write { db -> [String] in
            let paths = try OutboxRow.fetchAll(db, keys: ids).compactMap { $0.filePath.map(home.absolute) }
            _ = try OutboxRow.deleteAll(db, keys: ids)
            return paths
        }
    }

    /// Marks an item refused by its receiver: kept for the user to see, never offered again.
    func markRefused(_ id: UUID, reason: String) throws {
        try pool.write { db in
            try db.execute(sql: "UPDATE outboxItem SET state = ?, lastError = ? WHERE id = ?",
                           arguments: [OutboxState.refused.rawValue, reason, id])
        }
    }

    /// Records a delivery problem of a still pending item.
    func recordProblem(_ id: UUID, _ problem: String) throws {
        try pool.write { db in
            try db.execute(sql: "UPDATE outboxItem SET lastError = ? WHERE id = ?", arguments: [problem, id])
        }
    }

    /// Records how many bytes of item `id` the receiver holds durably.
    func recordAcknowledgedBytes(_ id: UUID, _ bytes: UInt64) throws {
        try pool.write { db in
            try db.execute(sql: "UPDATE outboxItem SET acknowledgedBytes = ? WHERE id = ?",
                           arguments: [Int64(clamping: bytes), id])
        }
    }

    // MARK: Inbox

    /// How many items were received: counted in SQL, none read.
    public func inboxCount() throws -> Int {
        try pool.read { db in try InboxRow.fetchCount(db) }
    }

    /// Everything received, oldest first.
    public func inbox() throws -> [InboxItem] {
        try pool.read { db in try InboxRow.order(Column("receivedAtMs"), Column("rowID")).fetchAll(db).map { try $0.value() } }.map(resolved)
    }

    /// Whether item `id` from `contact` is in the inbox.
    func inboxContains(_ id: UUID, from contact: Contact) throws -> Bool {
        try pool.read { db in
            try InboxRow.filter(Column("fromPublicKey") == contact.publicKey && Column("itemID") == id).fetchCount(db) > 0
        }
    }

    /// The partial file that holds item `id` from `contact` while it is being received.
    func partialPath(for id: UUID, from contact: Contact) -> String {
        "\(home.partialDirectory)/\(contact.id ?? 0)-\(id.uuidString).part"
    }

    /// Deletes the partial files from `contact` last modified before `cutoff`; returns how many.
    @discardableResult
    func sweepStalePartials(from contact: Contact, before cutoff: Date) -> Int {
        let prefix = "\(contact.id ?? 0)-"
        let names = (try? FileManager.default.contentsOfDirectory(atPath: home.partialDirectory)) ?? []
        var removed = 0
        for name in names where name.hasPrefix(prefix) {
            let path = home.partialDirectory + "/" + name
            guard let modified = (try? FileManager.default.attributesOfItem(atPath: path))?[.modificationDate] as? Date,
                  modified < cutoff else { continue }
            if (try? FileManager.default.removeItem(atPath: path)) != nil { removed += 1 }
        }
        return removed
    }

    /// The outcome of ``commitReceived(_:from:now:)``.
    enum CommitResult: Sendable, Hashable {
        /// Stored now.
        case stored(InboxItem)
        /// It was already in the inbox (the partial file is discarded).
        case alreadyStored
        /// A text item whose content is not UTF-8; nothing stored, the partial file is kept for the caller.
        case invalidText
    }

    /// Commits a fully received and verified item from its partial file: a text goes into the row, a file
    /// moves to `inbox/<id>/<name>`; the row is inserted in the same transaction (idempotent per sender).
    func commitReceived(_ offer: ItemOffer, from contact: Contact, now: Date = Date()) throws -> CommitResult {
        let partial = partialPath(for: offer.id, from: contact)
        var text: String?
        if offer.kind == .text {
            let data = try Data(contentsOf: URL(fileURLWithPath: partial))
            guard let decoded = String(validating: data, as: UTF8.self) else { return .invalidText }
            text = decoded
        }
        let directory = "\(home.inboxDirectory)/\(offer.id.uuidString)"
        // Under a name that cannot pass for another (the sender's own is kept in the row).
        let destination = "\(directory)/\(FileNames.storedName(for: offer.name))"
        let result = try durableWrite { db -> CommitResult in
            if try InboxRow.filter(Column("fromPublicKey") == contact.publicKey && Column("itemID") == offer.id).fetchCount(db) > 0 {
                return .alreadyStored
            }
            var row = InboxRow(InboxItem(itemID: offer.id, fromContact: contact.name, fromPublicKey: contact.publicKey,
                                 kind: offer.kind, text: text, filePath: offer.kind == .file ? home.relative(destination) : nil,
                                 fileName: offer.kind == .file ? offer.name : nil, size: Int64(clamping: offer.size),
                                 sha256: Data(offer.sha256), createdAtMs: Int64(clamping: offer.createdMilliseconds),
                                 receivedAtMs: now.milliseconds))
            if offer.kind == .file {
                // Inside the transaction: if the move fails nothing is inserted; if the process dies after the
                // move but before the commit, the rerun receives the item again and replaces the file.
                do {
                    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true,
                                                            attributes: [.posixPermissions: NodeHome.directoryMode])
                    if FileManager.default.fileExists(atPath: destination) { try FileManager.default.removeItem(atPath: destination) }
                    try FileManager.default.moveItem(atPath: partial, toPath: destination)
                    // The file's name and its directory's, durable before the row that points at them.
                    try FileContent.syncDirectory(directory)
                    try FileContent.syncDirectory(home.inboxDirectory)
                } catch let error as NodeError {
                    throw error
                } catch {
                    throw NodeError.dataDirectoryUnusable(path: directory, reason: SystemErrorText.describe(error))
                }
            }
            try row.insert(db)
            return .stored(resolved(try row.value()))
        }
        if result == .alreadyStored || offer.kind == .text { try? FileManager.default.removeItem(atPath: partial) }
        return result
    }
}

extension NodeStore {
    /// Commits texts that arrived whole (a batch of version 3 `item` frames, each verified by the caller)
    /// in one durable transaction: one fsync for the batch, so every text is on disk before any of them
    /// is acknowledged. Returns, in order, `.stored` or `.alreadyStored` (idempotent per sender).
    func commitReceivedTexts(_ texts: [(offer: ItemOffer, text: String)], from contact: Contact,
                                    now: Date = Date()) throws -> [CommitResult] {
        guard !texts.isEmpty else { return [] }
        return try durableWrite { db -> [CommitResult] in
            var results: [CommitResult] = []
            for (offer, text) in texts {
                if try InboxRow.filter(Column("fromPublicKey") == contact.publicKey && Column("itemID") == offer.id).fetchCount(db) > 0 {
                    results.append(.alreadyStored)
                    continue
                }
                var row = InboxRow(InboxItem(itemID: offer.id, fromContact: contact.name, fromPublicKey: contact.publicKey,
                                             kind: .text, text: text, filePath: nil, fileName: nil, size: Int64(clamping: offer.size),
                                             sha256: Data(offer.sha256), createdAtMs: Int64(clamping: offer.createdMilliseconds),
                                             receivedAtMs: now.milliseconds))
                try row.insert(db)
                results.append(.stored(try row.value()))
            }
            return results
        }
    }

    /// Runs `body` in a write transaction that is on disk when this returns (SQLite `synchronous = FULL`
    /// for it, which syncs the write-ahead log at the commit): what an `ack` promises, that the item
    /// survives a power loss too. Other writes keep WAL's `NORMAL`, durable when the process dies.
    func durableWrite<T>(_ body: (Database) throws -> T) throws -> T {
        try pool.writeWithoutTransaction { db -> T in
            try db.execute(sql: "PRAGMA synchronous = FULL")
            defer { try? db.execute(sql: "PRAGMA synchronous = NORMAL") }
            var result: Result<T, any Error>?
            try db.inTransaction {
                result = Result { try body(db) }
                if case .failure = result { return .rollback }
                return .commit
            }
            guard let result else { throw NodeError.storeUnavailable(path: home.databasePath, reason: "the transaction did not run") }
            if case .success = result { durableCommits.withLockedValue { $0 += 1 } }
            return try result.get()
        }
    }
}

/// The store's time unit.
extension Date {
    /// Milliseconds since the epoch.
    var milliseconds: Int64 { Int64((timeIntervalSince1970 * 1000).rounded(.down)) }

    /// Milliseconds since the epoch (the unit of the store's timestamps).
    public var millisecondsSinceEpoch: Int64 { milliseconds }

    /// The date `milliseconds` after the epoch.
    init(milliseconds: Int64) { self.init(timeIntervalSince1970: Double(milliseconds) / 1000) }
}
