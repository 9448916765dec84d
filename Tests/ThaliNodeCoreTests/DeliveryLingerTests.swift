import Foundation
import NIOConcurrencyHelpers
import Testing
import ThaliTestSupport
@testable import ThaliNodeCore

/// Version 5: a session lingers once everything is answered, and an item queued meanwhile goes on it at
/// once instead of through a new announcement, fetch, match and connection (issue 38: a text to a
/// connected contact cost 6-9 round trips that way).
@Suite("Delivery sessions linger", .serialized, .timeLimit(.minutes(1)))
struct DeliveryLingerTests {
    static func texts(in summary: Result<DeliverySender.Summary, any Error>) throws -> Int { try summary.get().delivered.count }

    @Test("an item queued while a version 5 session lingers is offered on it; done follows once the linger passed with nothing new")
    func itemQueuedDuringTheLinger() async throws {
        let limits = DeliveryLimits(lingerInterval: .seconds(2))
        let pair = try NodePair(limits: limits)
        _ = try pair.alice.enqueueText("first", to: "bob", expiresAt: Date().addingTimeInterval(600))
        let newItems = LinkWakeSignal()
        let session = Task { try await deliverOverTCP(pair, limits: limits, newItems: newItems) }
        // The sender waits on the signal only once the first text is answered.
        #expect(try await waitUntil(timeout: .seconds(20)) { newItems.isWaiting }, "the session lingers")
        #expect(try pair.bob.inbox().map { $0.text } == ["first"])
        _ = try pair.alice.enqueueText("second", to: "bob", expiresAt: Date().addingTimeInterval(600))
        newItems.signal()
        let outcome = try await session.value
        #expect(try Self.texts(in: outcome.sender) == 2, "both texts went on the one session")
        #expect(try outcome.receiver.get().received.count == 2)
        #expect(try pair.bob.inbox().map { $0.text } == ["first", "second"])
        #expect(try pair.alice.outbox().isEmpty)
    }

    @Test("a receiver that states no linger, and a sender that cannot hear of new items, end with done at once")
    func noLinger() async throws {
        for (receiverLinger, signalled) in [(Duration.zero, true), (.seconds(30), false)] {
            let pair = try NodePair(limits: DeliveryLimits())
            _ = try pair.alice.enqueueText("only", to: "bob", expiresAt: Date().addingTimeInterval(600))
            let newItems = LinkWakeSignal()
            let waited = NIOLockedValueBox(false)
            let watcher = Task {
                while !Task.isCancelled {
                    if newItems.isWaiting { waited.withLockedValue { $0 = true } }
                    try? await Task.sleep(for: .milliseconds(2))  // polling the signal's state, which has no event
                }
            }
            let outcome = try await deliverOverTCP(pair, limits: DeliveryLimits(lingerInterval: .seconds(30)),
                                                   receiverLimits: DeliveryLimits(lingerInterval: receiverLinger),
                                                   newItems: signalled ? newItems : nil)
            watcher.cancel()
            #expect(try Self.texts(in: outcome.sender) == 1)
            #expect(!waited.withLockedValue { $0 }, "linger \(receiverLinger), signal \(signalled): the sender did not wait")
        }
    }

    /// Whether `peer`'s delivery session with `contact` lingers now.
    static func lingers(_ peer: ThaliPeer, with contact: String, in pair: PeerStreamsTests.Pair) throws -> Bool {
        let key = try pair.people[contact].publicKey
        return peer.state.withLockedValue { $0.lingeringWith[key] != nil }
    }

    @Test("between two peers, texts sent after the first delivery reach the contact over the session already open, unannounced")
    func peersDeliverOverTheOpenSession() async throws {
        let pair = try PeerStreamsTests.Pair(label: "linger")
        let bob = try pair.make("bob") {
            $0.outboxPollInterval = .seconds(600)
            $0.minimumAnnouncementInterval = .zero  // an announcement for "two" would go out at once
        }
        try pair.make("alice")
        try await pair.startAll()
        try await bob.send(text: "one", to: "alice")
        try await pair.waitForDelivery(from: "bob", to: "alice")
        #expect(try await waitUntil(timeout: .seconds(10)) { try Self.lingers(bob, with: "alice", in: pair) })
        try await bob.send(text: "two", to: "alice")
        // Queued by another process (what `thali-node send` does), then the node told (its nudge).
        _ = try NodeStore(home: try pair.people["bob"].home).enqueueText("three", to: "alice", expiresAt: Date().addingTimeInterval(600))
        bob.storeChanged()
        #expect(try await waitUntil(timeout: .seconds(20)) { (try? pair.people.inbox(of: "alice").count) == 3 })
        let connects = pair.picked("alice") { event -> Bool? in
            if case .connected("bob", .connecting, _, _) = event { true } else { nil }
        }
        let announced = pair.picked("bob") { event -> Bool? in
            if case .advertising(let contacts) = event, contacts == ["alice"] { true } else { nil }
        }
        await pair.stopAll()
        #expect(try pair.people["alice"].store.inbox().compactMap(\.text).sorted() == ["one", "three", "two"])
        #expect(connects.count == 1, "all three went over the first session: \(connects.count) connections")
        #expect(announced.count == 1, "only the first text was announced: \(announced.count) announcements")
    }

    @Test("when the lingering session ends, what it did not carry is announced again")
    func announcedAgainOnceTheSessionEnds() async throws {
        let pair = try PeerStreamsTests.Pair(label: "linger-end")
        let bob = try pair.make("bob") { $0.outboxPollInterval = .seconds(600) }
        let alice = try pair.make("alice")
        try await pair.startAll()
        try await bob.send(text: "one", to: "alice")
        try await pair.waitForDelivery(from: "bob", to: "alice")
        #expect(try await waitUntil(timeout: .seconds(10)) { try Self.lingers(bob, with: "alice", in: pair) })
        // Queued by another process with no nudge, and the store check 10 minutes away: the session does not
        // hear of it, and nothing else would announce it.
        _ = try NodeStore(home: try pair.people["bob"].home).enqueueText("two", to: "alice", expiresAt: Date().addingTimeInterval(600))
        await alice.stop()
        let announced = try await PeerStreamsTests.waitUntil(seconds: 10) { () -> Int? in
            let count = pair.picked("bob") { event -> Bool? in
                if case .advertising(let contacts) = event, contacts == ["alice"] { true } else { nil }
            }.count
            return count >= 2 ? count : nil
        }
        #expect(try !Self.lingers(bob, with: "alice", in: pair))
        await pair.stopAll()
        #expect(announced == 2, "the text the session did not carry is announced once it ended")
    }
}
