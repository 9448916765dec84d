import NIOConcurrencyHelpers
import Testing
import ThaliBeacons
import ThaliSSDP
@testable import ThaliNodeCore

/// The connecting side's decisions, without I/O: which binding first, falling back, backing off, giving
/// up, and which routes a completed session served.
@Suite struct ContactLinkStateMachineTests {
    static let sender = PrivateKey().publicKey
    static let later = UInt64.max / 2

    static func route(_ binding: PeerBindingKind, identity: String = "psk-1", port: Int = 5000) -> ContactRoute {
        let location = binding == .wifi ? BeaconLocation(host: "10.0.0.2", port: port) : BeaconLocation(host: "127.0.0.1", port: port)
        let origin = binding == .wifi ? PeerLocation.wifi(location) : PeerLocation("bluetooth:00:AA:01:00:00:0\(port % 10)")!
        return ContactRoute(origin: origin, location: location,
                            match: BeaconMatch(sender: sender, beaconIndex: 0, pskIdentity: identity, psk: [1, 2, 3],
                                               expiration: later))
    }

    static func machine(maxAttempts: Int = 4) -> ContactLinkStateMachine {
        ContactLinkStateMachine(maxAttempts: maxAttempts, rest: .seconds(60), delay: { .milliseconds(100 * $0) })
    }

    /// The binding of a `.connect` action, or nil for any other action.
    static func connectBinding(_ action: ContactLinkStateMachine.Action) -> PeerBindingKind? {
        if case .connect(let route, _) = action { return route.binding }
        return nil
    }

    @Test func theFasterBindingIsTriedFirstWhicheverMatchedFirst() {
        var machine = Self.machine()
        #expect(machine.matched(Self.route(.bluetooth)) == .startTask)
        #expect(machine.matched(Self.route(.wifi)) == .none)
        #expect(machine.state == .matched)
        let action = machine.nextAction()
        #expect(Self.connectBinding(action) == .wifi)
        #expect(machine.state == .connecting(.wifi, attempt: 1))
        machine.connected()
        #expect(machine.state == .connected(.wifi))
        // Both routes carried the same announcement: one session serves both.
        machine.sessionCompleted()
        #expect(machine.state == .idle)
        guard case .finish = machine.nextAction() else { Issue.record("expected finish"); return }
        #expect(!machine.isRunning)
    }

    @Test func anAppsOwnBindingIsTriedInItsPreferenceOrder() {
        let slow = PeerBindingKind(rawValue: "lora", preference: 200), middle = PeerBindingKind(rawValue: "mesh", preference: 50)
        func route(_ kind: PeerBindingKind) -> ContactRoute {
            ContactRoute(origin: .other(kind, address: "peer-1"), location: BeaconLocation(host: "127.0.0.1", port: 7000),
                         match: BeaconMatch(sender: Self.sender, beaconIndex: 0, pskIdentity: "psk-1", psk: [1], expiration: Self.later))
        }
        var machine = Self.machine()
        _ = machine.matched(route(slow))
        _ = machine.matched(Self.route(.bluetooth))
        _ = machine.matched(route(middle))
        var tried: [PeerBindingKind] = []
        for _ in 0..<3 {
            guard case .connect(let next, _) = machine.nextAction() else { break }
            tried.append(next.binding)
            _ = machine.attemptFailed(.retryable)
        }
        #expect(tried == [middle, .bluetooth, slow])
    }

    @Test func aFailureFallsBackToTheOtherBindingAtOnceThenBacksOff() {
        var machine = Self.machine()
        _ = machine.matched(Self.route(.wifi))
        _ = machine.matched(Self.route(.bluetooth))
        #expect(Self.connectBinding(machine.nextAction()) == .wifi)
        #expect(machine.attemptFailed(.retryable) == .zero)
        #expect(Self.connectBinding(machine.nextAction()) == .bluetooth)
        #expect(machine.state == .connecting(.bluetooth, attempt: 2))
        // Both failed in this round: back off, then the faster one again.
        #expect(machine.attemptFailed(.retryable) == .milliseconds(200))
        guard case .wait(let delay) = machine.nextAction() else { Issue.record("expected a wait"); return }
        #expect(delay == .milliseconds(200))
        machine.backoffEnded()
        #expect(Self.connectBinding(machine.nextAction()) == .wifi)
    }

    @Test func failuresInARowRestThenTryTheSameMatchAfresh() {
        var machine = Self.machine(maxAttempts: 3)
        _ = machine.matched(Self.route(.wifi))
        for expected: Duration in [.milliseconds(100), .milliseconds(200), .seconds(60)] {
            _ = machine.nextAction()
            #expect(machine.attemptFailed(.retryable) == expected)
            guard case .wait(let wait) = machine.nextAction() else { Issue.record("expected a wait"); return }
            #expect(wait == expected)
            machine.backoffEnded()
        }
        // The rest is over: the same match again, counted afresh.
        guard case .connect(let route, let attempt) = machine.nextAction() else { Issue.record("expected connect"); return }
        #expect(route.match.pskIdentity == "psk-1" && attempt == 1)
        #expect(machine.attemptFailed(.retryable) == .milliseconds(100))
    }

    /// A flapping link (issue 38): each session authenticates, moves part of a file, then drops. Before,
    /// the sixth such drop (here the third) made the link rest 60 s in the middle of the transfer.
    @Test func aSessionThatMovedAnItemForwardStartsANewRunOfFailures() {
        var machine = Self.machine(maxAttempts: 3)
        _ = machine.matched(Self.route(.wifi))
        for round in 0..<10 {
            // The failure of a session that progressed is the first of its run: the retry is attempt 2.
            guard case .connect(_, let attempt) = machine.nextAction() else { Issue.record("expected connect"); return }
            #expect(attempt == (round == 0 ? 1 : 2))
            machine.connected()
            machine.sessionProgressed()
            #expect(machine.attemptFailed(.retryable) == .milliseconds(100))
            machine.backoffEnded()
        }
        // Sessions that drop without moving anything still add to the run, and earn the rest at 3.
        for expected: Duration in [.milliseconds(200), .seconds(60)] {
            _ = machine.nextAction()
            machine.connected()
            #expect(machine.attemptFailed(.retryable) == expected)
            machine.backoffEnded()
        }
        // Progress reported before the session is up counts for nothing.
        _ = machine.nextAction()
        machine.sessionProgressed()
        #expect(machine.attemptFailed(.retryable) == .milliseconds(100))
    }

    @Test func aNewMatchCutsTheRestShort() {
        var machine = Self.machine(maxAttempts: 1)
        _ = machine.matched(Self.route(.wifi))
        _ = machine.nextAction()
        #expect(machine.attemptFailed(.retryable) == .seconds(60))
        #expect(machine.state == .backoff(attempt: 1, delay: .seconds(60)))
        #expect(machine.matched(Self.route(.wifi, identity: "psk-2")) == .wake)
        machine.backoffEnded()
        guard case .connect(let route, let attempt) = machine.nextAction() else { Issue.record("expected connect"); return }
        #expect(route.match.pskIdentity == "psk-2" && attempt == 1)
    }

    @Test func aRouteThatCannotSucceedGivesUpUntilTheNextMatch() {
        var machine = Self.machine(maxAttempts: 3)
        _ = machine.matched(Self.route(.wifi))
        _ = machine.nextAction()
        #expect(machine.attemptFailed(.retryable) == .milliseconds(100))
        machine.backoffEnded()
        _ = machine.nextAction()
        #expect(machine.attemptFailed(.routeSpent) == nil)
        #expect(machine.state == .gaveUp)
        guard case .finish = machine.nextAction() else { Issue.record("expected finish"); return }
        #expect(machine.matched(Self.route(.wifi, identity: "psk-2")) == .startTask)
        #expect(machine.state == .matched)
        _ = machine.nextAction()
        #expect(machine.state == .connecting(.wifi, attempt: 1))
    }

    @Test func aSpentRouteIsDroppedAndTheOtherBindingStillTried() {
        var machine = Self.machine()
        _ = machine.matched(Self.route(.wifi))
        _ = machine.matched(Self.route(.bluetooth))
        _ = machine.nextAction()
        // The Wi-Fi peer no longer holds the PSK (unknown_psk_identity): Bluetooth still may.
        #expect(machine.attemptFailed(.routeSpent) == .zero)
        #expect(Self.connectBinding(machine.nextAction()) == .bluetooth)
        #expect(machine.attemptFailed(.routeSpent) == nil)
        #expect(machine.state == .gaveUp)
        #expect(machine.currentRoute == nil)
    }

    @Test func aMatchDuringASessionGetsASessionOfItsOwn() {
        var machine = Self.machine()
        _ = machine.matched(Self.route(.wifi))
        _ = machine.nextAction()
        machine.connected()
        // New beacons (new items) arrive over Bluetooth while the Wi-Fi session runs.
        #expect(machine.matched(Self.route(.bluetooth, identity: "psk-2")) == .none)
        machine.sessionCompleted()
        #expect(machine.state == .matched)
        #expect(Self.connectBinding(machine.nextAction()) == .bluetooth)
    }

    /// A session that lingers (delivery version 5) makes this common: the contact re-announced over the
    /// same binding while the session was up. Its route replaced the one the session used; before, the
    /// completion took the new route for the one it had served and dropped it, and the new items waited
    /// for yet another announcement (seen at 90 s in HeadOfLineTests).
    @Test func aMatchOverTheSameBindingDuringASessionGetsASessionOfItsOwn() {
        var machine = Self.machine()
        _ = machine.matched(Self.route(.wifi))
        _ = machine.nextAction()
        machine.connected()
        #expect(machine.matched(Self.route(.wifi, identity: "psk-2")) == .none)
        machine.sessionCompleted()
        #expect(machine.state == .matched)
        guard case .connect(let route, _) = machine.nextAction() else {
            Issue.record("no session for the new route")
            return
        }
        #expect(route.binding == .wifi && route.match.pskIdentity == "psk-2")
        // Its own session completes; nothing is left to serve.
        machine.connected()
        machine.sessionCompleted()
        #expect(machine.state == .idle)
    }

    @Test func aMatchDuringASessionThatStaysOpenAsksItForADelivery() {
        var machine = Self.machine()
        _ = machine.matched(Self.route(.wifi))
        _ = machine.nextAction()
        // Not yet connected: nothing to keep open.
        machine.sessionKeptOpen()
        #expect(machine.matched(Self.route(.wifi, identity: "psk-2")) == .none)
        machine.connected()
        machine.sessionKeptOpen()
        // A relay's session: new beacons over either binding get a delivery stream on it, at once.
        #expect(machine.matched(Self.route(.wifi, identity: "psk-3")) == .deliverOverSession)
        #expect(machine.matched(Self.route(.bluetooth, identity: "psk-4")) == .deliverOverSession)
        #expect(machine.state == .connected(.wifi))
        // Once it ends, a match is what it was before: the next session takes it up (Wi-Fi again, matched
        // anew during the session).
        #expect(machine.attemptFailed(.retryable) == .zero)
        #expect(Self.connectBinding(machine.nextAction()) == .wifi)
        machine.connected()
        #expect(machine.matched(Self.route(.bluetooth, identity: "psk-5")) == .none)
        machine.sessionKeptOpen()
        #expect(machine.matched(Self.route(.bluetooth, identity: "psk-6")) == .deliverOverSession)
        machine.sessionCompleted()
        #expect(machine.matched(Self.route(.wifi, identity: "psk-7")) == .none)
    }

    @Test func aMatchFromAnotherWiFiLocationDuringASessionSaysTheContactMoved() {
        var machine = Self.machine()
        _ = machine.matched(Self.route(.wifi, port: 5000))
        _ = machine.nextAction()
        // Still connecting: the attempt's failure takes the new route up (matched during the attempt).
        #expect(machine.matched(Self.route(.wifi, identity: "psk-2", port: 5000)) == .none)
        machine.connected()
        machine.sessionKeptOpen()
        // The same location: a delivery over the session; another: the contact moved.
        #expect(machine.matched(Self.route(.wifi, identity: "psk-3", port: 5000)) == .deliverOverSession)
        #expect(machine.matched(Self.route(.wifi, identity: "psk-3", port: 6000))
                    == .sessionMoved(from: BeaconLocation(host: "10.0.0.2", port: 5000)))
        #expect(machine.matched(Self.route(.wifi, identity: "psk-4", port: 6000)) == .deliverOverSession)
        // The closed session's end is retried at the new location at once.
        #expect(machine.attemptFailed(.retryable) == .zero)
        guard case .connect(let route, _) = machine.nextAction() else {
            Issue.record("no connect")
            return
        }
        #expect(route.location == BeaconLocation(host: "10.0.0.2", port: 6000))
        // A Bluetooth peer's relay port changes with every reach: no move.
        machine.connected()
        machine.sessionKeptOpen()
        #expect(machine.matched(Self.route(.bluetooth, port: 7001)) == .deliverOverSession)
        #expect(machine.matched(Self.route(.bluetooth, port: 7002)) == .deliverOverSession)
    }

    @Test func aMatchDuringBackoffWakesTheLinkAndStartsAfresh() {
        var machine = Self.machine()
        _ = machine.matched(Self.route(.wifi))
        _ = machine.nextAction()
        #expect(machine.attemptFailed(.retryable) == .milliseconds(100))
        #expect(machine.matched(Self.route(.wifi, identity: "psk-2", port: 5001)) == .wake)
        machine.backoffEnded()
        guard case .connect(let route, let attempt) = machine.nextAction() else { Issue.record("expected connect"); return }
        #expect(route.location.port == 5001)
        #expect(attempt == 1)
    }

    @Test func aStoppedTaskLeavesTheMachineReadyForANewOne() {
        var machine = Self.machine()
        _ = machine.matched(Self.route(.bluetooth))
        _ = machine.nextAction()
        machine.stopped()
        #expect(!machine.isRunning)
        #expect(machine.state == .matched)
        #expect(machine.matched(Self.route(.bluetooth)) == .startTask)
    }
}

/// What ends a link's backoff: its time, a new match's signal (given before or during the wait), or the
/// task's cancellation; and a wait that ended leaves nothing behind to cut the next one short.
@Suite(.timeLimit(.minutes(1))) struct LinkWakeSignalTests {
    /// Returns once a wait is blocked on `signal` (or `ended` holds: the wait returned instead).
    func waitUntilBlocked(_ signal: LinkWakeSignal, or ended: () -> Bool = { false }) async throws {
        let blocked = try await waitUntil(timeout: .seconds(10), every: .milliseconds(1)) { signal.isWaiting || ended() }
        try #require(blocked, "the wait never blocked")
    }

    @Test func aSignalGivenBeforeOrDuringTheWaitEndsIt() async throws {
        let signal = LinkWakeSignal()
        signal.signal()
        await signal.wait(upTo: .seconds(3600))
        let waiting = Task { await signal.wait(upTo: .seconds(3600)) }
        try await waitUntilBlocked(signal)
        signal.signal()
        await waiting.value
    }

    @Test func cancellingTheTaskEndsTheWait() async {
        let signal = LinkWakeSignal()
        let waiting = Task { await signal.wait(upTo: .seconds(3600)) }
        waiting.cancel()
        await waiting.value
    }

    @Test func anExpiredWaitLeavesNoSignalForTheNext() async throws {
        let signal = LinkWakeSignal()
        await signal.wait(upTo: .milliseconds(1))
        let returned = NIOLockedValueBox(false)
        let waiting = Task {
            await signal.wait(upTo: .seconds(3600))
            returned.withLockedValue { $0 = true }
        }
        // A signal left behind would have ended the wait before it blocked.
        try await waitUntilBlocked(signal, or: { returned.withLockedValue { $0 } })
        #expect(!returned.withLockedValue { $0 })
        signal.signal()
        await waiting.value
        #expect(returned.withLockedValue { $0 })
    }
}
