import ThaliBeacons
import ThaliSSDP

/// One way to reach a matched contact: the beacon match (PSK identity, key, expiry) and where the
/// contact's port is, over one binding.
struct ContactRoute: Sendable {
    /// Where the beacons came from: the peer's SSDP location, or its Bluetooth address.
    var origin: PeerLocation
    /// Where the contact's port is reached (over Bluetooth: the relay's local port).
    var location: BeaconLocation
    /// The match that authenticates the connection.
    var match: BeaconMatch

    /// The binding that carried the beacons.
    var binding: PeerBindingKind { origin.binding }
}

/// The connecting side of one contact as an explicit state machine: which route to try next, when to
/// fall back to the other binding, when to back off and when to give up. The peer's link task feeds it
/// events (a match, a connection up, a session that completed or failed) and performs its actions.
///
/// - A contact may be reachable over several bindings: the newest match per binding is kept, and the
///   faster binding (``PeerBindingKind`` order) is tried first. A failed attempt falls back at once to a
///   binding not yet tried in this round; only when every route failed does the link back off.
/// - A completed session serves every route whose beacon it used or that was known when it began; a
///   route matched during it (new beacons, perhaps new items) gets a session of its own, or, while a
///   session stays open (relay, app streams), a delivery stream on that session at once. Delivery itself
///   is exactly-once, so a redundant session costs a connection, never a duplicate.
/// - `maxAttempts` failures in a row (over any binding) make the link rest (a long backoff) before it
///   tries the routes it holds again, `maxAttempts` at a time, for as long as they can succeed. A session
///   that moved an item forward before it failed (``sessionProgressed()``) ends the run: its failure is
///   the first of a new one, so a link that drops now and then (a flap, a roam) does not earn the rest.
/// - A route that cannot succeed again (the contact no longer holds the PSK, its relay ended, its match
///   expired) is dropped; with no route left the link gives up until the next match.
struct ContactLinkStateMachine: Sendable {
    enum State: Sendable, Hashable {
        /// No route to try: the last session completed, or nothing was matched yet.
        case idle
        /// A route is waiting to be tried.
        case matched
        /// Connecting over `binding`; `attempt` counts failures in a row plus one.
        case connecting(PeerBindingKind, attempt: Int)
        /// An authenticated session over `binding` is up.
        case connected(PeerBindingKind)
        /// Every route failed in this round, or `maxAttempts` in a row did (then `delay` is the rest):
        /// waiting `delay` (a new match ends the wait early).
        case backoff(attempt: Int, delay: Duration)
        /// No route can succeed: waiting for the next match.
        case gaveUp

        /// What the status view shows.
        var phase: ContactLinkPhase {
            switch self {
            case .idle: .idle
            case .matched: .matched
            case .connecting: .connecting
            case .connected: .connected
            case .backoff: .backoff
            case .gaveUp: .gaveUp
            }
        }

        /// The binding in use, while connecting or connected.
        var binding: PeerBindingKind? {
            switch self {
            case .connecting(let binding, _), .connected(let binding): binding
            default: nil
            }
        }
    }

    /// What the link task does next.
    enum Action: Sendable {
        /// Connect over `route` (and run the session to its end).
        case connect(ContactRoute, attempt: Int)
        /// Wait this long, or until ``matched(_:)`` wakes the link; then call ``backoffEnded()``.
        case wait(Duration)
        /// Nothing to do: the link task ends (a later match starts a new one).
        case finish
    }

    /// How an attempt failed.
    enum Failure: Sendable, Hashable {
        /// Worth retrying over the same route (a refused or dropped connection).
        case retryable
        /// The route cannot succeed again (unknown PSK identity, an ended relay, an expired match).
        case routeSpent
    }

    private(set) var state: State = .idle
    /// Whether a link task is driving this machine.
    private(set) var isRunning = false
    /// Where the contact was last found (its newest match's origin).
    private(set) var lastOrigin: PeerLocation?
    private var routes: [PeerBindingKind: ContactRoute] = [:]
    /// Bindings matched since the current attempt began.
    private var matchedDuringAttempt: Set<PeerBindingKind> = []
    /// The PSK identity the current attempt connected with: what its session served. (The route of its
    /// binding may have been replaced by a newer match meanwhile.)
    private var attemptIdentity: String?
    /// Bindings that failed since the last backoff (or success).
    private var failedThisRound: Set<PeerBindingKind> = []
    private var failuresInARow = 0
    /// Whether the session that is up stays open after its first delivery (``sessionKeptOpen()``).
    private var sessionStaysOpen = false
    /// Whether the session that is up moved an item forward (``sessionProgressed()``).
    private(set) var progressedThisSession = false
    private let maxAttempts: Int
    private let rest: Duration
    private let delay: @Sendable (Int) -> Duration

    /// A machine that waits `delay(failures)` when every route failed, and `rest` after `maxAttempts`
    /// failures in a row.
    init(maxAttempts: Int, rest: Duration, delay: @escaping @Sendable (Int) -> Duration) {
        self.maxAttempts = max(1, maxAttempts)
        self.rest = rest
        self.delay = delay
    }

    /// The route in use, or the one that would be tried next.
    var currentRoute: ContactRoute? {
        if let binding = state.binding { return routes[binding] }
        return nextRoute
    }

    private var nextRoute: ContactRoute? {
        routes.values.filter { !failedThisRound.contains($0.binding) }.min { $0.binding.tryFirst($1.binding) }
    }

    // MARK: Events

    /// What the peer does about a match.
    enum MatchOutcome: Sendable, Hashable {
        /// Start a link task: none is running.
        case startTask
        /// Wake the link task out of its backoff.
        case wake
        /// Nothing: the running task takes the route up in turn.
        case none
        /// Deliver over the session that is up: it stays open (relay, app streams), so new beacons
        /// (perhaps new items) get a delivery stream on it rather than waiting for it to end.
        case deliverOverSession
        /// The contact's beacons came from another Wi-Fi location than the one the session that is up
        /// connected to: its node moved (roaming) or restarted, and the session with `from` can never be
        /// answered again. Close it; the link reconnects at the new location.
        case sessionMoved(from: BeaconLocation)
    }

    /// A contact's beacons matched over `route.binding`; it replaces that binding's older route.
    mutating func matched(_ route: ContactRoute) -> MatchOutcome {
        let previous = routes[route.binding]
        routes[route.binding] = route
        lastOrigin = route.origin
        failedThisRound.remove(route.binding)
        var outcome = MatchOutcome.none
        switch state {
        case .connected(let binding) where binding == route.binding && binding == .wifi
            && previous.map({ $0.location != route.location }) == true:
            // A Bluetooth peer's relay port changes with every reach: only Wi-Fi locations say "moved".
            matchedDuringAttempt.insert(route.binding)
            outcome = .sessionMoved(from: previous?.location ?? route.location)
        case .connected where sessionStaysOpen:
            matchedDuringAttempt.insert(route.binding)
            outcome = .deliverOverSession
        case .connecting, .connected:
            matchedDuringAttempt.insert(route.binding)
        case .idle, .gaveUp:
            failuresInARow = 0
            state = .matched
        case .backoff:
            // New beacons: a new start, not one more failure.
            failuresInARow = 0
            outcome = .wake
        case .matched:
            break
        }
        if isRunning { return outcome }
        isRunning = true
        return .startTask
    }

    /// The session over the route being tried authenticated the contact.
    mutating func connected() {
        guard case .connecting(let binding, _) = state else { return }
        state = .connected(binding)
        progressedThisSession = false
    }

    /// The session that is up moved an item forward: bytes of a file were stored, or an item was
    /// received; or, in relay mode, it carried an app's connection. If it then fails, that failure starts a new run instead of adding to the run before
    /// it: on a link that drops every few seconds, a transfer that resumes in each new session is a
    /// contact that is reached, not one that cannot be, and the rest after `maxAttempts` (60 s by
    /// default) would only stall it. A session that fails without moving anything still counts.
    mutating func sessionProgressed() {
        guard case .connected = state else { return }
        progressedThisSession = true
    }

    /// The session that is up stays open after its first delivery (a relay, app streams): a match
    /// from now on asks for a delivery over it (``MatchOutcome/deliverOverSession``).
    mutating func sessionKeptOpen() {
        guard case .connected = state else { return }
        sessionStaysOpen = true
    }

    /// The session ran to its end: routes it served are done with.
    mutating func sessionCompleted() {
        sessionStaysOpen = false
        progressedThisSession = false
        let served = attemptIdentity
        attemptIdentity = nil
        routes = routes.filter { binding, route in
            matchedDuringAttempt.contains(binding) && route.match.pskIdentity != served
        }
        failuresInARow = 0
        failedThisRound = []
        matchedDuringAttempt = []
        state = routes.isEmpty ? .idle : .matched
    }

    /// The attempt (connection or session) failed; returns the delay before the next attempt: zero when
    /// another binding is tried at once, the rest after `maxAttempts` in a row, nil when the link gives up.
    mutating func attemptFailed(_ failure: Failure) -> Duration? {
        sessionStaysOpen = false
        guard let binding = state.binding else { return nil }
        if progressedThisSession { failuresInARow = 0 }
        progressedThisSession = false
        failuresInARow += 1
        // A route matched anew during the attempt is worth trying again even if the old one was spent.
        let renewed = matchedDuringAttempt.contains(binding)
        matchedDuringAttempt = []
        if failure == .routeSpent && !renewed { routes[binding] = nil } else if !renewed { failedThisRound.insert(binding) }
        if routes.isEmpty {
            failedThisRound = []
            state = .gaveUp
            return nil
        }
        if failuresInARow >= maxAttempts {
            // Rest, then a fresh round of attempts over the routes still held.
            state = .backoff(attempt: failuresInARow, delay: rest)
            failuresInARow = 0
            return rest
        }
        if nextRoute != nil {
            state = .matched
            return .zero
        }
        let wait = delay(failuresInARow)
        state = .backoff(attempt: failuresInARow, delay: wait)
        return wait
    }

    /// The backoff wait is over (or a match cut it short): every route may be tried again.
    mutating func backoffEnded() {
        guard case .backoff = state else { return }
        failedThisRound = []
        state = routes.isEmpty ? .gaveUp : .matched
    }

    // MARK: Actions

    /// What the link task does now. `.finish` marks the machine not running, in the same step, so that a
    /// match arriving after it starts a new task.
    mutating func nextAction() -> Action {
        switch state {
        case .matched:
            if let route = nextRoute {
                state = .connecting(route.binding, attempt: failuresInARow + 1)
                matchedDuringAttempt = []
                attemptIdentity = route.match.pskIdentity
                return .connect(route, attempt: failuresInARow + 1)
            }
            state = routes.isEmpty ? .idle : .gaveUp
            isRunning = false
            return .finish
        case .backoff(_, let wait):
            return .wait(wait)
        case .idle, .gaveUp, .connecting, .connected:
            // Connecting or connected: only reached when the task was cancelled mid-attempt.
            isRunning = false
            return .finish
        }
    }

    /// The link task ended without finishing (the peer stops).
    mutating func stopped() {
        isRunning = false
        sessionStaysOpen = false
        if state.binding != nil { state = routes.isEmpty ? .idle : .matched }
    }
}
