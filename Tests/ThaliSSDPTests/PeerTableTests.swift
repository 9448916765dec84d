import NIOCore
import Testing

@testable import ThaliSSDP

@Suite("Peer table and announcer state machines")
struct PeerTableTests {
    let start = NIODeadline.uptimeNanoseconds(1_000_000_000)
    let a = BeaconLocation(host: "10.0.0.1", port: 1000)
    let b = BeaconLocation(host: "10.0.0.2", port: 1000)

    @Test func appearsOnceRefreshesThenExpires() {
        var table = PeerTable(maxPeers: 10, byebyeGrace: .milliseconds(300))
        let first = table.alive(serviceName: "uuid:1", location: a, maxAge: 5, now: start)
        let peer = SSDPPeer(location: a, uniqueServiceName: "uuid:1", beaconState: .fetching)
        #expect(first == [.emit(.appeared(peer)), .fetch(a, serviceName: "uuid:1")])
        #expect(table.alive(serviceName: "uuid:1", location: a, maxAge: 5, now: start + .seconds(3)).isEmpty)
        #expect(table.expire(now: start + .seconds(7)).isEmpty)  // refreshed at 3 s
        #expect(table.expire(now: start + .seconds(8)) == [.emit(.left(peer, reason: .expired))])
        #expect(table.count == 0)
    }

    @Test func byebyeThenNewServiceNameIsAChange() {
        var table = PeerTable(maxPeers: 10, byebyeGrace: .milliseconds(300))
        _ = table.alive(serviceName: "uuid:1", location: a, maxAge: 60, now: start)
        _ = table.fetched(serviceName: "uuid:1", result: .fetched([1]), now: start)
        #expect(table.byebye(serviceName: "uuid:1", source: "10.0.0.1", now: start).isEmpty)
        let actions = table.alive(serviceName: "uuid:2", location: a, maxAge: 60, now: start + .milliseconds(1))
        let peer = SSDPPeer(location: a, uniqueServiceName: "uuid:2", beaconState: .fetching)
        #expect(actions == [.emit(.changed(peer, previousServiceName: "uuid:1")), .fetch(a, serviceName: "uuid:2")])
        #expect(table.expire(now: start + .seconds(1)).isEmpty)
        // A late result for the old USN is dropped.
        #expect(table.fetched(serviceName: "uuid:1", result: .fetched([9]), now: start).isEmpty)
    }

    @Test("a failed fetch is tried again on a later alive of the same USN, the waits doubling, until it succeeds")
    func aFailedFetchIsRetriedOnALaterAlive() {
        var table = PeerTable(maxPeers: 10, byebyeGrace: .milliseconds(300), refetchDelay: .seconds(2),
                              maxRefetchDelay: .seconds(5))
        _ = table.alive(serviceName: "uuid:1", location: a, maxAge: 60, now: start)
        let timedOut = BeaconFetchFailure(.responseTimedOut, "timed out")
        let failed = table.fetched(serviceName: "uuid:1", result: .failed, failure: timedOut, now: start)
        #expect(failed == [.emit(.beaconFetchFailed(SSDPPeer(location: a, uniqueServiceName: "uuid:1", beaconState: .failed),
                                                     timedOut))])
        // Alives within the wait only refresh; the first one after it fetches again, once.
        #expect(table.alive(serviceName: "uuid:1", location: a, maxAge: 60, now: start + .milliseconds(1999)).isEmpty)
        #expect(table.alive(serviceName: "uuid:1", location: a, maxAge: 60, now: start + .seconds(2))
                == [.fetch(a, serviceName: "uuid:1")])
        #expect(table.alive(serviceName: "uuid:1", location: a, maxAge: 60, now: start + .seconds(3)).isEmpty)
        // A second failure in a row waits twice as long; a third is capped at the ceiling.
        _ = table.fetched(serviceName: "uuid:1", result: .failed, now: start + .seconds(3))
        #expect(table.alive(serviceName: "uuid:1", location: a, maxAge: 60, now: start + .milliseconds(6999)).isEmpty)
        #expect(table.alive(serviceName: "uuid:1", location: a, maxAge: 60, now: start + .seconds(7)) == [.fetch(a, serviceName: "uuid:1")])
        _ = table.fetched(serviceName: "uuid:1", result: .failed, now: start + .seconds(7))
        #expect(table.alive(serviceName: "uuid:1", location: a, maxAge: 60, now: start + .milliseconds(11999)).isEmpty)
        #expect(table.alive(serviceName: "uuid:1", location: a, maxAge: 60, now: start + .seconds(12)) == [.fetch(a, serviceName: "uuid:1")])
        // Success: the USN is not fetched again, and the next failure starts from the first wait.
        _ = table.fetched(serviceName: "uuid:1", result: .fetched([1]), now: start + .seconds(12))
        #expect(table.alive(serviceName: "uuid:1", location: a, maxAge: 60, now: start + .seconds(40)).isEmpty)
        _ = table.alive(serviceName: "uuid:2", location: a, maxAge: 60, now: start + .seconds(41))
        _ = table.fetched(serviceName: "uuid:2", result: .failed, now: start + .seconds(41))
        #expect(table.alive(serviceName: "uuid:2", location: a, maxAge: 60, now: start + .seconds(43)) == [.fetch(a, serviceName: "uuid:2")])
    }

    @Test func byebyeAloneIsADepartureAfterTheGrace() {
        var table = PeerTable(maxPeers: 10, byebyeGrace: .milliseconds(300))
        _ = table.alive(serviceName: "uuid:1", location: a, maxAge: 60, now: start)
        _ = table.byebye(serviceName: "uuid:1", source: "10.0.0.1", now: start)
        #expect(table.expire(now: start + .milliseconds(299)).isEmpty)
        let left = table.expire(now: start + .milliseconds(300))
        #expect(left == [.emit(.left(SSDPPeer(location: a, uniqueServiceName: "uuid:1", beaconState: .fetching), reason: .byebye))])
        #expect(table.byebye(serviceName: "uuid:unknown", source: "10.0.0.1", now: start).isEmpty)
    }

    @Test func aByebyeFromAnotherAddressIsIgnored() {
        var table = PeerTable(maxPeers: 10, byebyeGrace: .milliseconds(300))
        _ = table.alive(serviceName: "uuid:1", location: a, maxAge: 60, now: start)
        _ = table.byebye(serviceName: "uuid:1", source: "10.0.0.66", now: start)
        #expect(table.expire(now: start + .seconds(1)).isEmpty)
        #expect(table.count == 1)
    }

    @Test func deployedGenerationsWithoutByebyeAreChanges() {
        var table = PeerTable(maxPeers: 10, byebyeGrace: .milliseconds(300))
        let old = "data:3f2c1a9e-6b7d-4e21-9c3a-0d5e8f7a6b10:0"
        let new = "data:3f2c1a9e-6b7d-4e21-9c3a-0d5e8f7a6b10:1"
        _ = table.alive(serviceName: old, location: a, maxAge: 1800, now: start)
        let actions = table.alive(serviceName: new, location: a, maxAge: 1800, now: start)
        #expect(actions.first == .emit(.changed(SSDPPeer(location: a, uniqueServiceName: new, beaconState: .fetching),
                                                previousServiceName: old)))
    }

    @Test func capRefusesNewPeersButKeepsRefreshingKnownOnes() {
        var table = PeerTable(maxPeers: 1, byebyeGrace: .milliseconds(300))
        _ = table.alive(serviceName: "uuid:1", location: a, maxAge: 60, now: start)
        #expect(table.alive(serviceName: "uuid:2", location: b, maxAge: 60, now: start) == [.capExceeded])
        #expect(table.alive(serviceName: "uuid:1", location: a, maxAge: 60, now: start).isEmpty)
        #expect(table.count == 1)
    }

    @Test func announcerSendsByebyeForOldThenAliveForNew() throws {
        var configuration = SSDPDiscoveryConfiguration(interfaceAddress: "10.0.0.9")
        configuration.port = 4000
        var announcer = SSDPAnnouncer(configuration: configuration, location: BeaconLocation(host: "10.0.0.9", port: 77))
        let first = announcer.beaconsChanged(advertising: true)
        let firstName = try #require(announcer.serviceName)
        #expect(first.count == 1)
        let second = announcer.beaconsChanged(advertising: true)
        let secondName = try #require(announcer.serviceName)
        #expect(firstName != secondName)
        guard second.count == 2, case .notification(let bye) = second[0], case .notification(let hello) = second[1] else {
            Issue.record("expected byebye then alive"); return
        }
        #expect(bye.subtype == .byebye && bye.uniqueServiceName == firstName)
        #expect(hello.subtype == .alive && hello.uniqueServiceName == secondName)
        #expect(hello.location == "http://10.0.0.9:77/NotificationBeacons")
        #expect(hello.host == "239.255.255.250:4000" && hello.maxAge == 60)

        // Paused: the byebye goes out, ticks are silent until the pause ends, then alives resume.
        let pauseEnd = start + .seconds(10)
        #expect(announcer.pause(until: pauseEnd) == announcer.byebye(secondName))
        #expect(announcer.tick(now: start) == nil)
        #expect(announcer.answer(to: SSDPSearchRequest(host: "h", maxWaitSeconds: 1, searchTarget: "ssdp:all"), date: "d") == nil)
        #expect(announcer.tick(now: pauseEnd) == announcer.alive(secondName))
        #expect(announcer.shutdown() == announcer.byebye(secondName))
        #expect(announcer.tick(now: pauseEnd) == nil)
    }

    @Test func answersOnlyOurTargetOrAllAndNeverOurselves() throws {
        var announcer = SSDPAnnouncer(configuration: SSDPDiscoveryConfiguration(interfaceAddress: "10.0.0.9"),
                                      location: BeaconLocation(host: "10.0.0.9", port: 77))
        _ = announcer.beaconsChanged(advertising: true)
        let me = try #require(announcer.serviceName)
        let ours = SSDPSearchRequest(host: "h", maxWaitSeconds: 1, searchTarget: ThaliServiceName.notificationType)
        guard case .searchResponse(let response) = try #require(announcer.answer(to: ours, date: "d")) else {
            Issue.record("no response"); return
        }
        #expect(response.uniqueServiceName == me && response.searchTarget == ThaliServiceName.notificationType)
        #expect(announcer.answer(to: SSDPSearchRequest(host: "h", maxWaitSeconds: 1, searchTarget: "ssdp:all"), date: "d") != nil)
        #expect(announcer.answer(to: SSDPSearchRequest(host: "h", maxWaitSeconds: 1, searchTarget: "upnp:rootdevice"), date: "d") == nil)
        #expect(announcer.answer(to: SSDPSearchRequest(host: "h", maxWaitSeconds: 1, searchTarget: "ssdp:all",
                                                       searcherServiceName: me), date: "d") == nil)
    }

    @Test func searcherIsRateLimited() {
        var searcher = SSDPSearcher(interval: .seconds(300))
        let join = searcher.shouldSearch(now: start)
        let tooSoon = searcher.shouldSearch(now: start + .seconds(299))
        let later = searcher.shouldSearch(now: start + .seconds(300))
        #expect(join && !tooSoon && later)
    }
}
