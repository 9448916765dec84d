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

    @Test func searchOnJoinFindsAQuietPeerAndAnswersAreUnicast() async throws {
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

        // A hand-written M-SEARCH gets alice's answer by unicast, dated by the wall clock (which targets
        // are answered, when and with which headers: DiscoveryPolicyTests).
        let raw = try await RawSSDPSocket(groupPort: port)
        try await raw.send("M-SEARCH * HTTP/1.1\r\nHOST: 239.255.255.250:\(port)\r\nMAN: \"ssdp:discover\"\r\nMX: 1\r\nST: ssdp:all\r\n\r\n")
        try await eventually(timeout: .seconds(3), "an answer") { raw.datagrams.count >= 1 }
        guard case .searchResponse(let response) = try SSDPMessage.parse(raw.datagrams[0].data.readableBytesView) else {
            Issue.record("\(raw.datagrams)")
            return
        }
        #expect(response.uniqueServiceName == (await alice.uniqueServiceName()))
        #expect(response.date?.hasSuffix(" GMT") == true)
        await bob.stop()
        await alice.stop()
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
                try? await Task.sleep(for: .milliseconds(50))  // paces the announcing hosts; nothing waits for a result
            }
        }
        defer { alives.cancel() }
        // A peer fetches Bob's beacons all along.
        let reaching = Task {
            let client = BeaconHTTPClient(group: group)
            while !Task.isCancelled {
                _ = try? await client.fetch(location)
                try? await Task.sleep(for: .milliseconds(50))  // paces the fetching peer; nothing waits for a result
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
}

/// A TCP port on 127.0.0.1 that refuses connections.
func closedTCPPort() throws -> Int {
    let channel = try ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton).bind(host: "127.0.0.1", port: 0).wait()
    let port = channel.localAddress?.port ?? 1
    try channel.close().wait()
    return port
}
