import Foundation
import Testing
import ThaliProcess
@testable import ThaliNodeCore

/// The store's rows stay behind its API: values come back as ``OutboxItem`` and ``InboxItem`` with
/// dates, and a row another program wrote with a value this version does not know is a clear error
/// naming the table, the column and the value, not a crash.
@Suite("Store rows")
struct StoreRowTests {
    @Test("dates round-trip through the rows to the millisecond")
    func datesRoundTrip() throws {
        let temporary = TemporaryHome()
        let store = try NodeStore(home: temporary.home)
        let added = Date(timeIntervalSince1970: 1_790_000_000.123)
        let contact = try store.addContact(name: "bob", publicKey: randomPublicKey(), now: added)
        #expect(contact.addedAt == added)
        #expect(try store.contacts().map(\.addedAt) == [added])
        let expires = added.addingTimeInterval(3600.5)
        let item = try store.enqueueText("hi", to: "bob", expiresAt: expires, now: added)
        #expect(item.createdAt == added && item.expiresAt == expires)
        #expect(try store.outbox().map(\.expiresAt) == [expires])
    }

    @Test("a row with a kind or state this version does not know is a typed error")
    func unknownStoredValues() throws {
        let python = try #require(ChildProcess.which("python3"), "python3 writes the database as another program would")
        let temporary = TemporaryHome()
        let store = try NodeStore(home: temporary.home)
        try store.addContact(name: "bob", publicKey: randomPublicKey())
        try store.enqueueText("hi", to: "bob", expiresAt: Date().addingTimeInterval(3600))
        let edit = { (sql: String) throws in
            let script = "import sqlite3, sys\nc = sqlite3.connect(sys.argv[1])\nc.execute(sys.argv[2])\nc.commit()"
            let result = try ChildProcess.run(python, ["-c", script, temporary.home.databasePath, sql], timeout: .seconds(20))
            #expect(result.status == 0, "\(result.output)")
        }
        try edit("UPDATE outboxItem SET state = 'lost'")
        #expect(throws: UnknownStoredValue.self) { try store.outbox() }
        try edit("UPDATE outboxItem SET state = 'pending', kind = 'video'")
        do {
            _ = try store.outbox()
            Issue.record("an unknown kind was read as an item")
        } catch let error as UnknownStoredValue {
            #expect((error.table, error.column, error.value) == ("outboxItem", "kind", "video"))
            #expect(error.description.contains("\"video\""))
        }
        // The store still answers what it can.
        #expect(try store.contacts().map(\.name) == ["bob"])
    }
}
