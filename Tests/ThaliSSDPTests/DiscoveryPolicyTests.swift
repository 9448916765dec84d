import NIOCore
import Testing

@testable import ThaliSSDP

/// Discovery's policy on values in virtual time (`PolicyDriver`): what it reads, tracks, answers and
/// announces, and how its budgets narrow or switch discovery off (`spec/ssdp.md` §3-5, §7, §7.2). The
/// fetching side and the last resorts are in `DiscoveryPolicyFetchTests`; the wiring to sockets in
/// `SSDPDiscoveryServiceTests`.
@Suite("Discovery policy: receiving, budgets, narrowing, answers")
struct DiscoveryPolicyTests {
    func configuration(_ change: (inout SSDPDiscoveryConfiguration) -> Void = { _ in }) -> SSDPDiscoveryConfiguration {
        var configuration = SSDPDiscoveryConfiguration(interfaceAddress: "10.0.0.1")
        change(&configuration)
        return configuration
    }

    @Test("a deployed Thali peer (data: USNs, no byebye, LOCATION without a path) is fetched once per generation, each a change")
    func deployedThaliGenerations() throws {
        var driver = PolicyDriver()
        let uuid = "3f2c1a9e-6b7d-4e21-9c3a-0d5e8f7a6b10"
        func deployedAlive(_ generation: Int) -> String {
            "NOTIFY * HTTP/1.1\r\nHOST: 228.227.226.225:1900\r\nNT: http://www.thaliproject.org/ssdp\r\n"
                + "NTS: ssdp:alive\r\nUSN: data:\(uuid):\(generation)\r\nLOCATION: http://10.0.0.5:8080\r\n"
                + "CACHE-CONTROL: max-age=1800\r\nSERVER: node.js/0.10.40 UPnP/1.1 node-ssdp/2.6.5\r\n\r\n"
        }
        let location = peerLocation("10.0.0.5", port: 8080)
        try driver.receive(deployedAlive(0), from: "10.0.0.5")
        #expect(driver.events == [.appeared(SSDPPeer(location: location, uniqueServiceName: "data:\(uuid):0", beaconState: .fetching))])
        driver.advance(by: .milliseconds(10))  // one peer tracked: its fetch waits less than 10 ms
        driver.finishFetch(nil, .fetched([0xD0]))
        // Its alives repeat the generation: nothing new to fetch.
        for _ in 0..<3 {
            try driver.receive(deployedAlive(0), from: "10.0.0.5")
            driver.advance(by: .milliseconds(500))
        }
        #expect(driver.fetchesStarted == ["data:\(uuid):0"])
        try driver.receive(deployedAlive(1), from: "10.0.0.5")
        #expect(driver.events.last == .changed(SSDPPeer(location: location, uniqueServiceName: "data:\(uuid):1", beaconState: .fetching),
                                               previousServiceName: "data:\(uuid):0"))
        driver.advance(by: .milliseconds(10))
        driver.finishFetch(nil, .fetched([0xD1]))
        #expect(driver.delivered.map(\.serviceName) == ["data:\(uuid):0", "data:\(uuid):1"])
        #expect(driver.delivered.map(\.bytes) == [[0xD0], [0xD1]])
        #expect(!driver.events.contains { if case .left = $0 { true } else { false } })
    }

    @Test("foreign devices, spoofed locations, garbage and our own messages are ignored quietly, each counted")
    func foreignSpoofedGarbageAndOwnAreIgnored() throws {
        var driver = PolicyDriver(advertising: true)
        let ours = try #require(driver.policy.serviceName)
        let ourLocation = "http://\(driver.ourLocation.host):\(driver.ourLocation.port)/NotificationBeacons"
        // A UPnP router on the same group.
        try driver.receive(aliveText(port: 1900, usn: "uuid:router::upnp:rootdevice", location: "http://10.0.0.5:80/desc.xml",
                                     nt: "upnp:rootdevice"), from: "10.0.0.5")
        // A Thali alive whose LOCATION points somewhere other than its source: a connection cannon.
        try driver.receive(aliveText(port: 1900, location: "http://10.9.9.9:80/NotificationBeacons"), from: "10.0.0.5")
        // Our NT with a USN that is no Thali USN; garbage; an oversized datagram.
        try driver.receive(aliveText(port: 1900, usn: "urn:x", location: "http://10.0.0.5:80"), from: "10.0.0.5")
        try driver.receive(Array(repeating: 0xFF, count: 64), from: "10.0.0.5")
        try driver.receive(Array(repeating: UInt8(ascii: "A"), count: 9000), from: "10.0.0.5")
        // Our own alive, looped back; and, after a beacon change, our previous USN at our own location.
        try driver.receive(aliveText(port: 1900, usn: ours, location: ourLocation), from: driver.ourLocation.host)
        driver.advertise(true)
        try driver.receive(aliveText(port: 1900, usn: ours, location: ourLocation), from: driver.ourLocation.host)
        let counters = driver.policy.counters
        #expect(counters.foreignMessagesIgnored == 1 && counters.spoofedLocationsIgnored == 1, "\(counters)")
        #expect(counters.malformedDatagrams == 3 && counters.ownMessagesIgnored == 2, "\(counters)")
        #expect(driver.policy.peers.isEmpty && driver.events.isEmpty)
    }

    @Test("a silently killed peer leaves by its max-age, on the housekeeping tick after it ran out")
    func aSilentPeerExpires() throws {
        var driver = PolicyDriver()
        let location = peerLocation("10.0.0.5")
        try driver.alive(usn(1), at: location, maxAge: 1)
        driver.advance(by: .milliseconds(950))
        #expect(driver.policy.peers.count == 1)
        driver.advance(by: .milliseconds(100))
        #expect(driver.events.last == .left(SSDPPeer(location: location, uniqueServiceName: usn(1), beaconState: .fetching),
                                            reason: .expired))
    }

    @Test("a flood from sources within their budgets switches discovery off for the cool-down, then on with a new window")
    func floodSwitchesDiscoveryOff() throws {
        var driver = PolicyDriver(configuration {
            $0.limits.maxDatagramsPerWindow = 20
            $0.limits.floodWindow = .seconds(10)
            $0.limits.discoveryCooldown = .milliseconds(700)
        })
        // Three sources, each within its own budget: only together do they exceed the global one.
        for index in 0..<60 {
            try driver.alive(usn(index), at: peerLocation("10.0.0.\(11 + index % 3)", port: 1000 + index))
        }
        #expect(driver.limitsTriggered == [.announcementFlood])
        #expect(driver.multicastOpen == false && driver.policy.isDiscoveryOff)
        #expect(driver.policy.counters.floodShutdowns == 1)
        #expect(driver.policy.peers.count == 20, "the 21st datagram switched discovery off; the stragglers were dropped")
        driver.advance(by: .milliseconds(699))
        #expect(driver.policy.isDiscoveryOff)
        driver.advance(by: .milliseconds(1))
        #expect(driver.multicastOpen && driver.policy.isDiscoveryOff == false)
        // Back on with a new flood window (the old one, 10 s long, is still full): 20 more are read.
        for index in 0..<20 {
            try driver.alive(usn(100 + index), at: peerLocation("10.0.1.\(1 + index % 4)", port: 2000 + index))
        }
        #expect(driver.policy.peers.count == 40 && driver.policy.counters.floodShutdowns == 1)
        try driver.alive(usn(999), at: peerLocation("10.0.1.9"))
        #expect(driver.policy.counters.floodShutdowns == 2 && driver.policy.isDiscoveryOff)
    }

    @Test("one source over its datagram budget is ignored alone: its datagrams count toward nothing global")
    func oneSourceFloodIsIgnoredAlone() throws {
        var driver = PolicyDriver(configuration {
            $0.limits.maxDatagramsPerSource = 20
            $0.limits.maxDatagramsPerWindow = 30
            $0.limits.floodWindow = .seconds(10)
        })
        for index in 0..<200 { try driver.alive(usn(index), at: peerLocation("10.0.0.41", port: 1000 + index)) }
        try driver.alive(usn(9999), at: peerLocation("10.0.0.42"))
        let counters = driver.policy.counters
        #expect(counters.sourcesIgnoredForRate == 1 && counters.datagramsFromIgnoredSources == 180, "\(counters)")
        #expect(counters.floodShutdowns == 0 && driver.policy.isDiscoveryOff == false)
        #expect(driver.policy.peers.contains { $0.uniqueServiceName == usn(9999) })
        #expect(driver.limitsTriggered.isEmpty)
    }

    @Test("one source announcing many locations gets maxPeersPerSource tracked, a place again when one leaves")
    func manyLocationsFromOneSource() throws {
        var driver = PolicyDriver(configuration {
            $0.limits.maxPeersPerSource = 4
            $0.limits.maxTrackedPeers = 10
        })
        for index in 0..<30 { try driver.alive(usn(index), at: peerLocation("10.0.0.51", port: 4000 + index)) }
        try driver.alive(usn(9999), at: peerLocation("10.0.0.52"))
        #expect(driver.policy.peers.filter { $0.location.host == "10.0.0.51" }.count == 4)
        #expect(driver.policy.peers.count == 5)
        #expect(driver.policy.counters.peersRejectedPerSource == 26 && driver.policy.counters.peerCapNarrowings == 0)
        // One of its peers leaves by byebye: another location of it may be tracked.
        try driver.receive("NOTIFY * HTTP/1.1\r\nHOST: 239.255.255.250:1900\r\nNT: \(ThaliServiceName.notificationType)\r\n"
                           + "NTS: ssdp:byebye\r\nUSN: \(usn(0))\r\n\r\n", from: "10.0.0.51")
        driver.advance(by: .milliseconds(400))
        try driver.alive(usn(500), at: peerLocation("10.0.0.51", port: 5000))
        #expect(driver.policy.peers.contains { $0.uniqueServiceName == usn(500) })
        #expect(driver.policy.counters.peersRejectedPerSource == 26)
    }

    @Test("past the read budget reading pauses to the window's end; the rest is read later; one report per episode")
    func readingNarrowsPerWindow() throws {
        var driver = PolicyDriver(configuration {
            $0.limits.maxDatagramsReadPerWindow = 20
            $0.limits.floodWindow = .seconds(1)
            $0.limits.maxPeersPerSource = 100
        })
        func announce(_ indices: Range<Int>) throws {
            for index in indices { try driver.alive(usn(index), at: peerLocation("10.0.0.\(61 + index % 3)", port: 1000 + index)) }
        }
        try announce(0..<60)
        #expect(driver.policy.peers.count == 20, "one window's budget read, the rest of the batch dropped unparsed")
        #expect(driver.readingPaused && driver.policy.counters.readPauses == 1)
        #expect(driver.limitsTriggered == [.narrowed])
        #expect(driver.policy.counters.floodShutdowns == 0 && driver.policy.isDiscoveryOff == false)
        driver.advance(by: .milliseconds(999))
        #expect(driver.readingPaused)
        driver.advance(by: .milliseconds(1))
        #expect(driver.readingPaused == false, "the window ended")
        try announce(20..<60)
        #expect(driver.policy.peers.count == 40 && driver.readingPaused && driver.policy.counters.readPauses == 2)
        driver.advance(by: .seconds(1))
        try announce(40..<60)
        #expect(driver.policy.peers.count == 60 && driver.readingPaused == false)
        // Still one episode, however many windows paused.
        #expect(driver.limitsTriggered == [.narrowed] && driver.policy.counters.narrowingEpisodes == 1)
        // narrowingEpisodeGap (10 s) without a pause ends it: the next pause is a new one, reported again.
        driver.advance(by: .seconds(10))
        try announce(100..<121)
        #expect(driver.limitsTriggered == [.narrowed, .narrowed] && driver.policy.counters.narrowingEpisodes == 2)
    }

    @Test("a full table narrows instead of switching off; it counts as filling up again only from below seven eighths")
    func theCapNarrows() throws {
        var driver = PolicyDriver(configuration { $0.limits.maxTrackedPeers = 3 })
        // Five hosts, one peer each, none read yet: none gives its place up.
        for index in 0..<5 { try driver.alive(usn(index), at: peerLocation("10.0.0.\(71 + index)")) }
        #expect(driver.policy.peers.count == 3 && driver.policy.isDiscoveryOff == false)
        #expect(driver.policy.counters.peersRejectedAtCap == 2 && driver.policy.counters.peerCapNarrowings == 1)
        #expect(driver.limitsTriggered == [.narrowed], "two refusals, one episode")
        // A peer read gives its place to a newcomer.
        driver.advance(by: .milliseconds(50))
        driver.finishFetch(usn(0), .fetched([1]))
        try driver.alive(usn(3), at: peerLocation("10.0.0.74"))
        #expect(driver.events.contains(.left(SSDPPeer(location: peerLocation("10.0.0.71"), uniqueServiceName: usn(0),
                                                      beaconState: .fetched([1])), reason: .narrowed)))
        #expect(driver.policy.counters.peersGivenUpAtCap == 1 && driver.policy.counters.peerCapNarrowings == 1)
        // Below seven eighths of the cap (a peer left), filling up again is counted again; same episode.
        try driver.receive("NOTIFY * HTTP/1.1\r\nHOST: 239.255.255.250:1900\r\nNT: \(ThaliServiceName.notificationType)\r\n"
                           + "NTS: ssdp:byebye\r\nUSN: \(usn(1))\r\n\r\n", from: "10.0.0.72")
        driver.advance(by: .milliseconds(400))
        try driver.alive(usn(5), at: peerLocation("10.0.0.76"))
        try driver.alive(usn(6), at: peerLocation("10.0.0.77"))
        #expect(driver.policy.counters.peersRejectedAtCap == 3 && driver.policy.counters.peerCapNarrowings == 2)
        #expect(driver.limitsTriggered == [.narrowed])
    }

    @Test("an M-SEARCH for us is answered by unicast within MX with every header; others' and our own are not")
    func searchesAreAnsweredWithinMX() throws {
        var driver = PolicyDriver(advertising: true)
        let ours = try #require(driver.policy.serviceName)
        try driver.search("upnp:rootdevice")
        try driver.search(searcher: ours)
        #expect(driver.searchAnswerTimers.isEmpty)
        #expect(driver.policy.counters.foreignMessagesIgnored == 1 && driver.policy.counters.ownMessagesIgnored == 1)
        try driver.search("ssdp:all", mx: 1, from: "10.0.0.9")
        let deadline = try #require(driver.searchAnswerTimers.first?.deadline)
        #expect(deadline < driver.now + .seconds(1))
        driver.advance(by: .seconds(1))
        let (message, destination) = try #require(driver.sent.last { if case .searchResponse = $0.message { true } else { false } })
        #expect(destination == (try SocketAddress(ipAddress: "10.0.0.9", port: 50000)))
        guard case .searchResponse(let response) = message else { Issue.record("\(message)"); return }
        #expect(response.uniqueServiceName == ours && response.location == driver.ourLocation.description)
        #expect(response.maxAge == 60 && response.date == "Thu, 01 Jan 2026 00:00:00 GMT")
        #expect(response.searchTarget == ThaliServiceName.notificationType)
        #expect(String(decoding: message.serialize(), as: UTF8.self).contains("\r\nEXT:\r\n"), "an empty header without a trailing space")
        // Our own NT is answered too; a peer advertising nothing answers nobody.
        try driver.search(ThaliServiceName.notificationType)
        #expect(driver.searchAnswerTimers.count == 1)
        var silent = PolicyDriver()
        try silent.search()
        #expect(silent.searchAnswerTimers.isEmpty)
        #expect(SSDPDiscoveryService.httpDate().hasSuffix(" GMT"))
    }

    @Test("an answer's delay is drawn below min(MX, maxSearchResponseDelaySeconds)")
    func answerDelayIsCapped() throws {
        var driver = PolicyDriver(configuration { $0.limits.maxPendingSearchResponses = 100 }, advertising: true)
        for _ in 0..<50 { try driver.search(mx: 120) }
        let delays = driver.searchAnswerTimers.map { $0.deadline - driver.now }
        #expect(delays.count == 50)
        #expect(delays.allSatisfy { $0 >= .zero && $0 < .seconds(5) })
        #expect(delays.contains { $0 >= .seconds(1) }, "spread over the capped window, not MX 1")
    }

    @Test("search answers are bounded under an M-SEARCH flood, and answered ones free their places")
    func searchAnswersAreBounded() throws {
        var driver = PolicyDriver(configuration { $0.limits.maxPendingSearchResponses = 2 }, advertising: true)
        for _ in 0..<6 { try driver.search(mx: 2) }
        #expect(driver.searchAnswerTimers.count == 2 && driver.policy.counters.searchResponsesDropped == 4)
        driver.advance(by: .seconds(2))
        #expect(driver.sent.filter { if case .searchResponse = $0.message { true } else { false } }.count == 2)
        try driver.search(mx: 2)
        #expect(driver.searchAnswerTimers.count == 1 && driver.policy.counters.searchResponsesDropped == 4)
    }

    @Test("background mode slows the alives to its interval; foreground restores them")
    func backgroundModeSlowsTheAlives() {
        var driver = PolicyDriver(advertising: true)
        driver.advance(by: .seconds(2))
        #expect(driver.alivesSent == 5, "the first at start, then one every 500 ms")
        driver.setBackground(true)
        driver.advance(by: .seconds(59))
        #expect(driver.alivesSent == 5)
        driver.advance(by: .seconds(1))
        #expect(driver.alivesSent == 6)
        driver.setBackground(false)
        driver.advance(by: .seconds(1))
        #expect(driver.alivesSent == 8)
    }

    @Test("a paused announcer sends byebye once, no alives and no answers, and resumes with the same USN")
    func anOverloadPausesAnnouncing() throws {
        var driver = PolicyDriver(advertising: true)
        let ours = try #require(driver.policy.serviceName)
        driver.pauseAnnouncing(for: .seconds(2), kind: .httpOverload)
        driver.pauseAnnouncing(for: .seconds(1), kind: .httpOverload)  // an ongoing pause is only extended
        #expect(driver.limitsTriggered == [.httpOverload] && driver.policy.isAnnouncingPaused)
        #expect(driver.sent.last?.message == .notification(.byebye(host: "239.255.255.250:1900",
                                                                   notificationType: ThaliServiceName.notificationType,
                                                                   uniqueServiceName: ours)))
        try driver.search()
        #expect(driver.searchAnswerTimers.isEmpty, "no answers while paused")
        let before = driver.alivesSent
        driver.advance(by: .milliseconds(1900))
        #expect(driver.alivesSent == before)
        driver.advance(by: .milliseconds(200))
        #expect(driver.alivesSent == before + 1 && driver.policy.isAnnouncingPaused == false)
        #expect(driver.policy.serviceName == ours)
    }

    @Test("a negative span once unicast worked is refused as configuration")
    func negativeSpanIsRefused() {
        let negative = configuration { $0.limits.unicastFailureMinimumSpanOnceWorked = .seconds(-1) }
        #expect(throws: SSDPDiscoveryService.StartError.invalidConfiguration("unicastFailureMinimumSpanOnceWorked")) {
            try negative.validate()
        }
    }
}
