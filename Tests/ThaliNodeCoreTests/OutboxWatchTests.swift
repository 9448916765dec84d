import Foundation
import NIOConcurrencyHelpers
import Testing
@testable import ThaliNodeCore

/// A running peer reads its store only when something was committed to it (by itself or by another
/// process, as `thali-node send` does) or when time alone changes what it advertises; an idle peer's
/// once-a-second read was a quarter of a crowd's CPU (issue 24).
@Suite("The peer watches its outbox", .serialized, .timeLimit(.minutes(1)))
struct OutboxWatchTests {
    @Test("the store's change stamp moves with every commit, from this connection or another, and only then")
    func changeStampMovesWithCommits() throws {
        let people = try TestPeople(["alice", "bob"], label: "stamp")
        let alice = try people["alice"]
        let first = alice.store.changeStamp()
        #expect(alice.store.changeStamp() == first, "nothing committed")
        _ = try alice.store.outbox()
        #expect(alice.store.changeStamp() == first, "a read commits nothing")
        _ = try alice.store.enqueueText("one", to: "bob", expiresAt: Date().addingTimeInterval(60))
        let second = alice.store.changeStamp()
        #expect(second != first)
        // Another connection to the same file: what `send` in another process is.
        let other = try NodeStore(home: alice.home)
        _ = try other.enqueueText("two", to: "bob", expiresAt: Date().addingTimeInterval(60))
        #expect(alice.store.changeStamp() != second)
    }

    @Test("a stamp taken within the settle time of a commit is not trusted")
    func settling() throws {
        let stamp = NodeStore.ChangeStamp(files: [5_000_000_000, 4096, 7_000_000_000, 0])
        #expect(!stamp.isSettled(now: 7_000_000_000 + NodeStore.ChangeStamp.settleTime - 1))
        #expect(stamp.isSettled(now: 7_000_000_000 + NodeStore.ChangeStamp.settleTime))
    }

    @Test("an item queued by another process is advertised, and stops being advertised when it expires")
    func itemFromAnotherProcessAndItsExpiry() async throws {
        let people = try TestPeople(["alice", "bob"], label: "outbox-watch")
        let alice = try loopbackPeer(people["alice"], ssdpPort: randomSSDPPort()) {
            $0.outboxPollInterval = .milliseconds(100)
        }
        let events = alice.events()
        try await alice.start()
        let other = try NodeStore(home: try people["alice"].home)
        // The item lives 3 s: the peer must read the store (every 100 ms here) before it expires, which a
        // loaded machine delayed past 1.5 s once.
        _ = try other.enqueueText("from send", to: "bob", expiresAt: Date().addingTimeInterval(3))
        let advertised = NIOLockedValueBox<[[String]]>([])
        _ = try await withTimeout(.seconds(10)) {
            for await event in events {
                guard case .advertising(let contacts) = event else { continue }
                let count = advertised.withLockedValue { $0.append(contacts); return $0.count }
                if contacts.isEmpty, count > 1 { break }
            }
        }
        let seen = advertised.withLockedValue { $0 }
        await alice.stop()
        #expect(seen.first == ["bob"], "the queued item is advertised: \(seen)")
        #expect(seen.last == [], "and withdrawn once it expired, with no commit in between: \(seen)")
    }

    @Test("an item queued by another process is read at once when the peer is told its store changed, not at the next poll")
    func nudgeReadsTheStoreAtOnce() async throws {
        let people = try TestPeople(["alice", "bob"], label: "outbox-nudge")
        // No poll and no rotation within the test: only the nudge can make the peer read the store.
        let alice = try loopbackPeer(people["alice"], ssdpPort: randomSSDPPort()) {
            $0.outboxPollInterval = .seconds(600)
            $0.announcementRotationInterval = .seconds(600)
        }
        let events = alice.events()
        try await alice.start()
        let other = try NodeStore(home: try people["alice"].home)
        _ = try other.enqueueText("from send", to: "bob", expiresAt: Date().addingTimeInterval(600))
        alice.storeChanged()
        let advertised = try await withTimeout(.seconds(10)) { () -> [String] in
            for await event in events {
                if case .advertising(let contacts) = event, !contacts.isEmpty { return contacts }
            }
            return []
        }
        await alice.stop()
        #expect(advertised == ["bob"])
    }

    /// Two sends in quick succession from another process: the second's nudge comes while the check the
    /// first's started is running, and that check may have read the store before the second commit. The
    /// peer must read it again at once, not at its next poll (600 s here).
    @Test("a nudge that comes while a store check runs gets a check of its own as soon as that one ends")
    func nudgeDuringACheckIsNotLost() async throws {
        let names = (0..<8).map { "contact\($0)" }
        let people = try TestPeople(["alice"] + names, label: "nudge-during")
        let alice = try loopbackPeer(people["alice"], ssdpPort: randomSSDPPort()) {
            $0.outboxPollInterval = .seconds(600)
            $0.announcementRotationInterval = .seconds(600)
            $0.minimumAnnouncementInterval = .zero
            $0.maxAdvertisedContacts = 1000
        }
        let other = try NodeStore(home: try people["alice"].home)
        let expiry = Date().addingTimeInterval(600)
        // 200 more contacts with an item each: every check then makes 200 beacons, so a check lasts long
        // enough for the second nudge of a pair to land inside it.
        for index in 0..<200 {
            let contact = try other.addContact(name: "waiting\(index)", publicKey: randomPublicKey())
            _ = try other.enqueueText("waiting", to: contact.name, expiresAt: expiry)
        }
        let events = alice.events()
        try await alice.start()
        // Pairs of sends, back to back: the first's check is what the second's nudge meets.
        for pair in stride(from: 0, to: names.count, by: 2) {
            _ = try other.enqueueText("first", to: names[pair], expiresAt: expiry)
            alice.storeChanged()
            // Long enough for the check to have read the store, short of its 200 beacons (which take more
            // than 100 ms); should it fall outside the check, the pair passes with or without the fix.
            try await Task.sleep(for: .milliseconds(pair % 4 == 0 ? 20 : 40))
            _ = try other.enqueueText("second", to: names[pair + 1], expiresAt: expiry)
            alice.storeChanged()
            let wanted = Set(names[...(pair + 1)])
            let seen = try await withTimeout(.seconds(10)) { () -> Set<String> in
                for await event in events {
                    if case .advertising(let contacts) = event, Set(contacts).isSuperset(of: wanted) { return Set(contacts) }
                }
                return []
            }
            #expect(seen?.isSuperset(of: wanted) == true, "after pair \(pair / 2): \(String(describing: seen))")
        }
        await alice.stop()
    }
}
