import Crypto
import Foundation
import ThaliBeacons
import Testing
@testable import ThaliNodeCore

@Suite("Node store")
struct NodeStoreTests {
    @Test("a new store is a WAL SQLite file with every migration applied, and reopens with its data")
    func migrationsAndPersistence() throws {
        let temporary = TemporaryHome()
        do {
            let store = try NodeStore(home: temporary.home)
            #expect(try store.appliedMigrations() == ["v1", "v2-relative-paths", "v3-offer-deferral"])
            #expect(try store.journalMode() == "wal")
            try store.addContact(name: "carol", publicKey: randomPublicKey())
        }
        #expect(FileManager.default.fileExists(atPath: temporary.home.databasePath))
        let reopened = try NodeStore(home: temporary.home)
        #expect(try reopened.appliedMigrations() == ["v1", "v2-relative-paths", "v3-offer-deferral"])
        #expect(try reopened.contacts().map(\.name) == ["carol"])
    }

    @Test("contacts: add, list, look up, remove; names unique; keys validated and normalised")
    func contacts() throws {
        let temporary = TemporaryHome()
        let store = try NodeStore(home: temporary.home)
        let key = randomPublicKey()
        let base64 = Data(ContactKey.decodeHex(key)!).base64EncodedString()
        let dave = try store.addContact(name: "dave", publicKey: base64)
        #expect(dave.publicKey == key)
        #expect(try store.contact(publicKey: key.uppercased())?.name == "dave")
        // The uncompressed form of a key is stored compressed: the same contact either way.
        let erinKey = PrivateKey().publicKey
        let erin = try store.addContact(name: "erin", publicKey: erinKey.hexString(compressed: false))
        #expect(erin.publicKey == erinKey.hexString(compressed: true))
        #expect(try store.contact(publicKey: erinKey.base64String(compressed: false))?.name == "erin")
        #expect(try erin.identityKey() == erinKey)
        #expect(try store.contact(for: erinKey)?.name == "erin")
        #expect(try store.contact(for: PrivateKey().publicKey) == nil)
        try store.removeContact(named: "erin")
        #expect(throws: NodeError.contactExists("dave")) { try store.addContact(name: "dave", publicKey: randomPublicKey()) }
        #expect(throws: NodeError.contactKeyExists(holder: "dave")) {
            try store.addContact(name: "eve", publicKey: key)
        }
        #expect(throws: NodeError.self) { try store.addContact(name: "eve", publicKey: "zz") }
        #expect(throws: NodeError.self) { try store.addContact(name: "eve", publicKey: "05" + String(repeating: "00", count: 32)) }
        // Well-formed but not a point on secp256k1 (x ≥ p).
        #expect(throws: NodeError.self) { try store.addContact(name: "eve", publicKey: "02" + String(repeating: "ff", count: 32)) }
        let own = PrivateKey().publicKey
        #expect(throws: NodeError.invalidPublicKey(own.hexString(compressed: true), reason: "this is the node's own key")) {
            try store.addContact(name: "me", publicKey: own.hexString(compressed: true), ownKey: own)
        }
        #expect(throws: NodeError.self) { try store.addContact(name: "", publicKey: randomPublicKey()) }
        #expect(throws: NodeError.self) { try store.addContact(name: "a\nb", publicKey: randomPublicKey()) }
        try store.addContact(name: "alice", publicKey: randomPublicKey())
        #expect(try store.contacts().map(\.name) == ["alice", "dave"])
        try store.removeContact(named: "dave")
        #expect(throws: NodeError.unknownContact("dave")) { try store.contact(named: "dave") }
        #expect(throws: NodeError.unknownContact("dave")) { try store.removeContact(named: "dave") }
    }

    @Test("queuing is idempotent on the item id, and only for known contacts")
    func idempotentEnqueue() throws {
        let temporary = TemporaryHome()
        let store = try NodeStore(home: temporary.home)
        try store.addContact(name: "bob", publicKey: randomPublicKey())
        let id = UUID()
        let expiry = Date().addingTimeInterval(3600)
        let first = try store.enqueueText("hello", to: "bob", expiresAt: expiry, id: id)
        let second = try store.enqueueText("hello again", to: "bob", expiresAt: expiry, id: id)
        #expect(second == first)
        #expect(try store.outbox().count == 1)
        #expect(Array(first.sha256) == Array(SHA256.hash(data: Array("hello".utf8))))
        #expect(throws: NodeError.unknownContact("nobody")) { try store.enqueueText("x", to: "nobody", expiresAt: expiry) }
        #expect(throws: NodeError.self) { try store.enqueueText("x", to: "bob", expiresAt: Date().addingTimeInterval(-1)) }
    }

    @Test("a queued file is copied and hashed; the copy goes with the item")
    func enqueueFile() throws {
        let temporary = TemporaryHome()
        let store = try NodeStore(home: temporary.home)
        try store.addContact(name: "bob", publicKey: randomPublicKey())
        let content = randomBytes(150_000)
        let source = temporary.home.path + "/source.bin"
        try Data(content).write(to: URL(fileURLWithPath: source))
        let id = UUID()
        let item = try store.enqueueFile(at: source, to: "bob", expiresAt: Date().addingTimeInterval(60), id: id)
        #expect(item.size == 150_000)
        #expect(item.fileName == "source.bin")
        #expect(Array(item.sha256) == Array(SHA256.hash(data: content)))
        let copy = try #require(item.filePath)
        #expect(try Data(contentsOf: URL(fileURLWithPath: copy)) == Data(content))
        // The original may change now; the copy is what will be delivered.
        try Data([1, 2, 3]).write(to: URL(fileURLWithPath: source))
        #expect(try store.enqueueFile(at: source, to: "bob", expiresAt: Date().addingTimeInterval(60), id: id) == item)
        try store.markDelivered(id)
        #expect(!FileManager.default.fileExists(atPath: copy))
        #expect(try store.outbox().isEmpty)

        #expect(throws: NodeError.unreadableFile(path: temporary.home.path + "/missing", reason: "no such file")) {
            try store.enqueueFile(at: temporary.home.path + "/missing", to: "bob", expiresAt: Date().addingTimeInterval(60))
        }
        #expect(throws: NodeError.unreadableFile(path: temporary.home.inboxDirectory,
                                                 reason: "a directory, not a regular file; save the content to a file first")) {
            try store.enqueueFile(at: temporary.home.inboxDirectory, to: "bob", expiresAt: Date().addingTimeInterval(60))
        }
    }

    @Test("items above the size limits are not queued")
    func sizeLimits() throws {
        let temporary = TemporaryHome()
        let store = try NodeStore(home: temporary.home, limits: DeliveryLimits(maxItemBytes: 1000, maxTextBytes: 4))
        try store.addContact(name: "bob", publicKey: randomPublicKey())
        #expect(throws: NodeError.itemTooLarge(size: 5, limit: 4)) {
            try store.enqueueText("12345", to: "bob", expiresAt: Date().addingTimeInterval(60))
        }
        let source = temporary.home.path + "/big.bin"
        try Data(randomBytes(1001)).write(to: URL(fileURLWithPath: source))
        #expect(throws: NodeError.itemTooLarge(size: 1001, limit: 1000)) {
            try store.enqueueFile(at: source, to: "bob", expiresAt: Date().addingTimeInterval(60))
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: temporary.home.outboxDirectory).isEmpty)
    }

    @Test("pending queries see only unexpired items of the right contact; the sweep drops expired ones")
    func pendingAndExpiry() throws {
        let temporary = TemporaryHome()
        let store = try NodeStore(home: temporary.home)
        let bob = try store.addContact(name: "bob", publicKey: randomPublicKey())
        let carol = try store.addContact(name: "carol", publicKey: randomPublicKey())
        try store.addContact(name: "dave", publicKey: randomPublicKey())
        let now = Date()
        let soon = try store.enqueueText("soon gone", to: "bob", expiresAt: now.addingTimeInterval(10), now: now)
        let later = try store.enqueueText("stays", to: "bob", expiresAt: now.addingTimeInterval(1000), now: now.addingTimeInterval(1))
        let forCarol = try store.enqueueText("for carol", to: "carol", expiresAt: now.addingTimeInterval(10), now: now)

        #expect(try store.contactsWithPendingItems(now: now).map(\.name) == ["bob", "carol"])
        #expect(try store.pendingItems(for: bob, now: now).map(\.id) == [soon.id, later.id])
        #expect(try store.pendingItems(for: carol, now: now).map(\.id) == [forCarol.id])

        let afterExpiry = now.addingTimeInterval(20)
        #expect(try store.pendingItems(for: bob, now: afterExpiry).map(\.id) == [later.id])
        #expect(try store.contactsWithPendingItems(now: afterExpiry).map(\.name) == ["bob"])
        let swept = try store.sweepExpired(now: afterExpiry)
        #expect(Set(swept.map(\.id)) == [soon.id, forCarol.id])
        #expect(try store.outbox().map(\.id) == [later.id])

        try store.markRefused(later.id, reason: "test")
        #expect(try store.pendingItems(for: bob, now: now).isEmpty)
        #expect(try store.contactsWithPendingItems(now: now).isEmpty)
    }

    @Test("committing a received item is idempotent per sender")
    func idempotentInbox() throws {
        let temporary = TemporaryHome()
        let store = try NodeStore(home: temporary.home)
        let alice = try store.addContact(name: "alice", publicKey: randomPublicKey())
        let text = Array("hi there".utf8)
        let offer = ItemOffer(id: UUID(), kind: .text, size: UInt64(text.count), sha256: Array(SHA256.hash(data: text)),
                              createdMilliseconds: 1, expiresMilliseconds: UInt64.max / 2, name: "")
        let partial = store.partialPath(for: offer.id, from: alice)
        try Data(text).write(to: URL(fileURLWithPath: partial))
        guard case .stored(let item) = try store.commitReceived(offer, from: alice) else { Issue.record("not stored"); return }
        #expect(item.text == "hi there")
        #expect(item.fromContact == "alice")
        #expect(!FileManager.default.fileExists(atPath: partial))
        try Data(text).write(to: URL(fileURLWithPath: partial))
        #expect(try store.commitReceived(offer, from: alice) == .alreadyStored)
        #expect(try store.inbox().count == 1)
        #expect(try store.inboxContains(offer.id, from: alice))

        let invalid = ItemOffer(id: UUID(), kind: .text, size: 2, sha256: [], createdMilliseconds: 1,
                                expiresMilliseconds: 2, name: "")
        try Data([0xC3, 0x28]).write(to: URL(fileURLWithPath: store.partialPath(for: invalid.id, from: alice)))
        #expect(try store.commitReceived(invalid, from: alice) == .invalidText)
        #expect(try store.inbox().count == 1)
    }

    @Test("removing a contact drops its queued items and their files, and keeps the inbox")
    func removeContactCascades() throws {
        let temporary = TemporaryHome()
        let store = try NodeStore(home: temporary.home)
        try store.addContact(name: "bob", publicKey: randomPublicKey())
        let source = temporary.home.path + "/f.txt"
        try Data("file".utf8).write(to: URL(fileURLWithPath: source))
        let item = try store.enqueueFile(at: source, to: "bob", expiresAt: Date().addingTimeInterval(60))
        let bob = try store.contact(named: "bob")
        let partial = store.partialPath(for: UUID(), from: bob)
        try Data("half".utf8).write(to: URL(fileURLWithPath: partial))
        let text = Array("kept".utf8)
        let offer = ItemOffer(id: UUID(), kind: .text, size: UInt64(text.count), sha256: Array(SHA256.hash(data: text)),
                              createdMilliseconds: 1, expiresMilliseconds: UInt64.max / 2, name: "")
        try Data(text).write(to: URL(fileURLWithPath: store.partialPath(for: offer.id, from: bob)))
        _ = try store.commitReceived(offer, from: bob)
        try store.removeContact(named: "bob")
        #expect(try store.outbox().isEmpty)
        #expect(!FileManager.default.fileExists(atPath: item.filePath ?? ""))
        #expect(!FileManager.default.fileExists(atPath: partial))
        #expect(try store.inbox().compactMap(\.text) == ["kept"])
    }

    @Test("a batch of texts commits in one durable transaction, in order, idempotent per sender; delivered items leave in one")
    func textBatchCommit() throws {
        let pair = try NodePair(limits: DeliveryLimits())
        let now = DeliveryClock.nowMilliseconds
        let offers = (0..<3).map { index in
            ItemOffer(id: UUID(), kind: .text, size: 1, sha256: Array(SHA256.hash(data: [UInt8(65 + index)])),
                      createdMilliseconds: now, expiresMilliseconds: now + 60_000, name: "")
        }
        let before = pair.bob.durableCommits.withLockedValue { $0 }
        let first = try pair.bob.commitReceivedTexts([(offers[1], "B")], from: pair.aliceAtBob)
        #expect(first.count == 1 && first.allSatisfy { if case .stored = $0 { true } else { false } })
        let batch = try pair.bob.commitReceivedTexts(offers.enumerated().map { ($1, String(UnicodeScalar(UInt8(65 + $0)))) },
                                                     from: pair.aliceAtBob)
        #expect(batch.map { if case .stored = $0 { "stored" } else { "\($0)" } } == ["stored", "alreadyStored", "stored"])
        #expect(pair.bob.durableCommits.withLockedValue { $0 } - before == 2)
        #expect(try pair.bob.inbox().compactMap(\.text).sorted() == ["A", "B", "C"])

        let queued = try (0..<3).map { try pair.alice.enqueueText("t\($0)", to: "bob", expiresAt: Date().addingTimeInterval(60)).id }
        try pair.alice.markDelivered(Array(queued.prefix(2)))
        #expect(try pair.alice.outbox().map(\.id) == [queued[2]])
    }
}
