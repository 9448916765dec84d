import Testing
import ThaliBLEBinding
@testable import ThaliNodeBluetooth
import ThaliNodeCore
import ThaliSupport

/// A generator that returns the same word every time: 1 draws the bottom of every jitter range (0 would
/// make a bounded draw reject it forever), `.max` the top.
private struct ConstantGenerator: RandomNumberGenerator, Sendable {
    let word: UInt64
    mutating func next() -> UInt64 { word }
}

/// The Bluetooth binding's schedule without I/O: link slots, the waiting queue and its cap, yielding to
/// the lower address, failures in a row, giving up, giving a slot to a waiting peer, and the delays.
@Suite struct BluetoothPursuitStateMachineTests {
    typealias Machine = BluetoothPursuitStateMachine

    static let own = BluetoothAddress("00:AA:00:00:00:50")!
    /// Lower than ours: we are the higher address and let it link first.
    static let lower = BluetoothAddress("00:AA:00:00:00:10")!
    /// Higher than ours: we link first.
    static let higher = BluetoothAddress("00:AA:00:00:00:90")!

    /// Peer `n` (all higher than ours) and its advertiser.
    static func peer(_ n: Int) -> BluetoothAddress { BluetoothAddress(octets: [0x00, 0xBB, 0, 0, 0, UInt8(n)])! }
    static func advertiser(_ n: Int) -> BluetoothAddress { BluetoothAddress(octets: [0x40, 0xCC, 0, 0, 0, UInt8(n)])! }

    /// Reconnects from 2 s doubling up to 32 s, ±50 %; the yield pause 2 s ±25 %; the wait for the lower
    /// address's link 5 s. The generator draws the bottom of every range: half the reconnect delay, three
    /// quarters of the yield pause.
    static func machine(slots: Int = 8, waiting: Int = 64, attempts: Int = 4) -> Machine {
        Machine(ownAddress: own,
                limits: .init(maxConnectedPeers: slots, maxWaitingPeers: waiting, maxConnectAttempts: attempts),
                delays: .init(reconnect: Backoff(base: .seconds(2), cap: .seconds(32), jitter: 0.5),
                              yieldPause: Backoff(base: .seconds(2), cap: .seconds(2), jitter: 0.25),
                              yieldToLowerAddress: .seconds(5)),
                random: ConstantGenerator(word: 1))
    }

    /// Hears peer `n` and takes its pursuit to its first reach.
    static func pursue(_ n: Int, in machine: inout Machine) {
        #expect(machine.heard(peer(n), advertiser: advertiser(n)) == [.pursue(peer(n))])
        #expect(machine.begin(peer(n), peerWillLinkToUs: false) == .reach)
    }

    // MARK: Starting a pursuit

    @Test func theLowerAddressReachesAtOnce() {
        var machine = Self.machine()
        #expect(machine.heard(Self.higher, advertiser: nil) == [.pursue(Self.higher)])
        #expect(machine.pursuits[Self.higher]?.phase == .starting)
        // Whether the peer will link to us does not matter: we are the one who links.
        #expect(machine.begin(Self.higher, peerWillLinkToUs: true) == .reach)
        #expect(machine.pursuits[Self.higher]?.phase == .reaching)
    }

    @Test func theHigherAddressWaitsForTheLowerOnesLinkWhenItCanKnowAboutUs() {
        var machine = Self.machine()
        _ = machine.heard(Self.lower, advertiser: nil)
        #expect(machine.begin(Self.lower, peerWillLinkToUs: true) == .awaitLink(upTo: .seconds(5)))
        #expect(machine.pursuits[Self.lower]?.phase == .awaitingLink)
        // Its link came (or the bound ran out): reach it, over that link if it is there.
        #expect(machine.waitEnded(Self.lower) == .reach)
        #expect(machine.pursuits[Self.lower]?.phase == .reaching)
    }

    @Test func theHigherAddressPausesBrieflyWhenTheLowerCannotKnowAboutUs() {
        var machine = Self.machine()
        _ = machine.heard(Self.lower, advertiser: nil)
        #expect(machine.begin(Self.lower, peerWillLinkToUs: false) == .pause(.milliseconds(1500)))
        #expect(machine.pursuits[Self.lower]?.phase == .yielding)
        #expect(machine.waitEnded(Self.lower) == .reach)
    }

    @Test func aPeerAlreadyPursuedOurOwnAddressAndAnythingAfterStopAreNotPursued() {
        var machine = Self.machine()
        #expect(machine.heard(Self.own, advertiser: Self.advertiser(1)) == [])
        Self.pursue(1, in: &machine)
        #expect(machine.heard(Self.peer(1), advertiser: Self.advertiser(1)) == [])
        #expect(machine.pursuits.count == 1)
        machine.stop()
        #expect(machine.heard(Self.peer(2), advertiser: Self.advertiser(2)) == [])
        #expect(machine.pursuits.count == 1 && machine.waiting.isEmpty)
    }

    // MARK: Failures, backoff, giving up

    @Test func failedConnectsBackOffDoublingAndGiveUpAfterMaxConnectAttempts() {
        var machine = Self.machine(attempts: 4)
        Self.pursue(1, in: &machine)
        // Retry n + 1 after n failures: 4 s, 8 s, 16 s nominal, drawn at half.
        for (failures, delay) in [(1, Duration.seconds(2)), (2, .seconds(4)), (3, .seconds(8))] {
            #expect(machine.reachEnded(Self.peer(1), .failed) == .pause(delay))
            #expect(machine.pursuits[Self.peer(1)] == .init(advertiser: Self.advertiser(1), failures: failures, phase: .backingOff))
            #expect(machine.waitEnded(Self.peer(1)) == .reach)
        }
        // The fourth in a row: given up, its slot free, its advertiser forgotten so that a new report starts over.
        #expect(machine.reachEnded(Self.peer(1), .failed) == .end([.forget(advertiser: Self.advertiser(1))]))
        #expect(machine.pursuits.isEmpty)
        #expect(machine.heard(Self.peer(1), advertiser: Self.advertiser(1)) == [.pursue(Self.peer(1))])
        #expect(machine.pursuits[Self.peer(1)]?.failures == 0)
    }

    @Test func aLinkThatEndedStartsTheFailuresOverAndReachesAgainAfterTheFirstDelay() {
        var machine = Self.machine(attempts: 3)
        Self.pursue(1, in: &machine)
        #expect(machine.reachEnded(Self.peer(1), .failed) == .pause(.seconds(2)))
        #expect(machine.waitEnded(Self.peer(1)) == .reach)
        #expect(machine.reachEnded(Self.peer(1), .failed) == .pause(.seconds(4)))
        #expect(machine.waitEnded(Self.peer(1)) == .reach)
        // The link came up and ended: 2 s nominal, and two more failures do not yet give up.
        #expect(machine.reachEnded(Self.peer(1), .ended) == .pause(.seconds(1)))
        #expect(machine.pursuits[Self.peer(1)]?.failures == 0)
        for delay: Duration in [.seconds(2), .seconds(4)] {
            #expect(machine.waitEnded(Self.peer(1)) == .reach)
            #expect(machine.reachEnded(Self.peer(1), .failed) == .pause(delay))
        }
        #expect(machine.waitEnded(Self.peer(1)) == .reach)
        guard case .end = machine.reachEnded(Self.peer(1), .failed) else { Issue.record("expected the end"); return }
    }

    @Test func theBackoffStopsGrowingAtItsCap() {
        var machine = Self.machine(attempts: 100)
        Self.pursue(1, in: &machine)
        var delays: [Duration] = []
        for _ in 0..<8 {
            guard case .pause(let delay) = machine.reachEnded(Self.peer(1), .failed) else { Issue.record("expected a pause"); return }
            delays.append(delay)
            _ = machine.waitEnded(Self.peer(1))
        }
        #expect(delays == [.seconds(2), .seconds(4), .seconds(8), .seconds(16), .seconds(16), .seconds(16), .seconds(16), .seconds(16)])
    }

    @Test func theDelaysAreJitteredByTheInjectedGenerator() {
        var top = Machine(ownAddress: Self.own, limits: .init(maxConnectedPeers: 1, maxWaitingPeers: 1, maxConnectAttempts: 4),
                          delays: Self.machine().delays, random: ConstantGenerator(word: .max))
        _ = top.heard(Self.lower, advertiser: nil)
        // The top of ±25 % of 2 s, and of ±50 % of 4 s.
        guard case .pause(let yield) = top.begin(Self.lower, peerWillLinkToUs: false) else { Issue.record("expected a pause"); return }
        #expect(yield > .milliseconds(2490) && yield <= .milliseconds(2500))
        _ = top.waitEnded(Self.lower)
        guard case .pause(let backoff) = top.reachEnded(Self.lower, .failed) else { Issue.record("expected a pause"); return }
        #expect(backoff > .milliseconds(5990) && backoff <= .seconds(6))
    }

    @Test func limitsThatWouldNeverReachAnyoneAreRaisedToOne() {
        let limits = Machine.Limits(maxConnectedPeers: 0, maxWaitingPeers: -3, maxConnectAttempts: 0)
        #expect(limits == .init(maxConnectedPeers: 1, maxWaitingPeers: 0, maxConnectAttempts: 1))
        var machine = Self.machine(slots: 0, waiting: 0, attempts: 0)
        Self.pursue(1, in: &machine)
        #expect(machine.heard(Self.peer(2), advertiser: Self.advertiser(2)) == [.forget(advertiser: Self.advertiser(2))])
        #expect(machine.reachEnded(Self.peer(1), .failed) == .end([.forget(advertiser: Self.advertiser(1))]))
    }

    // MARK: Slots and the waiting queue

    @Test func peersPastTheSlotsWaitInTurnAndTheQueueNeverPassesItsCap() {
        var machine = Self.machine(slots: 2, waiting: 3)
        Self.pursue(1, in: &machine)
        Self.pursue(2, in: &machine)
        for n in 3...5 { #expect(machine.heard(Self.peer(n), advertiser: Self.advertiser(n)) == []) }
        // Heard again while waiting: still once in the queue.
        #expect(machine.heard(Self.peer(4), advertiser: Self.advertiser(4)) == [])
        #expect(machine.waiting.map(\.peer) == [3, 4, 5].map(Self.peer))
        // Past the cap: not remembered, and its advertiser forgotten so that BlueZ's next report offers it again.
        #expect(machine.heard(Self.peer(6), advertiser: Self.advertiser(6)) == [.forget(advertiser: Self.advertiser(6))])
        // A peer that connected to us has no advertiser to forget.
        #expect(machine.heard(Self.peer(7), advertiser: nil) == [])
        #expect(machine.waiting.count == 3 && machine.pursuits.count == 2)
        #expect(machine.hasWaitingPeer)
    }

    @Test func aPursuitThatWouldBackOffGivesItsSlotToTheFirstWaitingPeerAndKeepsItsFailures() {
        var machine = Self.machine(slots: 1)
        Self.pursue(1, in: &machine)
        _ = machine.heard(Self.peer(2), advertiser: Self.advertiser(2))
        // Instead of a pause: its slot to peer 2, itself to the back of the queue with one failure.
        #expect(machine.reachEnded(Self.peer(1), .failed) == .end([.pursue(Self.peer(2))]))
        #expect(machine.waiting == [.init(peer: Self.peer(1), advertiser: Self.advertiser(1), failures: 1)])
        #expect(machine.begin(Self.peer(2), peerWillLinkToUs: false) == .reach)
        #expect(machine.reachEnded(Self.peer(2), .ended) == .end([.pursue(Self.peer(1))]))
        // Its failures came along: three more give up (four in a row).
        #expect(machine.pursuits[Self.peer(1)]?.failures == 1)
        #expect(machine.begin(Self.peer(1), peerWillLinkToUs: false) == .reach)
        #expect(machine.reachEnded(Self.peer(1), .failed) == .end([.pursue(Self.peer(2))]))
        #expect(machine.waiting.first?.failures == 2)
    }

    @Test func anIdleLinkGivesItsSlotUpWithNoFailuresOrTakesItStraightBackWhenNobodyWaits() {
        var machine = Self.machine(slots: 1)
        Self.pursue(1, in: &machine)
        _ = machine.reachEnded(Self.peer(1), .failed)
        _ = machine.waitEnded(Self.peer(1))
        // Nobody waits (another pursuit took the waiting peer first): the slot again at once, no forget.
        #expect(machine.reachEnded(Self.peer(1), .yielded) == .end([.pursue(Self.peer(1))]))
        #expect(machine.pursuits[Self.peer(1)] == .init(advertiser: Self.advertiser(1), failures: 0, phase: .starting))
        #expect(machine.begin(Self.peer(1), peerWillLinkToUs: false) == .reach)
        _ = machine.heard(Self.peer(2), advertiser: Self.advertiser(2))
        #expect(machine.reachEnded(Self.peer(1), .yielded) == .end([.pursue(Self.peer(2))]))
        #expect(machine.waiting == [.init(peer: Self.peer(1), advertiser: Self.advertiser(1), failures: 0)])
    }

    @Test func aPursuitThatGivesUpHandsItsSlotToTheFirstWaitingPeer() {
        var machine = Self.machine(slots: 1, attempts: 1)
        Self.pursue(1, in: &machine)
        _ = machine.heard(Self.peer(2), advertiser: Self.advertiser(2))
        _ = machine.heard(Self.peer(3), advertiser: Self.advertiser(3))
        #expect(machine.reachEnded(Self.peer(1), .failed) == .end([.forget(advertiser: Self.advertiser(1)), .pursue(Self.peer(2))]))
        #expect(machine.waiting.map(\.peer) == [Self.peer(3)])
        #expect(Set(machine.pursuedPeers) == [Self.peer(2)])
    }

    @Test func aCrowdLargerThanTheSlotsTakesTurnsFairly() {
        let slots = 3, crowd = 11
        var machine = Self.machine(slots: slots, waiting: 64)
        var turns = [Int](repeating: 0, count: crowd + 1)
        var started: [Int] = []
        func take(_ actions: [Machine.Action]) {
            for case .pursue(let peer) in actions {
                let n = Int(peer.octets[5])
                turns[n] += 1
                started.append(n)
                #expect(machine.begin(peer, peerWillLinkToUs: false) == .reach)
            }
        }
        for n in 1...crowd { take(machine.heard(Self.peer(n), advertiser: Self.advertiser(n))) }
        #expect(machine.pursuits.count == slots && machine.waiting.count == crowd - slots)
        // Each link in turn goes idle after its fetch while others wait, and gives its slot up.
        for round in 0..<(crowd * 5) {
            let n = started[round]
            guard case .end(let actions) = machine.reachEnded(Self.peer(n), .yielded) else { Issue.record("expected the end"); return }
            take(actions)
            #expect(machine.pursuits.count == slots && machine.waiting.count == crowd - slots)
        }
        // Every peer had its turns, none more than one more than another.
        let counts = turns[1...]
        #expect(counts.min()! >= 5 && counts.max()! - counts.min()! <= 1)
    }

    @Test func aCrowdPastTheQueueCapNeverGrowsItAndItsAdvertisersAreForgotten() {
        var machine = Self.machine(slots: 2, waiting: 4)
        var forgotten: Set<BluetoothAddress> = []
        // BlueZ reports every peer again and again (after a forget, its next advertisement).
        for _ in 0..<5 {
            for n in 1...40 {
                for action in machine.heard(Self.peer(n), advertiser: Self.advertiser(n)) {
                    switch action {
                    case .pursue(let peer): #expect(machine.begin(peer, peerWillLinkToUs: false) == .reach)
                    case .forget(let advertiser): forgotten.insert(advertiser)
                    }
                }
                #expect(machine.waiting.count <= 4 && machine.pursuits.count <= 2)
            }
        }
        #expect(forgotten == Set((7...40).map(Self.advertiser)))
        #expect(Set(machine.pursuedPeers) == [Self.peer(1), Self.peer(2)])
        #expect(machine.waiting.map(\.peer) == (3...6).map(Self.peer))
    }

    // MARK: Stop and out-of-turn events

    @Test func afterStopEveryPursuitEndsAndNothingWaits() {
        var machine = Self.machine(slots: 2)
        _ = machine.heard(Self.lower, advertiser: nil)
        #expect(machine.begin(Self.lower, peerWillLinkToUs: true) == .awaitLink(upTo: .seconds(5)))
        Self.pursue(1, in: &machine)
        _ = machine.heard(Self.peer(2), advertiser: Self.advertiser(2))
        _ = machine.heard(Self.peer(3), advertiser: Self.advertiser(3))
        machine.stop()
        #expect(machine.isStopped && !machine.hasWaitingPeer)
        // No retry it will not make, no slot handed on, no advertiser forgotten.
        #expect(machine.waitEnded(Self.lower) == .end([]))
        #expect(machine.reachEnded(Self.peer(1), .ended) == .end([]))
        #expect(machine.reachEnded(Self.peer(1), .failed) == .end([]))
    }

    @Test func stepsOutOfTurnEndAPursuitThatIsNotThere() {
        var machine = Self.machine()
        #expect(machine.reachEnded(Self.peer(1), .ended) == .end([]))
        #expect(machine.waitEnded(Self.peer(1)) == .end([]))
        #expect(machine.begin(Self.peer(1), peerWillLinkToUs: false) == .end([]))
        #expect(machine.pursuits.isEmpty)
    }
}

/// The bounded read of page scan: as soon as it is on, false after the timeout (with a last read), and
/// an end when cancelled.
@Suite struct PageScanWaitTests {
    @Test func returnsAtTheFirstReadThatSaysOn() async throws {
        var reads = 0
        let on = try await PageScanWait(timeout: .seconds(30), interval: .milliseconds(1)).until {
            reads += 1
            return reads == 3
        }
        #expect(on && reads == 3)
    }

    @Test func givesUpAfterTheTimeoutWithALastReadAndNoMoreReadsThanItsIntervalsAllow() async throws {
        var reads = 0
        let on = try await PageScanWait(timeout: .milliseconds(50), interval: .milliseconds(10)).until {
            reads += 1
            return false
        }
        // The first read, one after each sleep (sleeps never end early): at most 1 + 50 / 10.
        #expect(!on && reads >= 2 && reads <= 6)
    }

    @Test func aCancelledWaitThrows() async {
        let wait = Task { try await PageScanWait(timeout: .seconds(60), interval: .seconds(10)).until { false } }
        wait.cancel()
        await #expect(throws: CancellationError.self) { try await wait.value }
    }
}

/// The gate advertising waits at until page scan settled.
@Suite struct OneTimeSignalTests {
    @Test func waitsBeforeTheSignalEndAtItAndLaterOnesAtOnce() async {
        let signal = OneTimeSignal()
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<3 { group.addTask { await signal.wait() } }
            #expect(!signal.isOpen)
            signal.signal()
            await group.waitForAll()
        }
        #expect(signal.isOpen)
        await signal.wait()
    }

    @Test func aCancelledWaitEndsWhileTheGateStaysShut() async {
        let signal = OneTimeSignal()
        let waiting = Task { await signal.wait() }
        waiting.cancel()
        await waiting.value
        #expect(!signal.isOpen)
    }
}
