import NIOCore
import NIOPosix
import Testing

@testable import ThaliSSDP

/// What keeps a crowd of honest peers out of each other's last resorts (issue 24): a busy beacon server
/// answers a cheap "later" that the fetcher honours without counting a failure (`spec/ssdp.md` 6.1), and
/// a peer whose beacons matched a contact keeps its place and its fetches ahead of strangers when the
/// table narrows (7.2).
@Suite("Busy answers and contacts first", .serialized)
struct CrowdCourtesyTests {
    let group = MultiThreadedEventLoopGroup.singleton
    let start = NIODeadline.uptimeNanoseconds(1_000_000_000)

    /// A server whose first request in a window fills its busy budget.
    func busyServer(host: String, window: TimeAmount, retryAfter: TimeAmount) -> BeaconHTTPServer {
        var limits = BeaconHTTPServerLimits()
        limits.busyRequestsGlobal = 1
        limits.globalWindow = window
        limits.maxBusyRetryAfter = retryAfter
        return BeaconHTTPServer(host: host, limits: limits, group: group)
    }

    @Test("a server past its busy budget answers 503 with Retry-After, and the client reports busy after one attempt")
    func aBusyServerAnswersLater() async throws {
        let server = busyServer(host: "127.0.0.1", window: .seconds(30), retryAfter: .seconds(3))
        server.setBeacons([1, 2, 3])
        let location = BeaconLocation(host: "127.0.0.1", port: try await server.start())
        let client = BeaconHTTPClient(group: group)
        #expect(try await client.fetch(location) == [1, 2, 3])
        do {
            let bytes = try await client.fetch(location)
            Issue.record("served while busy: \(bytes)")
        } catch {
            guard case .busy(let wait) = error.reason else { throw error }
            #expect((1...3).contains(wait.nanoseconds / 1_000_000_000), "Retry-After within 1...maxBusyRetryAfter: \(wait)")
            #expect(error.attempts == 1, "a busy answer is not retried at once")
        }
        #expect(server.counters.answeredBusy == 1)
        #expect(server.counters.requestsAnswered == 1, "the busy answer served no stream")
        #expect(server.admissionCounters.busyAnswers == 1)
        await server.stop()
    }

    @Test("Retry-After is read as whole seconds, bounded; anything else is the default wait")
    func retryAfterIsBounded() {
        let wait = BeaconHTTPClientConfiguration().busyWait
        #expect(wait("7") == .seconds(7))
        #expect(wait(" 2 ") == .seconds(2))
        #expect(wait(nil) == .seconds(5))
        #expect(wait("Wed, 21 Oct 2015 07:28:00 GMT") == .seconds(5))
        #expect(wait("-3") == .seconds(5))
        #expect(wait("99999999999") == .seconds(60), "a day is cut to maxBusyRetryAfter")
    }

    @Test("discovery honours a busy answer: no failure counted, its source not fetched again before Retry-After")
    func discoveryWaitsOutABusyAnswer() async throws {
        let host = "127.0.0.91"
        let server = busyServer(host: host, window: .seconds(3), retryAfter: .seconds(1))
        server.setBeacons([9])
        let location = BeaconLocation(host: host, port: try await server.start())
        // Someone else's fetch opens the window: the next request in the following 3 s is answered busy.
        #expect(try await BeaconHTTPClient(group: group).fetch(location) == [9])

        let port = try freeUDPPort()
        var configuration = loopbackConfiguration(port: port)
        configuration.limits.sourceFetchFailureThreshold = 1  // one failure would ignore the source
        configuration.limits.unicastFailureThreshold = 1  // and pause our announcing
        let alice = SSDPDiscoveryService(configuration: configuration, group: group)
        let aliceEvents = EventLog(alice)
        try await alice.start()
        let raw = try await RawSSDPSocket(host: host, groupPort: port)
        try await raw.send(aliveText(port: port, location: "http://\(location.host):\(location.port)/"))

        // The server's busy answers, timed as they happen (polled: a measurement, not a wait to assert).
        var busyTimes: [ContinuousClock.Instant] = []
        let deadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < deadline {
            let answered = server.counters.answeredBusy
            if answered > busyTimes.count { busyTimes.append(ContinuousClock.now) }
            if aliceEvents.events.contains(where: { if case .beaconsFetched = $0 { true } else { false } }) { break }
            try await Task.sleep(for: .milliseconds(10))
        }
        let fetchedAt = ContinuousClock.now
        try await aliceEvents.wait(timeout: .seconds(1), "the beacons fetched once the server had room") {
            if case .beaconsFetched(let peer) = $0 { peer.location == location } else { false }
        }
        let counters = await alice.counters()
        #expect(busyTimes.count >= 1, "the server was busy at first")
        #expect(counters.busyAnswersReceived == server.counters.answeredBusy, "every busy answer honoured once: \(counters)")
        #expect(counters.beaconFetchesFailed == 0, "a busy answer is no failure: \(counters)")
        #expect(counters.sourcesIgnoredForFetchFailures == 0 && counters.unicastFailurePauses == 0, "\(counters)")
        #expect(!aliceEvents.events.contains { if case .beaconFetchFailed = $0 { true } else { false } })
        // Never asked again before its Retry-After (1 s; 50 ms of polling slack).
        for (earlier, later) in zip(busyTimes, busyTimes.dropFirst() + [fetchedAt]) {
            #expect(later - earlier >= .milliseconds(950), "asked again after \(later - earlier)")
        }
        await alice.stop()
        await server.stop()
    }

    @Test("a full table keeps a contact's peer: strangers take each other's places, and a new contact takes an unread stranger's")
    func contactsKeepTheirPlaces() {
        func location(_ index: Int) -> BeaconLocation { BeaconLocation(host: "10.77.0.\(index)", port: 1000) }
        var table = PeerTable(maxPeers: 2, byebyeGrace: .milliseconds(300), maxContactSources: 2)
        _ = table.alive(serviceName: "uuid:c", location: location(1), maxAge: 60, now: start)
        _ = table.fetched(serviceName: "uuid:c", result: .fetched([1]), now: start)
        table.markContact(host: location(1).host)
        _ = table.alive(serviceName: "uuid:s1", location: location(2), maxAge: 60, now: start)
        _ = table.fetched(serviceName: "uuid:s1", result: .fetched([2]), now: start)
        // The contact was read first, yet the stranger gives up its place.
        let actions = table.alive(serviceName: "uuid:s2", location: location(3), maxAge: 60, now: start)
        #expect(actions.first == .emit(.left(SSDPPeer(location: location(2), uniqueServiceName: "uuid:s1", beaconState: .fetched([2])),
                                             reason: .narrowed)))
        // Only the contact is read now: another stranger waits, the contact stays.
        #expect(table.alive(serviceName: "uuid:s3", location: location(4), maxAge: 60, now: start) == [.capExceeded])
        #expect(table.tracks(location(1)) && table.isContact(location(1)))
        // A contact's new location, with no read stranger left, takes an unread stranger's place.
        table.markContact(host: location(5).host)
        let contact = table.alive(serviceName: "uuid:c2", location: location(5), maxAge: 60, now: start)
        #expect(contact.first == .emit(.left(SSDPPeer(location: location(3), uniqueServiceName: "uuid:s2", beaconState: .fetching),
                                             reason: .narrowed)))
        #expect(contact.last == .fetch(location(5), serviceName: "uuid:c2"))
        // The memory of contact sources is bounded (two here): the oldest is forgotten first.
        table.markContact(host: location(6).host)
        #expect(!table.isContact(location(1)) && table.isContact(location(5)) && table.isContact(location(6)))
    }

    @Test("with the table full of strangers, a contact keeps its place and its new beacons are fetched")
    func aContactIsReadInAFullTable() async throws {
        let port = try freeUDPPort()
        var configuration = loopbackConfiguration(port: port)
        configuration.limits.maxTrackedPeers = 2
        configuration.limits.sourceFetchFailureThreshold = 1000  // strangers that serve nothing are not the point
        configuration.client.maxAttempts = 1
        let bob = SSDPDiscoveryService(configuration: configuration, group: group)
        let events = EventLog(bob)
        try await bob.start()
        let contactServer = BeaconHTTPServer(host: "127.0.0.81", group: group)
        contactServer.setBeacons([1])
        let contact = BeaconLocation(host: "127.0.0.81", port: try await contactServer.start())
        let strangerServer = BeaconHTTPServer(host: "127.0.0.82", group: group)
        strangerServer.setBeacons([2])
        let stranger = BeaconLocation(host: "127.0.0.82", port: try await strangerServer.start())
        func announce(_ location: BeaconLocation, usn: String) async throws {
            let raw = try await RawSSDPSocket(host: location.host, groupPort: port)
            try await raw.send(aliveText(port: port, usn: usn, location: "http://\(location.host):\(location.port)/"))
        }
        func fetched(_ location: BeaconLocation, _ usn: String) -> (SSDPDiscoveryEvent) -> Bool {
            { if case .beaconsFetched(let peer) = $0 { peer.location == location && peer.uniqueServiceName == usn } else { false } }
        }
        let first = ThaliServiceName.makeUniqueServiceName()
        try await announce(contact, usn: first)
        try await events.wait("the contact's beacons", fetched(contact, first))
        bob.markContact(at: contact)  // what the node does once they matched a contact
        let strangerUSN = ThaliServiceName.makeUniqueServiceName()
        try await announce(stranger, usn: strangerUSN)
        try await events.wait("the stranger's beacons", fetched(stranger, strangerUSN))
        // Strangers that serve nothing fill the table: they are never read, so they keep their places.
        try await announce(BeaconLocation(host: "127.0.0.83", port: 4000), usn: ThaliServiceName.makeUniqueServiceName())
        try await events.wait("127.0.0.83 fetched and failed") {
            if case .beaconFetchFailed(let peer, _) = $0 { peer.location.host == "127.0.0.83" } else { false }
        }
        try await announce(BeaconLocation(host: "127.0.0.84", port: 4001), usn: ThaliServiceName.makeUniqueServiceName())
        try await eventually("127.0.0.84 given a place or refused one") {
            let counters = await bob.counters()
            return counters.peersGivenUpAtCap + counters.peersRejectedAtCap >= 2
        }
        #expect(await bob.peers().contains { $0.location == contact }, "the contact kept its place")
        // The contact has something new for us: a new USN, fetched although the table is full.
        contactServer.setBeacons([3])
        let second = ThaliServiceName.makeUniqueServiceName()
        try await announce(contact, usn: second)
        try await events.wait(timeout: .seconds(3), "the contact's new beacons", fetched(contact, second))
        await bob.stop()
        await contactServer.stop()
        await strangerServer.stop()
    }
}
