import Foundation
import Testing
@testable import ThaliNodeCore
import ThaliSupport

@Suite("Node store: items a receiver cannot hold now")
struct NodeStoreDeferralTests {
    @Test("a deferred item stays pending with its words, is skipped until its retry time (across a reopen), then is due again; the wait grows")
    func deferral() throws {
        let temporary = TemporaryHome()
        let start = Date()
        let backoff = Backoff(base: .seconds(30), factor: 2, cap: .seconds(1800))
        let (fileID, textID): (UUID, UUID)
        do {
            let store = try NodeStore(home: temporary.home)
            let carol = try store.addContact(name: "carol", publicKey: randomPublicKey())
            let path = temporary.home.path + "/big.iso"
            try Data(repeating: 7, count: 4096).write(to: URL(fileURLWithPath: path))
            fileID = try store.enqueueFile(at: path, to: "carol", expiresAt: start.addingTimeInterval(86_400), now: start).id
            textID = try store.enqueueText("hello", to: "carol", expiresAt: start.addingTimeInterval(86_400), now: start).id
            #expect(try store.nextRetryTime(now: start) == nil)

            let wait = try store.deferItem(fileID, backoff: backoff, now: start) { "carol cannot hold it now; offered again in \(ByteWords.duration($0))" }
            #expect(wait == .seconds(30))
            let item = try #require(try store.outboxItem(id: fileID))
            #expect(item.state == .pending)
            #expect(item.lastError == "carol cannot hold it now; offered again in 30 s")
            // Not due: the text alone is offered; the contact is still advertised for the text.
            #expect(try store.pendingItems(for: carol, now: start).map(\.id) == [textID])
            #expect(try store.contactsWithPendingItems(now: start).map(\.name) == ["carol"])
            #expect(try store.nextRetryTime(now: start)?.millisecondsSinceEpoch == start.addingTimeInterval(30).millisecondsSinceEpoch)
            try store.markDelivered(textID)
            // With only the waiting item left, nothing is advertised for carol until its time.
            #expect(try store.contactsWithPendingItems(now: start).isEmpty)
        }
        // The retry time survives a reopen (another process, a restart).
        let store = try NodeStore(home: temporary.home)
        let carol = try store.contact(named: "carol")
        #expect(try store.pendingItems(for: carol, now: start.addingTimeInterval(29)).isEmpty)
        #expect(try store.retryTime(of: fileID).refusals == 1)
        let due = start.addingTimeInterval(30)
        #expect(try store.pendingItems(for: carol, now: due).map(\.id) == [fileID])
        #expect(try store.contactsWithPendingItems(now: due).map(\.name) == ["carol"])
        #expect(try store.nextRetryTime(now: due) == nil)
        // Refused again: the wait doubles, up to the cap.
        #expect(try store.deferItem(fileID, backoff: backoff, now: due) { _ in "again" } == .seconds(60))
        #expect(try store.pendingItems(for: carol, now: due.addingTimeInterval(59)).isEmpty)
        #expect(try store.pendingItems(for: carol, now: due.addingTimeInterval(60)).map(\.id) == [fileID])
        for _ in 0..<10 { try store.deferItem(fileID, backoff: backoff, now: due) { _ in "again" } }
        #expect(try store.deferItem(fileID, backoff: backoff, now: due) { _ in "again" } == .seconds(1800))
        #expect(try store.retryTime(of: fileID).refusals == 13)
        // An item no longer queued is left alone.
        #expect(try store.deferItem(UUID(), backoff: backoff, now: due) { _ in "gone" } == .seconds(30))
    }
}
