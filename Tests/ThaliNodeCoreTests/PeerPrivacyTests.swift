import Foundation
import NIOConcurrencyHelpers
import Testing
@testable import ThaliNodeCore

/// A peer answers only beacons meant for it: in process, on loopback, Alice holds an item for Bob;
/// Mallory knows Alice's key (she is Mallory's contact) but Alice holds nothing for her.
@Suite("Peer privacy", .serialized)
struct PeerPrivacyTests {
    @Test("only the contact a beacon is for matches it and connects; the other peer stays silent")
    func onlyTheAddresseeConnects() async throws {
        let people = try TestPeople(["alice", "bob", "mallory"], label: "privacy")
        let item = try people["alice"].store.enqueueText("for bob", to: "bob", expiresAt: Date().addingTimeInterval(600))
        let ssdpPort = randomSSDPPort()
        let events = NIOLockedValueBox<[(String, PeerEvent)]>([])
        var peers: [ThaliPeer] = []
        for name in ["alice", "bob", "mallory"] {
            var configuration = PeerConfiguration(interfaceAddress: "127.0.0.1")
            configuration.ssdpPort = ssdpPort
            let person = try people[name]
            peers.append(try ThaliPeer(store: person.store, identity: person.key, configuration: configuration,
                                       logger: quietLogger, events: { event in events.withLockedValue { $0.append((name, event)) } }))
        }
        for peer in peers { try await peer.start() }
        let clock = ContinuousClock()
        let end = clock.now + .seconds(15)
        _ = try await waitUntil(timeout: .seconds(15), every: .milliseconds(50)) {
            try people["bob"].store.inboxContains(item.id, from: people["bob"].store.contact(named: "alice"))
        }
        // Mallory hears the same announcements: wait until she has read Alice's beacons (only Alice
        // announces, she alone has an item), so that the silence asserted below follows a real read.
        let mallory = peers[2]
        let malloryFetches = try await waitForValue(timeout: end + .seconds(10) - clock.now, every: .milliseconds(50)) {
            let fetches = await mallory.status().discovery.beaconFetches
            return fetches > 0 ? fetches : nil
        } ?? 0
        for peer in peers { await peer.stop() }
        #expect(malloryFetches >= 1, "Mallory never read Alice's beacons: the test would prove nothing")

        let log = events.withLockedValue { $0 }
        #expect(try people.inbox(of: "bob").map(\.id) == [item.id])
        #expect(try people.inbox(of: "mallory").isEmpty)
        #expect(log.contains { who, event in
            if who == "mallory", case .peerAppeared = event { return true } else { return false }
        })
        let malloryActed = log.contains { who, event in
            guard who == "mallory" else { return false }
            switch event {
            case .beaconMatched, .connecting, .connected, .delivery: return true
            default: return false
            }
        }
        #expect(!malloryActed)
        #expect(!log.contains { who, event in
            if who == "alice", case .connected("mallory", _, _, _) = event { return true } else { return false }
        })
    }
}
