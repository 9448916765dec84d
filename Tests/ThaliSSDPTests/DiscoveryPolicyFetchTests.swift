import NIOCore
import Testing

@testable import ThaliSSDP

/// Discovery's policy on values in virtual time: fetch scheduling (spread, queue, contacts first, busy
/// answers, retries), the per-source fetch budget and the last resort against blocked unicast, with its
/// spans, inbound proof and starvation check (`spec/ssdp.md` §5, §6.1, §7, §7.2).
@Suite("Discovery policy: fetching and last resorts")
struct DiscoveryPolicyFetchTests {
    func configuration(_ change: (inout SSDPDiscoveryConfiguration) -> Void = { _ in }) -> SSDPDiscoveryConfiguration {
        var configuration = SSDPDiscoveryConfiguration(interfaceAddress: "10.0.0.1")
        change(&configuration)
        return configuration
    }

    /// Three sources, 10.0.0.`first` and the two after, whose fetches fail to connect, refetched every
    /// 100 ms; `threshold` 3 is enough for the last resort.
    func refetching(_ change: (inout SSDPDiscoveryConfiguration) -> Void = { _ in }) -> SSDPDiscoveryConfiguration {
        configuration {
            $0.limits.unicastFailureThreshold = 3
            $0.limits.failedFetchRetryDelay = .milliseconds(100)
            $0.limits.maxFailedFetchRetryDelay = .milliseconds(100)
            $0.limits.sourceFetchFailureThreshold = 1000  // keep fetching them
            change(&$0)
        }
    }

    /// One round of 10.0.0.`first`...`first + 2` announcing: `step` passes, then every fetch made fails with `outcome`.
    func failingRound(_ driver: inout PolicyDriver, first: Int = 31, step: TimeAmount = .milliseconds(100),
                      outcome: SSDPDiscoveryPolicy.FetchOutcome = refused) throws {
        for index in 0..<3 { try driver.alive(usn(first + index), at: peerLocation("10.0.0.\(first + index)")) }
        driver.advance(by: step)
        driver.finishAllFetches(outcome)
    }

    @Test("USNs announced while a location's fetch waits out its spread: one timer, one fetch, of the newest")
    func usnChangesDuringTheSpreadFetchTheNewestOnce() throws {
        var driver = PolicyDriver(configuration {
            $0.limits.fetchSpreadPerPeer = .seconds(3)
            $0.limits.maxFetchSpread = .seconds(3)
        })
        let location = peerLocation("10.0.0.73")
        for index in 0..<5 { try driver.alive(usn(index), at: location) }
        let waits = driver.spreadTimers(of: location)
        #expect(waits.count == 1 && waits.allSatisfy { $0 < driver.now + .seconds(3) }, "one peer tracked: below 1 × 3 s")
        driver.advance(by: .seconds(3))
        #expect(driver.fetchesStarted == [usn(4)])
        driver.finishFetch(nil, .fetched([9]))
        driver.advance(by: .seconds(5))
        #expect(driver.delivered.map(\.serviceName) == [usn(4)] && driver.fetchesStarted.count == 1)
    }

    @Test("with the table full of strangers, a contact keeps its place, and its new beacons are fetched at once")
    func aContactIsReadInAFullTable() throws {
        var driver = PolicyDriver(configuration { $0.limits.maxTrackedPeers = 2 })
        let contact = peerLocation("10.0.0.81")
        try driver.alive(usn(1), at: contact)
        driver.advance(by: .milliseconds(20))
        driver.finishFetch(usn(1), .fetched([1]))
        driver.policy.markContact(host: contact.host)  // what the node does once they matched a contact
        try driver.alive(usn(2), at: peerLocation("10.0.0.82"))
        driver.advance(by: .milliseconds(30))
        driver.finishFetch(usn(2), .fetched([2]))
        // Strangers fill the table: the read stranger gives its place, although the contact was read first.
        try driver.alive(usn(3), at: peerLocation("10.0.0.83"))
        try driver.alive(usn(4), at: peerLocation("10.0.0.84"))
        #expect(driver.policy.counters.peersGivenUpAtCap == 1 && driver.policy.counters.peersRejectedAtCap == 1)
        #expect(driver.policy.peers.contains { $0.location == contact }, "the contact kept its place")
        // The contact has something new: fetched although the table is full, without waiting out a spread.
        try driver.alive(usn(5), at: contact)
        #expect(driver.spreadTimers(of: contact).isEmpty && driver.fetchesStarted.last == usn(5))
        driver.finishFetch(usn(5), .fetched([3]))
        #expect(driver.delivered.last?.bytes == [3])
    }

    @Test("a contact's fetch goes to the front of the queue, ahead of strangers' queued before it")
    func contactsGoFirst() throws {
        var driver = PolicyDriver(configuration {
            $0.limits.maxConcurrentFetches = 1
            $0.limits.fetchSpreadPerPeer = .zero  // in the order they were announced
        })
        try driver.alive(usn(1), at: peerLocation("10.0.0.1"))  // in flight, the only slot
        try driver.alive(usn(2), at: peerLocation("10.0.0.2"))
        driver.policy.markContact(host: "10.0.0.4")
        try driver.alive(usn(4), at: peerLocation("10.0.0.4"))
        driver.finishAllFetches(.fetched([0]))
        #expect(driver.fetchesStarted == [usn(1), usn(4), usn(2)])
    }

    @Test("USNs superseded while queued are not fetched; a full queue fails a fetch as not made")
    func supersededAndFullQueue() throws {
        var driver = PolicyDriver(configuration {
            $0.limits.maxConcurrentFetches = 1
            $0.limits.fetchSpreadPerPeer = .zero
            $0.limits.maxTrackedPeers = 2  // the queue holds as many
        })
        let (changing, newcomer) = (peerLocation("10.0.0.1"), peerLocation("10.0.0.2"))
        for index in 1...3 { try driver.alive(usn(index), at: changing) }  // usn(1) in flight, 2 and 3 queued
        try driver.alive(usn(4), at: newcomer)
        #expect(driver.events.last == .beaconFetchFailed(SSDPPeer(location: newcomer, uniqueServiceName: usn(4), beaconState: .failed),
                                                         BeaconFetchFailure(.notMade, "fetch queue full")))
        #expect(driver.policy.counters.beaconFetchFailuresByKind[.notMade] == 1)
        driver.finishAllFetches(.fetched([0]))
        #expect(driver.fetchesStarted == [usn(1), usn(3)], "usn(2) was superseded while queued")
        #expect(driver.delivered.map(\.serviceName) == [usn(3)], "usn(1)'s result came for a superseded USN")
    }

    @Test("a fetch that failed, or was skipped while its source was ignored, is fetched again on a later alive")
    func aFailedOrSkippedFetchIsRetried() throws {
        var driver = PolicyDriver(configuration {
            $0.limits.maxConcurrentFetches = 1
            $0.limits.fetchSpreadPerPeer = .zero
            $0.limits.sourceFetchFailureThreshold = 1
            $0.limits.unicastFailurePause = .milliseconds(600)
            $0.limits.failedFetchRetryDelay = .milliseconds(200)
        })
        let (down, up) = (peerLocation("10.0.0.72", port: 1000), peerLocation("10.0.0.72", port: 2000))
        try driver.alive(usn(1), at: down)
        try driver.alive(usn(2), at: up)  // queued behind the first
        driver.finishFetch(usn(1), .failed(BeaconFetchFailure(.responseTimedOut, "no answer")))
        // That failure ignores the host, so the queued fetch of the other location is not made.
        #expect(driver.events.last == .beaconFetchFailed(SSDPPeer(location: up, uniqueServiceName: usn(2), beaconState: .failed),
                                                         BeaconFetchFailure(.notMade, "source ignored")))
        #expect(driver.policy.counters.sourcesIgnoredForFetchFailures == 1
                && driver.policy.counters.fetchesSkippedForIgnoredSources == 1)
        driver.advance(by: .milliseconds(600))
        for _ in 0..<3 {
            try driver.alive(usn(1), at: down)
            try driver.alive(usn(2), at: up)
            driver.finishAllFetches(.fetched([8]))
            driver.advance(by: .milliseconds(100))
        }
        #expect(driver.fetchesStarted == [usn(1), usn(1), usn(2)], "each fetched once more, no more")
        #expect(driver.delivered.map(\.serviceName) == [usn(1), usn(2)])
    }

    @Test("one host whose locations are closed ports is ignored alone: its queued fetches are skipped, announcing goes on")
    func closedPortsOfOneHost() throws {
        var driver = PolicyDriver(configuration { $0.limits.fetchSpreadPerPeer = .zero }, advertising: true)
        for index in 0..<8 { try driver.alive(usn(index), at: peerLocation("10.0.0.61", port: 1000 + index)) }
        #expect(driver.fetches.count == 4)
        driver.finishAllFetches(refused)
        let counters = driver.policy.counters
        #expect(counters.sourcesIgnoredForFetchFailures == 1 && counters.fetchesSkippedForIgnoredSources == 2, "\(counters)")
        // Only those started before the host was ignored (the threshold plus the fetches in flight) failed.
        #expect(counters.beaconFetchesFailed == 6 && driver.fetchesStarted.count == 6, "\(counters)")
        #expect(counters.unicastFailurePauses == 0 && driver.policy.isAnnouncingPaused == false && driver.limitsTriggered.isEmpty)
    }

    @Test("when every unicast fails past the span announcing pauses: byebye, no alives, then the same USN again")
    func whenEveryUnicastFailsAnnouncementsPause() throws {
        var driver = PolicyDriver(configuration {
            $0.limits.unicastFailureThreshold = 3
            $0.limits.unicastFailureMinimumSpan = .milliseconds(1500)
            $0.limits.unicastFailurePause = .seconds(2)
            $0.limits.failedFetchRetryDelay = .milliseconds(300)
            $0.limits.sourceFetchFailureThreshold = 100  // keep fetching them
        }, advertising: true)
        let ours = driver.policy.serviceName
        try failingRound(&driver)
        let streakStart = driver.now
        #expect(Set(driver.events.compactMap { if case .beaconFetchFailed(let peer, _) = $0 { peer.location.host } else { nil } }).count == 3)
        #expect(driver.policy.isAnnouncingPaused == false, "three sources failed at once: a burst, not yet blocked unicast")
        while !driver.limitsTriggered.contains(.unicastFailure), driver.now - streakStart < .seconds(10) { try failingRound(&driver) }
        #expect(driver.limitsTriggered == [.unicastFailure])
        let pausedAt = driver.now
        #expect(pausedAt - streakStart >= .milliseconds(1500) && pausedAt - streakStart < .seconds(3))
        let counters = driver.policy.counters
        #expect(driver.policy.isAnnouncingPaused && counters.unicastFailurePauses == 1 && counters.byebyesSent == 1)
        #expect(counters.beaconFetchesFailed > 3 && counters.beaconFetchFailuresByKind[.noConnection] == counters.beaconFetchesFailed)
        let before = driver.alivesSent
        driver.advance(by: .milliseconds(1900))
        #expect(driver.alivesSent == before, "no alive during the pause")
        driver.advance(by: .milliseconds(600))
        #expect(driver.alivesSent > before && driver.policy.isAnnouncingPaused == false && driver.policy.serviceName == ours)
    }

    @Test("while peers reach us, failing connects do not pause announcing; once they stop, the failures do")
    func inboundUnicastShowsUnicastWorks() throws {
        var driver = PolicyDriver(refetching {
            $0.limits.unicastFailureMinimumSpan = .milliseconds(500)
            $0.limits.unicastFailureMinimumSpanOnceWorked = .milliseconds(500)
        }, advertising: true)
        for _ in 0..<30 {
            driver.inboundUnicast += 1  // a peer fetched our beacons
            try failingRound(&driver, first: 51)
        }
        #expect(driver.policy.counters.beaconFetchesFailed >= 24)
        #expect(driver.limitsTriggered.isEmpty && driver.policy.counters.unicastFailurePauses == 0)
        let lastReached = driver.now
        while !driver.limitsTriggered.contains(.unicastFailure), driver.now - lastReached < .seconds(10) {
            try failingRound(&driver, first: 51)
        }
        #expect(driver.limitsTriggered == [.unicastFailure])
        #expect(driver.now - lastReached >= .milliseconds(500), "a new streak started when the last peer reached us")
    }

    @Test("fetches that connected and failed, from any number of sources, never pause announcing; refused ones do")
    func connectedFailuresDoNotPause() throws {
        let instant = refetching { $0.limits.unicastFailureMinimumSpan = .zero }
        var closing = PolicyDriver(instant, advertising: true)
        try failingRound(&closing, first: 41, outcome: .failed(BeaconFetchFailure(.closedEarly, "closed")))
        #expect(closing.policy.counters.beaconFetchFailuresByKind[.closedEarly] == 3)
        #expect(closing.policy.counters.unicastFailurePauses == 0 && closing.policy.isAnnouncingPaused == false && closing.limitsTriggered.isEmpty)
        var refusing = PolicyDriver(instant, advertising: true)
        try failingRound(&refusing, first: 41)
        #expect(refusing.limitsTriggered == [.unicastFailure] && refusing.policy.counters.unicastFailurePauses == 1)
    }

    @Test("after one successful fetch, failing connects pause announcing only once the longer span has passed")
    func unicastThatWorkedNeedsTheLongerSpan() throws {
        var driver = PolicyDriver(refetching {
            $0.limits.unicastFailureMinimumSpan = .milliseconds(300)
            $0.limits.unicastFailureMinimumSpanOnceWorked = .seconds(3)
        }, advertising: true)
        try driver.alive(usn(9), at: peerLocation("10.0.0.60"))
        driver.advance(by: .milliseconds(20))
        driver.finishFetch(usn(9), .fetched([7]))
        try failingRound(&driver, first: 62)
        let streakStart = driver.now
        while driver.now - streakStart < .milliseconds(900) { try failingRound(&driver, first: 62) }
        #expect(driver.limitsTriggered.isEmpty, "well past the short span: not yet")
        while !driver.limitsTriggered.contains(.unicastFailure), driver.now - streakStart < .seconds(10) {
            try failingRound(&driver, first: 62)
        }
        #expect(driver.now - streakStart >= .seconds(3) && driver.now - streakStart < .milliseconds(3500))
        #expect(driver.policy.counters.unicastFailurePauses == 1)
    }

    @Test("failures while this peer's own event loop runs late start over instead of pausing announcing")
    func starvedLoopDoesNotPause() throws {
        var driver = PolicyDriver(refetching {
            $0.housekeepingInterval = .milliseconds(50)
            $0.limits.unicastFailureMinimumSpan = .milliseconds(400)
            $0.limits.unicastFailureStarvedLoopLag = .milliseconds(150)
        }, advertising: true)
        // The loop stops for 200 ms out of every 300, as a starved peer's does.
        for round in 0..<40 {
            if round % 3 == 0 { driver.stall(for: .milliseconds(200)) }
            try failingRound(&driver, first: 66, step: .milliseconds(50))
        }
        let counters = driver.policy.counters
        #expect(counters.unicastFailureStreaksStarved >= 2, "\(counters)")
        #expect(counters.unicastFailurePauses == 0 && driver.limitsTriggered.isEmpty)
        #expect(counters.worstLoopLagMilliseconds >= 150)
        // On time again, the same failures are blocked unicast: announcing pauses.
        for _ in 0..<40 where !driver.limitsTriggered.contains(.unicastFailure) {
            try failingRound(&driver, first: 66, step: .milliseconds(50))
        }
        #expect(driver.limitsTriggered == [.unicastFailure] && driver.policy.counters.unicastFailurePauses == 1)
    }

    @Test("a busy answer is honoured: no failure counted, its source not fetched again before Retry-After")
    func aBusyAnswerIsWaitedOut() throws {
        var driver = PolicyDriver(configuration {
            $0.limits.sourceFetchFailureThreshold = 1  // one failure would ignore the source
            $0.limits.unicastFailureThreshold = 1  // and pause our announcing
            $0.limits.unicastFailureMinimumSpan = .zero
        }, advertising: true)
        let location = peerLocation("10.0.0.91")
        try driver.alive(usn(1), at: location)
        driver.advance(by: .milliseconds(20))
        driver.finishFetch(usn(1), .busy(retryAfter: .seconds(1)))
        let busyAt = driver.now
        let counters = driver.policy.counters
        #expect(counters.busyAnswersReceived == 1 && counters.beaconFetchesFailed == 0, "\(counters)")
        #expect(counters.sourcesIgnoredForFetchFailures == 0 && counters.unicastFailurePauses == 0)
        #expect(!driver.events.contains { if case .beaconFetchFailed = $0 { true } else { false } })
        #expect(driver.spreadTimers(of: location).allSatisfy { $0 >= busyAt + .seconds(1) })
        // Meanwhile it announces a new USN, and another location of the same host appears: neither is
        // fetched before the Retry-After.
        try driver.alive(usn(2), at: location)
        try driver.alive(usn(3), at: peerLocation("10.0.0.91", port: 2000))
        driver.advance(by: .milliseconds(999))
        #expect(driver.fetchesStarted == [usn(1)])
        driver.advance(by: .milliseconds(100))
        #expect(Set(driver.fetchesStarted.dropFirst()) == [usn(2), usn(3)], "the USN current when the wait ended")
        driver.finishAllFetches(.fetched([9]))
        #expect(driver.delivered.map(\.serviceName).sorted() == [usn(2), usn(3)])
    }

    @Test("a client's fetch error becomes a busy outcome, or a failure of its kind")
    func fetchOutcomes() {
        let location = peerLocation("10.0.0.1")
        typealias Outcome = SSDPDiscoveryPolicy.FetchOutcome
        #expect(Outcome(.success([1])) == .fetched([1]))
        #expect(Outcome(.failure(BeaconFetchError(reason: .busy(retryAfter: .seconds(2)), location: location, attempts: 1)))
            == .busy(retryAfter: .seconds(2)))
        let refusedError = BeaconFetchError(reason: .connectFailed("refused"), location: location, attempts: 3)
        #expect(Outcome(.failure(refusedError)) == refusedError.failure.map(Outcome.failed))
        #expect(refusedError.failure?.kind == .noConnection)
    }
}
