import Foundation
import NIOCore
import NIOConcurrencyHelpers
import NIOPosix
import Testing

@testable import ThaliSSDP

/// Tracks how often the consumer saw each USN.
final class ConsumerLog: @unchecked Sendable {
    private let lock = NSLock()
    private var calls: [(String, [UInt8])] = []
    func record(_ peer: SSDPPeer, _ bytes: [UInt8]) { lock.withLock { calls.append((peer.uniqueServiceName, bytes)) } }
    var entries: [(String, [UInt8])] { lock.withLock { calls } }
}

@Suite("Discovery service on loopback multicast", .serialized)
struct SSDPDiscoveryServiceTests {
    let group = MultiThreadedEventLoopGroup.singleton

    @Test func peersDiscoverEachOtherFetchOncePerUSNSeeChangesAndByebye() async throws {
        let port = try freeUDPPort()
        let consumed = ConsumerLog()
        let alice = SSDPDiscoveryService(configuration: loopbackConfiguration(port: port), group: group)
        let bob = SSDPDiscoveryService(configuration: loopbackConfiguration(port: port), group: group) { peer, bytes in
            consumed.record(peer, bytes)
        }
        let aliceEvents = EventLog(alice)
        let bobEvents = EventLog(bob)
        try await alice.start(advertising: [1, 2, 3])
        try await bob.start(advertising: [4, 5])
        let aliceLocation = await alice.location()
        let bobLocation = await bob.location()

        try await bobEvents.wait(timeout: .seconds(3), "bob fetches alice") {
            if case .beaconsFetched(let peer) = $0 { return peer.location == aliceLocation && peer.beaconState == .fetched([1, 2, 3]) }
            return false
        }
        try await aliceEvents.wait(timeout: .seconds(3), "alice fetches bob") {
            if case .beaconsFetched(let peer) = $0 { return peer.location == bobLocation && peer.beaconState == .fetched([4, 5]) }
            return false
        }
        let firstName = try #require(await alice.uniqueServiceName())

        // New beacons: a new USN, seen as a change, fetched once.
        await alice.advertise([9])
        let secondName = try #require(await alice.uniqueServiceName())
        #expect(firstName != secondName)
        try await bobEvents.wait(timeout: .seconds(3), "bob sees the change") {
            if case .changed(let peer, let previous) = $0 { return previous == firstName && peer.uniqueServiceName == secondName }
            return false
        }
        try await eventually("the new beacons reach bob's consumer") { consumed.entries.contains { $0.0 == secondName } }
        // Bob reads three more of alice's alives of the same USN: none is fetched again.
        func othersDatagrams() async -> Int { let c = await bob.counters(); return c.datagramsReceived - c.ownMessagesIgnored }
        let read = await othersDatagrams()
        try await eventually("three more alives read") { await othersDatagrams() >= read + 3 }
        #expect(consumed.entries.filter { $0.0 == firstName }.map(\.1) == [[1, 2, 3]])
        #expect(consumed.entries.filter { $0.0 == secondName }.map(\.1) == [[9]])
        #expect(!bobEvents.events.contains { if case .left = $0 { return true } else { return false } })

        // Clean stop: byebye, seen as a departure.
        await alice.stop()
        try await bobEvents.wait(timeout: .seconds(2), "alice leaves by byebye") {
            if case .left(let peer, .byebye) = $0 { return peer.location == aliceLocation }
            return false
        }
        #expect(await bob.peers().isEmpty)
        let counters = await bob.counters()
        #expect(counters.ownMessagesIgnored > 0)  // bob heard its own alives through multicast loopback
        #expect(counters.spoofedLocationsIgnored == 0 && counters.malformedDatagrams == 0)
        await bob.stop()
    }

    @Test func searchOnJoinFindsAQuietPeerAndAnswersAreUnicastWithinMX() async throws {
        let port = try freeUDPPort()
        var quiet = loopbackConfiguration(port: port)
        quiet.background = true  // one alive at start, then only every 60 s
        let alice = SSDPDiscoveryService(configuration: quiet, group: group)
        // start() returns once alice's one alive is on the wire: it is gone before bob listens.
        try await alice.start(advertising: [1])
        let bob = SSDPDiscoveryService(configuration: loopbackConfiguration(port: port), group: group)
        let bobEvents = EventLog(bob)
        try await bob.start()
        try await bobEvents.wait(timeout: .seconds(3), "bob finds alice through M-SEARCH") {
            if case .beaconsFetched(let peer) = $0 { return peer.beaconState == .fetched([1]) }
            return false
        }
        #expect(await bob.counters().searchesSent == 1)
        #expect(await alice.counters().searchResponsesSent >= 1)

        // A hand-written M-SEARCH gets a unicast 200 OK with every header; a foreign target gets nothing.
        let raw = try await RawSSDPSocket(groupPort: port)
        let search = "M-SEARCH * HTTP/1.1\r\nHOST: 239.255.255.250:\(port)\r\nMAN: \"ssdp:discover\"\r\nMX: 1\r\nST: "
        try await raw.send(search + "upnp:rootdevice\r\n\r\n")
        try await raw.send(search + "ssdp:all\r\n\r\n")
        try await eventually(timeout: .seconds(3), "an answer") { raw.datagrams.count >= 1 }
        // A sleep: MX 1 lets any answer wait up to 1 s on the answerer's own clock, none injectable.
        try await Task.sleep(for: .milliseconds(1200))
        let answers = try raw.datagrams.map { try SSDPMessage.parse($0.data.readableBytesView) }
        #expect(answers.count == 1)  // alice once (ssdp:all); bob advertises nothing; nobody answers rootdevice
        guard case .searchResponse(let response) = answers.first else { Issue.record("\(answers)"); return }
        #expect(response.uniqueServiceName == (await alice.uniqueServiceName()))
        #expect(response.location == (await alice.location()).description)
        #expect(response.maxAge == 60 && response.date?.hasSuffix("GMT") == true)
        #expect(response.searchTarget == ThaliServiceName.notificationType)
        let bytes = String(decoding: raw.datagrams[0].data.readableBytesView, as: UTF8.self)
        #expect(bytes.contains("\r\nEXT:\r\n"), "an empty header without a trailing space")
        await bob.stop()
        await alice.stop()
    }

    @Test func aSilentlyKilledPeerExpiresByMaxAge() async throws {
        let port = try freeUDPPort()
        let bob = SSDPDiscoveryService(configuration: loopbackConfiguration(port: port), group: group)
        let bobEvents = EventLog(bob)
        try await bob.start()
        let server = BeaconHTTPServer(host: "127.0.0.1", group: group)
        let httpPort = try await server.start()
        server.setBeacons([3])
        let raw = try await RawSSDPSocket(groupPort: port)
        try await raw.send(aliveText(port: port, location: "http://127.0.0.1:\(httpPort)/NotificationBeacons", maxAge: 1))
        try await bobEvents.wait(timeout: .seconds(2), "appeared") { if case .appeared = $0 { true } else { false } }
        let started = ContinuousClock.now
        try await bobEvents.wait(timeout: .seconds(3), "expired") {
            if case .left(_, .expired) = $0 { true } else { false }
        }
        #expect(ContinuousClock.now - started >= .milliseconds(700))
        await server.stop()
        await bob.stop()
    }

    /// A peer speaking like the deployed node-ssdp Thali: `data:<uuid>:<generation>` USNs, no byebye on
    /// change, LOCATION without a path, max-age 1800.
    @Test func aDeployedThaliPeerIsDiscoveredAndItsGenerationsAreChanges() async throws {
        let port = try freeUDPPort()
        let bob = SSDPDiscoveryService(configuration: loopbackConfiguration(port: port), group: group)
        let bobEvents = EventLog(bob)
        try await bob.start()
        let server = BeaconHTTPServer(host: "127.0.0.1", group: group)
        let httpPort = try await server.start()
        server.setBeacons([0xD0])
        let raw = try await RawSSDPSocket(groupPort: port)
        let uuid = "3f2c1a9e-6b7d-4e21-9c3a-0d5e8f7a6b10"
        func deployedAlive(_ generation: Int) -> String {
            "NOTIFY * HTTP/1.1\r\nHOST: 228.227.226.225:1900\r\nNT: http://www.thaliproject.org/ssdp\r\n"
                + "NTS: ssdp:alive\r\nUSN: data:\(uuid):\(generation)\r\nLOCATION: http://127.0.0.1:\(httpPort)\r\n"
                + "CACHE-CONTROL: max-age=1800\r\nSERVER: node.js/0.10.40 UPnP/1.1 node-ssdp/2.6.5\r\n\r\n"
        }
        try await raw.send(deployedAlive(0))
        try await bobEvents.wait(timeout: .seconds(3), "fetched generation 0") {
            if case .beaconsFetched(let peer) = $0 { return peer.uniqueServiceName == "data:\(uuid):0" && peer.beaconState == .fetched([0xD0]) }
            return false
        }
        server.setBeacons([0xD1])
        try await raw.send(deployedAlive(1))
        try await bobEvents.wait(timeout: .seconds(3), "generation 1 is a change") {
            if case .changed(let peer, let previous) = $0 { return previous == "data:\(uuid):0" && peer.uniqueServiceName == "data:\(uuid):1" }
            return false
        }
        try await bobEvents.wait(timeout: .seconds(3), "fetched generation 1") {
            if case .beaconsFetched(let peer) = $0 { return peer.beaconState == .fetched([0xD1]) }
            return false
        }
        await server.stop()
        await bob.stop()
    }

    @Test func foreignDevicesSpoofedLocationsAndGarbageAreIgnoredQuietly() async throws {
        let port = try freeUDPPort()
        let bob = SSDPDiscoveryService(configuration: loopbackConfiguration(port: port), group: group)
        try await bob.start()
        let raw = try await RawSSDPSocket(groupPort: port)
        // A UPnP router on the same group.
        try await raw.send(aliveText(port: port, usn: "uuid:router::upnp:rootdevice", location: "http://127.0.0.1:80/desc.xml",
                                     nt: "upnp:rootdevice"))
        // A Thali alive whose LOCATION points somewhere other than its source: a connection cannon.
        try await raw.send(aliveText(port: port, location: "http://10.9.9.9:80/NotificationBeacons"))
        // Our NT with a USN that is no Thali USN; and plain garbage.
        try await raw.send(aliveText(port: port, usn: "urn:x", location: "http://127.0.0.1:80"))
        try await raw.send(Array(repeating: 0xFF, count: 64))
        // An oversized datagram: the kernel truncates it to the read size, the parser refuses its size.
        try await raw.send(Array(repeating: UInt8(ascii: "A"), count: 8000))
        try await eventually("all five counted") {
            let c = await bob.counters()
            return c.foreignMessagesIgnored == 1 && c.spoofedLocationsIgnored == 1 && c.malformedDatagrams == 3
        }
        #expect(await bob.peers().isEmpty)
        await bob.stop()
    }

    @Test func anAnnouncementFloodSwitchesDiscoveryOffForTheCooldown() async throws {
        let port = try freeUDPPort()
        var configuration = loopbackConfiguration(port: port)
        configuration.limits.maxDatagramsPerWindow = 20
        configuration.limits.floodWindow = .seconds(10)
        configuration.limits.discoveryCooldown = .milliseconds(700)
        let bob = SSDPDiscoveryService(configuration: configuration, group: group)
        let bobEvents = EventLog(bob)
        try await bob.start()
        // Three sources, each within its own budget: only together do they exceed the global one.
        var senders: [RawSSDPSocket] = []
        for source in ["127.0.0.11", "127.0.0.12", "127.0.0.13"] { senders.append(try await RawSSDPSocket(host: source, groupPort: port)) }
        for index in 0..<60 {
            let sender = senders[index % 3]
            try await sender.send(aliveText(port: port, location: "http://127.0.0.1\(1 + index % 3):\(1000 + index)/"))
        }
        try await bobEvents.wait(timeout: .seconds(2), "flood") { $0 == .limitTriggered(.announcementFlood) }
        #expect(await bob.isDiscoveryOff())
        let during = await bob.counters()
        #expect(during.floodShutdowns == 1)
        #expect(during.datagramsReceived < 40)  // of 60: the rest were dropped by the kernel (socket closed)
        try await eventually(timeout: .seconds(3), "discovery back on") { !(await bob.isDiscoveryOff()) }
        let raw = try await RawSSDPSocket(groupPort: port)
        try await raw.send(aliveText(port: port, location: "http://127.0.0.1:2000/"))
        try await bobEvents.wait(timeout: .seconds(2), "a peer after the cool-down") {
            if case .appeared(let peer) = $0 { return peer.location.port == 2000 } else { return false }
        }
        await bob.stop()
    }

    @Test("one source over its datagram budget is ignored alone: discovery stays on for everyone else")
    func oneSourceFloodIsIgnoredAlone() async throws {
        let port = try freeUDPPort()
        var configuration = loopbackConfiguration(port: port)
        configuration.limits.maxDatagramsPerSource = 20
        configuration.limits.maxDatagramsPerWindow = 30
        configuration.limits.floodWindow = .seconds(10)
        let bob = SSDPDiscoveryService(configuration: configuration, group: group)
        let bobEvents = EventLog(bob)
        try await bob.start()
        let attacker = try await RawSSDPSocket(host: "127.0.0.41", groupPort: port)
        for index in 0..<200 {
            try await attacker.send(aliveText(port: port, location: "http://127.0.0.41:\(1000 + index)/"))
        }
        try await eventually(timeout: .seconds(2), "the source ignored") { await bob.counters().sourcesIgnoredForRate == 1 }
        let honest = try await RawSSDPSocket(host: "127.0.0.42", groupPort: port)
        try await honest.send(aliveText(port: port, location: "http://127.0.0.42:2000/"))
        try await bobEvents.wait(timeout: .seconds(2), "the honest peer") {
            if case .appeared(let peer) = $0 { return peer.location.port == 2000 } else { return false }
        }
        let counters = await bob.counters()
        #expect(!(await bob.isDiscoveryOff()))
        #expect(counters.floodShutdowns == 0)
        #expect(counters.datagramsFromIgnoredSources >= 150, "dropped before parsing: \(counters)")
        await bob.stop()
    }

    @Test("one source announcing many locations gets only maxPeersPerSource tracked, and the table does not narrow")
    func manyLocationsFromOneSource() async throws {
        let port = try freeUDPPort()
        var configuration = loopbackConfiguration(port: port)
        configuration.limits.maxPeersPerSource = 4
        configuration.limits.maxTrackedPeers = 10
        configuration.limits.sourceFetchFailureThreshold = 1000  // this test is about locations, not failures
        configuration.client.maxAttempts = 1
        let bob = SSDPDiscoveryService(configuration: configuration, group: group)
        let bobEvents = EventLog(bob)
        try await bob.start()
        let attacker = try await RawSSDPSocket(host: "127.0.0.51", groupPort: port)
        for index in 0..<30 {
            try await attacker.send(aliveText(port: port, location: "http://127.0.0.51:\(4000 + index)/"))
        }
        try await eventually(timeout: .seconds(2), "the excess refused") { await bob.counters().peersRejectedPerSource >= 26 }
        let honest = try await RawSSDPSocket(host: "127.0.0.52", groupPort: port)
        try await honest.send(aliveText(port: port, location: "http://127.0.0.52:5000/"))
        try await bobEvents.wait(timeout: .seconds(2), "the honest peer") {
            if case .appeared(let peer) = $0 { return peer.location.port == 5000 } else { return false }
        }
        #expect(await bob.peers().filter { $0.location.host == "127.0.0.51" }.count == 4)
        #expect(await bob.counters().peerCapNarrowings == 0)
        #expect(!(await bob.isDiscoveryOff()))
        await bob.stop()
    }

    @Test("one host whose locations are closed ports is ignored; our announcing goes on")
    func closedPortsOfOneHostDoNotPauseAnnouncing() async throws {
        let port = try freeUDPPort()
        var configuration = loopbackConfiguration(port: port)
        configuration.client.maxAttempts = 1
        let bob = SSDPDiscoveryService(configuration: configuration, group: group)
        try await bob.start(advertising: [1])
        let attacker = try await RawSSDPSocket(host: "127.0.0.61", groupPort: port)
        for _ in 0..<8 {
            try await attacker.send(aliveText(port: port, location: "http://127.0.0.61:\(try closedTCPPort())/"))
        }
        try await eventually(timeout: .seconds(3), "the host ignored") { await bob.counters().sourcesIgnoredForFetchFailures == 1 }
        // Every one of the eight locations is settled (its fetch failed, was skipped, or its datagram or
        // peer refused), so a fetch made after the host was ignored would be counted by now.
        try await eventually(timeout: .seconds(5), "all eight locations settled") {
            let counters = await bob.counters()
            return counters.beaconFetchesFailed + counters.fetchesSkippedForIgnoredSources + counters.datagramsFromIgnoredSources
                + counters.peersRejectedPerSource >= 8
        }
        let counters = await bob.counters()
        #expect(!(await bob.isAnnouncingPaused()))
        #expect(counters.unicastFailurePauses == 0)
        // Fetches stop once the host is ignored: only those started before it was (at most the threshold
        // plus the fetches in flight) fail, not all eight.
        let bound = configuration.limits.sourceFetchFailureThreshold + configuration.limits.maxConcurrentFetches - 1
        #expect(counters.beaconFetchesFailed >= 3 && counters.beaconFetchesFailed <= bound, "\(counters)")
        #expect(counters.fetchesSkippedForIgnoredSources + counters.datagramsFromIgnoredSources >= 1)
        await bob.stop()
    }

    /// A location whose fetch waits out its spread fetches the USN current when the wait ends, once: a
    /// source that announces a new USN with every datagram holds one timer, not one per datagram.
    @Test("USNs announced while a location's fetch waits: one fetch, of the newest")
    func usnChangesDuringTheSpreadFetchTheNewestOnce() async throws {
        let port = try freeUDPPort()
        var configuration = loopbackConfiguration(port: port)
        // One peer tracked: its wait is below 3 s, long beside the millisecond the five datagrams take.
        configuration.limits.fetchSpreadPerPeer = .seconds(3)
        configuration.limits.maxFetchSpread = .seconds(3)
        let consumed = ConsumerLog()
        let bob = SSDPDiscoveryService(configuration: configuration, group: group) { peer, bytes in consumed.record(peer, bytes) }
        try await bob.start()
        let host = "127.0.0.73"
        let server = BeaconHTTPServer(host: host, group: group)
        let serverPort = try await server.start()
        server.setBeacons([9])
        let raw = try await RawSSDPSocket(host: host, groupPort: port)
        let names = (0..<5).map { _ in ThaliServiceName.makeUniqueServiceName() }
        for name in names {
            try await raw.send(aliveText(port: port, usn: name, location: "http://\(host):\(serverPort)/NotificationBeacons"))
        }
        let sent = ContinuousClock.now
        let deadline = sent + .seconds(6)
        while ContinuousClock.now < deadline, consumed.entries.isEmpty { try await Task.sleep(for: .milliseconds(50)) }
        // A sleep: a timer per datagram would fire within the 3 s spread, drawn on the service's own clock and
        // random numbers (none injectable); past it, and a fetch's round trip, every such fetch has landed.
        try await Task.sleep(until: sent + .seconds(3) + .milliseconds(300))
        #expect(consumed.entries.map(\.0) == [names[4]], "only the newest USN is read")
        #expect(server.counters.requestsAnswered == 1)
        await bob.stop()
        await server.stop()
    }

    /// A USN is fetched once; a fetch that failed (or was not made, its source ignored) must still be
    /// retried, or a peer whose beacons never change (one item left for us, in a crowd) stays unread.
    @Test("a peer whose fetch failed, or was skipped while its source was ignored, is fetched on a later alive")
    func aFailedOrSkippedFetchIsRetriedOnALaterAlive() async throws {
        let port = try freeUDPPort()
        var configuration = loopbackConfiguration(port: port)
        configuration.client.maxAttempts = 1
        configuration.limits.maxConcurrentFetches = 1  // the second location waits behind the first
        configuration.limits.fetchSpreadPerPeer = .zero  // in the order they were announced
        configuration.limits.sourceFetchFailureThreshold = 1
        configuration.limits.unicastFailurePause = .milliseconds(600)
        configuration.limits.failedFetchRetryDelay = .milliseconds(200)
        let consumed = ConsumerLog()
        let bob = SSDPDiscoveryService(configuration: configuration, group: group) { peer, bytes in consumed.record(peer, bytes) }
        let bobEvents = EventLog(bob)
        try await bob.start()
        let host = "127.0.0.72"
        let open = BeaconHTTPServer(host: host, group: group)
        let openPort = try await open.start()
        open.setBeacons([7])
        // The failing location accepts and never answers, so its fetch is in flight for the client's
        // response timeout: the open location's alive is sent once that fetch has connected, and queues
        // behind it. (A refused connect fails at once: the host could be ignored before that alive
        // arrives, and an ignored source's datagrams are dropped unread.)
        let accepted = NIOLockedValueBox(0)
        let silent = try await ServerBootstrap(group: group)
            .childChannelInitializer { child in accepted.withLockedValue { $0 += 1 }; return child.eventLoop.makeSucceededVoidFuture() }
            .bind(host: host, port: 0).get()
        let failingPort = silent.localAddress?.port ?? 0
        let raw = try await RawSSDPSocket(host: host, groupPort: port)
        let (down, up) = (ThaliServiceName.makeUniqueServiceName(), ThaliServiceName.makeUniqueServiceName())
        let downAlive = aliveText(port: port, usn: down, location: "http://\(host):\(failingPort)/NotificationBeacons")
        let upAlive = aliveText(port: port, usn: up, location: "http://\(host):\(openPort)/NotificationBeacons")
        func announceBoth() async throws {
            try await raw.send(downAlive)
            try await raw.send(upAlive)
        }
        try await raw.send(downAlive)
        try await eventually("the failing location's fetch connects") { accepted.withLockedValue { $0 } > 0 }
        try await raw.send(upAlive)
        // That fetch fails, which makes bob ignore the host, so the queued fetch of the open one is skipped.
        try await bobEvents.wait(timeout: .seconds(3), "the silent port fails") {
            if case .beaconFetchFailed(let peer, _) = $0 { return peer.uniqueServiceName == down } else { return false }
        }
        try await bobEvents.wait(timeout: .seconds(3), "the open port's fetch is skipped") {
            if case .beaconFetchFailed(let peer, BeaconFetchFailure(.notMade, "source ignored")) = $0 {
                return peer.uniqueServiceName == up
            } else { return false }
        }
        // The failing port now serves beacons; both keep announcing the same USNs.
        try await silent.close()
        let late = BeaconHTTPServer(host: host, group: group)
        _ = try await late.start(port: failingPort)
        late.setBeacons([8])
        let deadline = ContinuousClock.now + .seconds(5)
        while ContinuousClock.now < deadline, consumed.entries.count < 2 {
            try await announceBoth()
            try await Task.sleep(for: .milliseconds(100))
        }
        // More alives of both USNs, then one of a new USN: fetches run one at a time in the order they were
        // announced, so once the new USN's beacons arrive, any fetch the alives caused has been made.
        try await announceBoth()
        try await announceBoth()
        let sentinel = ThaliServiceName.makeUniqueServiceName()
        try await raw.send(aliveText(port: port, usn: sentinel, location: "http://\(host):\(openPort)/NotificationBeacons"))
        try await eventually("the new USN fetched") { consumed.entries.contains { $0.0 == sentinel } }
        #expect(consumed.entries.filter { $0.0 == down }.map(\.1) == [[8]], "\(bobEvents.events)")
        #expect(consumed.entries.filter { $0.0 == up }.map(\.1) == [[7]], "\(bobEvents.events)")
        await bob.stop()
        await open.stop()
        await late.stop()
    }

    @Test func whenEveryUnicastFailsAnnouncementsPause() async throws {
        let port = try freeUDPPort()
        var configuration = loopbackConfiguration(port: port)
        configuration.limits.unicastFailureThreshold = 3
        configuration.limits.unicastFailureMinimumSpan = .milliseconds(1500)
        configuration.limits.unicastFailurePause = .seconds(2)
        configuration.limits.failedFetchRetryDelay = .milliseconds(300)
        configuration.limits.sourceFetchFailureThreshold = 100  // keep fetching them
        configuration.client.maxAttempts = 1
        let bob = SSDPDiscoveryService(configuration: configuration, group: group)
        let bobEvents = EventLog(bob)
        try await bob.start(advertising: [1])
        // Three hosts whose beacon ports refuse connections, announcing again and again.
        var hosts: [(RawSSDPSocket, String)] = []
        for index in 0..<3 {
            let raw = try await RawSSDPSocket(host: "127.0.0.\(31 + index)", groupPort: port)
            hosts.append((raw, aliveText(port: port, location: "http://127.0.0.\(31 + index):\(try closedTCPPort())/")))
        }
        for (raw, alive) in hosts { try await raw.send(alive) }
        try await eventually("a failure from each") {
            Set(bobEvents.events.compactMap { if case .beaconFetchFailed(let peer, _) = $0 { peer.location.host } else { nil } }).count == 3
        }
        // Three sources failed at once: a burst, not yet blocked unicast.
        let pausedAtOnce = await bob.isAnnouncingPaused()
        #expect(!pausedAtOnce)
        let alives = Task {
            while !Task.isCancelled {
                for (raw, alive) in hosts { try? await raw.send(alive) }
                try? await Task.sleep(for: .milliseconds(100))
            }
        }
        defer { alives.cancel() }
        // Failing on, with no success, past the span: unicast is blocked.
        try await bobEvents.wait(timeout: .seconds(10), "unicast failure") { $0 == .limitTriggered(.unicastFailure) }
        let pauseSeen = ContinuousClock.now
        alives.cancel()
        #expect(await bob.isAnnouncingPaused())
        let counters = await bob.counters()
        #expect(counters.unicastFailurePauses == 1 && counters.beaconFetchesFailed > 3)
        #expect(counters.beaconFetchFailuresByKind[.noConnection] == counters.beaconFetchesFailed, "\(counters)")
        // The pause withdrew our USN, and no alive goes out during it: the next one (alives are due every
        // 200 ms) is the one that resumes announcing when the 2 s pause ends.
        let before = counters.alivesSent
        #expect(counters.byebyesSent == 1)
        try await eventually(timeout: .seconds(10), "announcing resumed") { await bob.counters().alivesSent > before }
        let quiet = ContinuousClock.now - pauseSeen
        #expect(quiet >= .seconds(1), "the first alive came \(quiet) after the pause began")
        #expect(!(await bob.isAnnouncingPaused()))
        await bob.stop()
    }

    @Test("while peers reach us, failing connects do not pause announcing; once they stop, the failures do")
    func inboundUnicastShowsUnicastWorks() async throws {
        let port = try freeUDPPort()
        var configuration = loopbackConfiguration(port: port)
        configuration.limits.unicastFailureThreshold = 3
        configuration.limits.unicastFailureMinimumSpan = .milliseconds(500)
        configuration.limits.unicastFailureMinimumSpanOnceWorked = .milliseconds(500)  // peers reached Bob
        configuration.limits.failedFetchRetryDelay = .milliseconds(200)
        configuration.limits.maxFailedFetchRetryDelay = .milliseconds(200)
        configuration.limits.sourceFetchFailureThreshold = 1000  // keep fetching them
        configuration.serverLimits.maxRequestsPerSource = 10_000  // and let the fetching peer in
        configuration.client.maxAttempts = 1
        let bob = SSDPDiscoveryService(configuration: configuration, group: group)
        let bobEvents = EventLog(bob)
        try await bob.start(advertising: [1])
        let location = await bob.location()
        var hosts: [(RawSSDPSocket, String)] = []
        for index in 0..<3 {
            let raw = try await RawSSDPSocket(host: "127.0.0.\(51 + index)", groupPort: port)
            hosts.append((raw, aliveText(port: port, location: "http://127.0.0.\(51 + index):\(try closedTCPPort())/")))
        }
        let alives = Task {
            while !Task.isCancelled {
                for (raw, alive) in hosts { try? await raw.send(alive) }
                try? await Task.sleep(for: .milliseconds(50))
            }
        }
        defer { alives.cancel() }
        // A peer fetches Bob's beacons all along.
        let reaching = Task {
            let client = BeaconHTTPClient(group: group)
            while !Task.isCancelled {
                _ = try? await client.fetch(location)
                try? await Task.sleep(for: .milliseconds(50))
            }
        }
        defer { reaching.cancel() }
        // Many rounds of failures from all three, well past the span.
        try await eventually(timeout: .seconds(15), "failures past the span") { await bob.counters().beaconFetchesFailed >= 24 }
        #expect(!bobEvents.events.contains(.limitTriggered(.unicastFailure)))
        #expect(await bob.counters().unicastFailurePauses == 0)
        // Nobody reaches Bob any more: the same failures pause his announcing.
        reaching.cancel()
        try await bobEvents.wait(timeout: .seconds(10), "unicast failure") { $0 == .limitTriggered(.unicastFailure) }
        await bob.stop()
    }

    @Test("fetches that connected and failed, from any number of sources, never pause announcing")
    func connectedFailuresDoNotPauseAnnouncing() async throws {
        // Three hosts whose beacon servers accept and close at once, as a saturated peer's gate does.
        var servers: [Channel] = []
        for index in 0..<3 {
            servers.append(try await ServerBootstrap(group: group)
                .childChannelInitializer { $0.close() }
                .bind(host: "127.0.0.\(41 + index)", port: 0).get())
        }
        let port = try freeUDPPort()
        var configuration = loopbackConfiguration(port: port)
        configuration.limits.unicastFailureThreshold = 3
        configuration.limits.unicastFailureMinimumSpan = .zero
        configuration.client.maxAttempts = 1
        let bob = SSDPDiscoveryService(configuration: configuration, group: group)
        let bobEvents = EventLog(bob)
        try await bob.start(advertising: [1])
        for (index, server) in servers.enumerated() {
            let raw = try await RawSSDPSocket(host: "127.0.0.\(41 + index)", groupPort: port)
            try await raw.send(aliveText(port: port, location: "http://127.0.0.\(41 + index):\(server.localAddress?.port ?? 1)/"))
        }
        try await eventually("a failure from each") {
            Set(bobEvents.events.compactMap { if case .beaconFetchFailed(let peer, _) = $0 { peer.location.host } else { nil } }).count == 3
        }
        let counters = await bob.counters()
        #expect(counters.beaconFetchFailuresByKind[.closedEarly] == 3, "\(counters)")
        let paused = await bob.isAnnouncingPaused()
        #expect(counters.unicastFailurePauses == 0 && !paused)
        #expect(!bobEvents.events.contains(.limitTriggered(.unicastFailure)))
        await bob.stop()
        for server in servers { try await server.close() }
    }

    @Test func anOverloadedBeaconServerPausesAnnouncements() async throws {
        let port = try freeUDPPort()
        var configuration = loopbackConfiguration(port: port)
        configuration.serverLimits.maxRequestsGlobal = 3
        configuration.serverLimits.globalWindow = .seconds(30)
        configuration.serverLimits.overloadClosePeriod = .seconds(30)
        let bob = SSDPDiscoveryService(configuration: configuration, group: group)
        let bobEvents = EventLog(bob)
        try await bob.start(advertising: [1])
        var clientConfiguration = BeaconHTTPClientConfiguration()
        clientConfiguration.maxAttempts = 1
        let client = BeaconHTTPClient(configuration: clientConfiguration, group: group)
        let location = await bob.location()
        for _ in 0..<4 { _ = try? await client.fetch(location) }
        try await bobEvents.wait(timeout: .seconds(2), "overload") { $0 == .limitTriggered(.httpOverload) }
        #expect(await bob.isAnnouncingPaused())
        #expect(bob.serverCounters.overloadShutdowns == 1)
        await bob.stop()
    }

    @Test func backgroundModeSlowsTheAlivesAndForegroundRestoresThem() async throws {
        var configuration = loopbackConfiguration(port: try freeUDPPort())
        configuration.foregroundAliveInterval = .milliseconds(100)
        configuration.backgroundAliveInterval = .seconds(1)
        let peer = SSDPDiscoveryService(configuration: configuration, group: group)
        try await peer.start(advertising: [1])
        try await eventually("foreground alives") { await peer.counters().alivesSent >= 4 }
        let switched = ContinuousClock.now
        await peer.setBackground(true)
        let quiet = await peer.counters().alivesSent
        // The next alive is the background one, a background interval after the switch: none at the
        // foreground rate (ten would be due by then) came before it.
        try await eventually("a background alive") { await peer.counters().alivesSent > quiet }
        let gap = ContinuousClock.now - switched
        #expect(gap >= .seconds(1), "the first alive came \(gap) after the switch")
        #expect(await peer.counters().alivesSent == quiet + 1)
        await peer.setBackground(false)
        try await eventually("foreground again") { await peer.counters().alivesSent >= quiet + 3 }
        await peer.stop()
    }

    @Test func startRefusesAddressesItCannotPinTo() async throws {
        let nowhere = SSDPDiscoveryService(configuration: SSDPDiscoveryConfiguration(interfaceAddress: "10.254.254.254"),
                                           group: group)
        await #expect(throws: SSDPDiscoveryService.StartError.noInterface(address: "10.254.254.254")) {
            try await nowhere.start()
        }
        let notAnAddress = SSDPDiscoveryService(configuration: SSDPDiscoveryConfiguration(interfaceAddress: "localhost"),
                                                group: group)
        await #expect(throws: SSDPDiscoveryService.StartError.invalidAddress("localhost")) { try await notAnAddress.start() }
        var spinning = loopbackConfiguration(port: try freeUDPPort())
        spinning.foregroundAliveInterval = .zero
        await #expect(throws: SSDPDiscoveryService.StartError.invalidConfiguration("foregroundAliveInterval")) {
            try await SSDPDiscoveryService(configuration: spinning, group: group).start()
        }
        var unicastGroup = loopbackConfiguration(port: try freeUDPPort())
        unicastGroup.groupAddress = "127.0.0.1"
        await #expect(throws: SSDPDiscoveryService.StartError.invalidAddress("127.0.0.1")) {
            try await SSDPDiscoveryService(configuration: unicastGroup, group: group).start()
        }
    }

    @Test func searchAnswersAreBoundedUnderAnMSearchFlood() async throws {
        let port = try freeUDPPort()
        var configuration = loopbackConfiguration(port: port)
        configuration.limits.maxPendingSearchResponses = 2
        let bob = SSDPDiscoveryService(configuration: configuration, group: group)
        try await bob.start(advertising: [1])
        let raw = try await RawSSDPSocket(groupPort: port)
        let search = "M-SEARCH * HTTP/1.1\r\nHOST: 239.255.255.250:\(port)\r\nMAN: \"ssdp:discover\"\r\nMX: 2\r\nST: ssdp:all\r\n\r\n"
        for _ in 0..<6 { try await raw.send(search) }
        try await eventually("drops counted") { await bob.counters().searchResponsesDropped == 4 }
        try await eventually(timeout: .seconds(4), "two answers") { raw.datagrams.count == 2 }
        await bob.stop()
    }
}

/// A TCP port on 127.0.0.1 that refuses connections.
func closedTCPPort() throws -> Int {
    let channel = try ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton).bind(host: "127.0.0.1", port: 0).wait()
    let port = channel.localAddress?.port ?? 1
    try channel.close().wait()
    return port
}
