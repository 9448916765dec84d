import NIOCore
import NIOPosix
import Testing

@testable import ThaliSSDP

/// Discovery past its bounds narrows to a sample instead of switching off (`spec/ssdp.md` 7.2): a full
/// table gives up peers already read for new ones, and reading stops for the rest of a window
/// once its budget is read.
@Suite("Discovery narrows in a crowd beyond its bounds", .serialized)
struct NarrowingTests {
    let start = NIODeadline.uptimeNanoseconds(1_000_000_000)

    func location(_ index: Int) -> BeaconLocation { BeaconLocation(host: "10.77.0.\(index)", port: 1000) }

    @Test("a full table gives the place of the peer read longest ago to a new one, and does not take a read USN back")
    func fullTableGivesUpThePeerReadLongestAgo() {
        var table = PeerTable(maxPeers: 2, byebyeGrace: .milliseconds(300), maxRememberedReadPeers: 8)
        _ = table.alive(serviceName: "uuid:1", location: location(1), maxAge: 60, now: start)
        _ = table.alive(serviceName: "uuid:2", location: location(2), maxAge: 60, now: start)
        // Neither is read yet: both keep their places while their fetches run.
        #expect(table.alive(serviceName: "uuid:3", location: location(3), maxAge: 60, now: start) == [.capExceeded])
        _ = table.fetched(serviceName: "uuid:2", result: .fetched([2]), now: start)
        _ = table.fetched(serviceName: "uuid:1", result: .fetched([1]), now: start + .seconds(1))
        let readFirst = SSDPPeer(location: location(2), uniqueServiceName: "uuid:2", beaconState: .fetched([2]))
        let newcomer = SSDPPeer(location: location(3), uniqueServiceName: "uuid:3", beaconState: .fetching)
        #expect(table.alive(serviceName: "uuid:3", location: location(3), maxAge: 60, now: start + .seconds(2))
            == [.emit(.left(readFirst, reason: .narrowed)), .emit(.appeared(newcomer)), .fetch(location(3), serviceName: "uuid:3")])
        #expect(table.count == 2)
        // Its next alive brings nothing new to read: not tracked again, nobody else gives up a place.
        #expect(table.alive(serviceName: "uuid:2", location: location(2), maxAge: 60, now: start + .seconds(3)) == [.alreadyRead])
        #expect(table.tracks(location(1)) && table.tracks(location(3)) && !table.tracks(location(2)))
        // A new USN from it (its beacons changed) is a new read: it takes the next read peer's place.
        let actions = table.alive(serviceName: "uuid:2b", location: location(2), maxAge: 60, now: start + .seconds(4))
        #expect(actions.first == .emit(.left(SSDPPeer(location: location(1), uniqueServiceName: "uuid:1", beaconState: .fetched([1])),
                                             reason: .narrowed)))
        #expect(actions.last == .fetch(location(2), serviceName: "uuid:2b"))
    }

    @Test("a peer whose USN changed or whose fetch failed since its read is not given up for its old read")
    func staleReadsAreSkipped() {
        var table = PeerTable(maxPeers: 2, byebyeGrace: .milliseconds(300))
        _ = table.alive(serviceName: "uuid:1", location: location(1), maxAge: 60, now: start)
        _ = table.alive(serviceName: "uuid:2", location: location(2), maxAge: 60, now: start)
        _ = table.fetched(serviceName: "uuid:1", result: .fetched([1]), now: start)
        _ = table.fetched(serviceName: "uuid:2", result: .fetched([2]), now: start)
        _ = table.alive(serviceName: "uuid:1b", location: location(1), maxAge: 60, now: start)  // fetching again
        let actions = table.alive(serviceName: "uuid:3", location: location(3), maxAge: 60, now: start)
        #expect(actions.first == .emit(.left(SSDPPeer(location: location(2), uniqueServiceName: "uuid:2", beaconState: .fetched([2])),
                                             reason: .narrowed)))
        #expect(table.alive(serviceName: "uuid:4", location: location(4), maxAge: 60, now: start) == [.capExceeded])
    }

    @Test("a crowd ten times the table is read whole, a sample at a time, never more than the table tracked")
    func aCrowdLargerThanTheTableIsReadWhole() {
        let cap = 16
        var table = PeerTable(maxPeers: cap, byebyeGrace: .milliseconds(300), maxRememberedReadPeers: 1000)
        var read = Set<String>()
        var fetches = 0
        var generator = SystemRandomNumberGenerator()
        for round in 0..<200 {
            let now = start + .milliseconds(Int64(round * 10))
            // Ten alives of random peers of 160 per round; every fetch asked for completes.
            for _ in 0..<10 {
                let index = Int.random(in: 0..<(cap * 10), using: &generator)
                let name = "uuid:\(index)"
                for case .fetch(_, let serviceName) in table.alive(serviceName: name, location: location(index), maxAge: 60, now: now) {
                    fetches += 1
                    _ = table.fetched(serviceName: serviceName, result: .fetched([1]), now: now)
                    read.insert(serviceName)
                }
                #expect(table.count <= cap)
            }
        }
        #expect(read.count == cap * 10)
        #expect(fetches == cap * 10, "each USN read once")
    }

    @Test("a read peer that expires from a full table is not fetched again; from a table with room it is")
    func readPeersExpiringFromAFullTableStayRead() {
        var table = PeerTable(maxPeers: 2, byebyeGrace: .milliseconds(300))
        _ = table.alive(serviceName: "uuid:1", location: location(1), maxAge: 5, now: start)
        _ = table.alive(serviceName: "uuid:2", location: location(2), maxAge: 60, now: start)
        _ = table.fetched(serviceName: "uuid:1", result: .fetched([1]), now: start)
        _ = table.expire(now: start + .seconds(6))
        #expect(table.alive(serviceName: "uuid:1", location: location(1), maxAge: 5, now: start + .seconds(7)) == [.alreadyRead])

        var roomy = PeerTable(maxPeers: 3, byebyeGrace: .milliseconds(300))
        _ = roomy.alive(serviceName: "uuid:1", location: location(1), maxAge: 5, now: start)
        _ = roomy.fetched(serviceName: "uuid:1", result: .fetched([1]), now: start)
        _ = roomy.expire(now: start + .seconds(6))
        #expect(roomy.alive(serviceName: "uuid:1", location: location(1), maxAge: 5, now: start + .seconds(7)).last
            == .fetch(location(1), serviceName: "uuid:1"))
    }

    @Test func boundedHashMemoryForgetsTheOldestFirst() {
        var memory = BoundedHashMemory(capacity: 3)
        for name in ["a", "b", "c", "d"] { memory.insert(name) }
        #expect(memory.count == 3)
        #expect(!memory.contains("a") && memory.contains("b") && memory.contains("d"))
        memory.insert("d")
        memory.insert("e")
        #expect(!memory.contains("b") && memory.contains("c") && memory.contains("e"))
    }

    let group = MultiThreadedEventLoopGroup.singleton

    @Test("past the read budget a window's rest waits in the kernel: discovery stays on and reads the rest later")
    func readingNarrowsPerWindow() async throws {
        let port = try freeUDPPort()
        var configuration = loopbackConfiguration(port: port)
        configuration.limits.maxDatagramsReadPerWindow = 20
        configuration.limits.floodWindow = .seconds(1)
        configuration.limits.maxPeersPerSource = 100
        configuration.limits.sourceFetchFailureThreshold = 1000  // the locations serve nothing: not what this is about
        configuration.limits.fetchSpreadPerPeer = .seconds(10)  // and no fetch is made during the test
        configuration.limits.maxFetchSpread = .seconds(30)
        let bob = SSDPDiscoveryService(configuration: configuration, group: group)
        let bobEvents = EventLog(bob)
        try await bob.start()
        var senders: [RawSSDPSocket] = []
        for source in ["127.0.0.61", "127.0.0.62", "127.0.0.63"] { senders.append(try await RawSSDPSocket(host: source, groupPort: port)) }
        for index in 0..<60 {
            let source = 61 + index % 3
            try await senders[index % 3].send(aliveText(port: port, location: "http://127.0.0.\(source):\(1000 + index)/"))
        }
        try await eventually(timeout: .seconds(2), "reading paused") { await bob.counters().readPauses >= 1 }
        let during = await bob.peers().count
        #expect(during <= 20, "one window's budget tracked, not more: \(during)")
        // Nothing switched off: the rest is read in the next windows (all but the few read in the same
        // batch as the one over the budget, dropped unparsed).
        try await eventually(timeout: .seconds(6), "the rest read later") { await bob.peers().count >= 50 }
        let counters = await bob.counters()
        #expect(counters.readPauses >= 2, "\(counters)")
        #expect(counters.floodShutdowns == 0)
        #expect(!(await bob.isDiscoveryOff()))
        // Narrowing reports itself, once for the episode however many windows it paused.
        let limits = bobEvents.events.compactMap { if case .limitTriggered(let kind) = $0 { kind } else { nil } }
        #expect(limits == [.narrowed], "\(bobEvents.events)")
        #expect(counters.narrowingEpisodes == 1)
        await bob.stop()
    }
}
