import NIOCore
import Testing

@testable import ThaliSSDP

/// Discovery when the interface's address changes (`spec/ssdp.md` §4.3), on values in virtual time: the
/// peer that moves keeps its USN, says byebye for it from the old socket, announces it at the new
/// LOCATION and searches at once; a listener moves the USN's entry and drops the old location.
@Suite("Discovery policy: roaming")
struct RoamingPolicyTests {
    @Test("the mover: byebye for its USN, then the alive for the same USN at the new LOCATION and a search at once")
    func moverAnnouncesTheNewLocationAtOnce() throws {
        var driver = PolicyDriver(advertising: true)
        let usn = try #require(driver.policy.serviceName)
        driver.advance(by: .seconds(1))
        // The search on joining went out already: within the search interval, only a move searches again.
        #expect(driver.sent.contains { if case .search = $0.message { true } else { false } })
        let newLocation = BeaconLocation(host: "10.0.7.1", port: driver.ourLocation.port)
        let moving = driver.policy.moving(to: newLocation)
        let byebye = try #require(moving)
        guard case .notification(let notification) = byebye else { Issue.record("not a notification: \(byebye)"); return }
        #expect(notification.subtype == .byebye && notification.uniqueServiceName == usn)
        let actions = driver.policy.moved(now: driver.now)
        let sent = actions.compactMap { if case .send(let message, nil) = $0 { message } else { nil } }
        #expect(sent.count == 2)
        guard case .notification(let alive) = sent.first, case .search = sent.last else {
            Issue.record("expected an alive then a search: \(sent)")
            return
        }
        #expect(alive.subtype == .alive && alive.uniqueServiceName == usn)
        #expect(alive.location == newLocation.description)
        #expect(driver.policy.location == newLocation && driver.policy.serviceName == usn)
        #expect(driver.policy.counters.interfaceMoves == 1)
    }

    @Test("a silent mover sends no byebye and no alive, but searches")
    func silentMoverOnlySearches() {
        var driver = PolicyDriver(advertising: false)
        driver.advance(by: .seconds(1))
        #expect(driver.policy.moving(to: BeaconLocation(host: "10.0.7.1", port: 4242)) == nil)
        let actions = driver.policy.moved(now: driver.now)
        // The search, and the alive timer started over (its alives stay silent while nothing is advertised).
        #expect(actions.count == 2)
        guard case .send(.search, nil) = actions.first, case .arm(.alive, _) = actions.last else {
            Issue.record("expected a search: \(actions)")
            return
        }
    }

    @Test("a listener moves the USN to the new location: the old one leaves at once and the new one is fetched")
    func listenerDropsTheOldLocation() throws {
        var driver = PolicyDriver()
        let usn = "uuid:5d2e9a4c-1b7f-4c3a-9e6d-8a0b1c2d3e4f"
        let old = peerLocation("10.0.0.5")
        try driver.alive(usn, at: old)
        driver.advance(by: .milliseconds(10))
        driver.finishFetch(usn, .fetched([0xB0]))
        let new = peerLocation("10.0.8.5")
        try driver.alive(usn, at: new)
        #expect(driver.events.suffix(2) == [.left(SSDPPeer(location: old, uniqueServiceName: usn, beaconState: .fetched([0xB0])), reason: .byebye),
                                            .appeared(SSDPPeer(location: new, uniqueServiceName: usn, beaconState: .fetching))])
        #expect(driver.policy.peers.map(\.location) == [new])
        driver.advance(by: .milliseconds(10))
        driver.finishFetch(usn, .fetched([0xB0]))
        // The same stream again, from its new location: delivered again (the receiver keys replays by location).
        #expect(driver.delivered.map(\.bytes) == [[0xB0], [0xB0]])
    }

    @Test("a byebye from the old address after the move does not remove the moved peer")
    func byebyeFromTheOldAddressAfterTheMoveIsIgnored() throws {
        var driver = PolicyDriver()
        let usn = "uuid:5d2e9a4c-1b7f-4c3a-9e6d-8a0b1c2d3e40"
        try driver.alive(usn, at: peerLocation("10.0.0.5"))
        try driver.alive(usn, at: peerLocation("10.0.8.5"))
        try driver.receive("NOTIFY * HTTP/1.1\r\nHOST: 239.255.255.250:1900\r\nNT: http://www.thaliproject.org/ssdp\r\n"
                           + "NTS: ssdp:byebye\r\nUSN: \(usn)\r\n\r\n", from: "10.0.0.5")
        driver.advance(by: .seconds(1))
        #expect(driver.policy.peers.map(\.location) == [peerLocation("10.0.8.5")])
    }
}
