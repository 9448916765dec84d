import Foundation
import NIOConcurrencyHelpers
import Testing
import ThaliNodeTestSupport
import ThaliTestSupport
@testable import ThaliNodeCore

/// Each new announcement makes every listening contact fetch it (a connection to our port that its
/// admission counts), so a burst of sends must not announce once per send (issue 38: with sends
/// announced at once, a listener that fetched every announcement was refused by our port).
@Suite("Announcements are paced", .serialized, .timeLimit(.minutes(1)))
struct AnnouncementPacingTests {
    @Test("a burst of sends gets one announcement at once and one more after the minimum interval")
    func burstOfSends() async throws {
        let people = try TestPeople(["alice", "bob"], label: "pacing")
        let interval = Duration.seconds(2)
        let alice = try loopbackPeer(people["alice"], ssdpPort: randomSSDPPort()) {
            $0.minimumAnnouncementInterval = interval
            $0.outboxPollInterval = .seconds(600)  // only the sends themselves ask for announcements
        }
        let events = alice.events()
        try await alice.start()
        let announced = NIOLockedValueBox<[ContinuousClock.Instant]>([])
        let watcher = Task {
            for await event in events {
                guard case .advertising(let contacts) = event, contacts == ["bob"] else { continue }
                announced.withLockedValue { $0.append(.now) }
            }
        }
        defer { watcher.cancel() }
        try await alice.send(text: "first", to: "bob")
        #expect(try await waitUntil(timeout: .seconds(10)) { announced.withLockedValue { $0.count } >= 1 })
        for index in 2...5 { try await alice.send(text: "text \(index)", to: "bob") }
        // Half the interval: without pacing each send above had announced by now.
        try await Task.sleep(for: interval / 2)  // the wait is the behaviour under test
        let early = announced.withLockedValue { $0.count }
        _ = try await waitUntil(timeout: .seconds(10)) { announced.withLockedValue { $0.count } >= 2 }
        // A little longer than the interval: a third announcement would show up here.
        try await Task.sleep(for: interval + .milliseconds(500))  // the wait is the behaviour under test
        let times = announced.withLockedValue { $0 }
        await alice.stop()
        #expect(early == 1, "four sends right after an announcement announce nothing at once: \(early)")
        #expect(times.count == 2, "the four sends share one announcement: \(times.count)")
        if times.count >= 2 {
            #expect(times[1] - times[0] >= interval - .milliseconds(50), "the second waits for the interval: \(times[1] - times[0])")
        }
    }
}
