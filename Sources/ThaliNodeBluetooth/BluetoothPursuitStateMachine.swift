import ThaliBLEBinding
import ThaliSupport

/// The Bluetooth binding's link slots and each pursuit of a peer, as an explicit state machine without
/// I/O or clocks: the binding feeds it events (a peer heard, a reach that ended, a wait that is over, a
/// stop) and performs what it returns (start pursuing a peer, wait for so long, reach the peer, forget an
/// advertiser). Delays are values the binding sleeps; their jitter comes from an injected generator.
///
/// - At most `maxConnectedPeers` peers are pursued at once, one slot each. A peer heard while every slot
///   is taken waits in turn, oldest first; at most `maxWaitingPeers` wait. One heard past that is not
///   remembered: its advertiser is forgotten, so that BlueZ's next report of it offers it again.
/// - The higher of two addresses lets the lower one link first: it waits for the lower one's link to us
///   (when the lower one can know about us), else pauses briefly (``Step/awaitLink(upTo:)``, ``Step/pause(_:)``).
/// - A pursuit reaches its peer again after the link ends (failures in a row start over) or after a
///   failed connect (one more failure), each time after a backoff; `maxConnectAttempts` failures in a row
///   end it. Instead of a backoff, it gives its slot to the first waiting peer and queues again at the
///   back, its failures kept; a reach that gave its idle link up does the same with none.
/// - When a pursuit ends, the first waiting peer takes its slot.
struct BluetoothPursuitStateMachine: Sendable {
    /// The bounds of the schedule (``BluetoothPeerConfiguration``'s, each at least 1 where 0 would
    /// stop the binding from ever reaching anyone).
    struct Limits: Sendable, Hashable {
        /// The most peers pursued (linked or being reached) at once.
        var maxConnectedPeers: Int
        /// The most peers waiting for a slot.
        var maxWaitingPeers: Int
        /// Failed connects in a row that end a pursuit.
        var maxConnectAttempts: Int

        /// These bounds, `maxConnectedPeers` and `maxConnectAttempts` at least 1, `maxWaitingPeers` at least 0.
        init(maxConnectedPeers: Int, maxWaitingPeers: Int, maxConnectAttempts: Int) {
            self.maxConnectedPeers = max(1, maxConnectedPeers)
            self.maxWaitingPeers = max(0, maxWaitingPeers)
            self.maxConnectAttempts = max(1, maxConnectAttempts)
        }
    }

    /// The pauses of a pursuit.
    struct Delays: Sendable, Hashable {
        /// Before reaching a peer again: retry `n + 1` after `n` failures in a row (retry 1 after a link ended).
        var reconnect: Backoff
        /// The higher address's pause when the lower one cannot know about us (retry 1).
        var yieldPause: Backoff
        /// The longest wait of the higher address for the lower one's link.
        var yieldToLowerAddress: Duration

        /// These pauses.
        init(reconnect: Backoff, yieldPause: Backoff, yieldToLowerAddress: Duration) {
            self.reconnect = reconnect
            self.yieldPause = yieldPause
            self.yieldToLowerAddress = yieldToLowerAddress
        }
    }

    /// A peer waiting for a slot: the advertiser BlueZ reported it as (nil for a peer that connected to
    /// us), and its failed connects in a row so far (carried across its turns, so that a peer that went
    /// away still runs out of attempts).
    struct Candidate: Sendable, Hashable {
        var peer: BluetoothAddress
        var advertiser: BluetoothAddress?
        var failures = 0
    }

    /// Where one pursuit is.
    enum Phase: Sendable, Hashable {
        /// Holding a slot, its first step not asked for yet (``begin(_:peerWillLinkToUs:)``).
        case starting
        /// The higher address, waiting for the lower one's link to us.
        case awaitingLink
        /// The higher address, pausing before its first reach (the lower one cannot know about us).
        case yielding
        /// Reaching the peer: connecting, or fetching its beacons over a link.
        case reaching
        /// Pausing after a link ended or a connect failed.
        case backingOff
    }

    /// One peer holding a slot.
    struct Pursuit: Sendable, Hashable {
        var advertiser: BluetoothAddress?
        /// Failed connects in a row.
        var failures: Int
        var phase: Phase
    }

    /// What the binding does beside a pursuit's own steps.
    enum Action: Sendable, Hashable {
        /// Start pursuing this peer (it holds a slot now): a task that asks ``begin(_:peerWillLinkToUs:)``
        /// for its first step.
        case pursue(BluetoothAddress)
        /// BlueZ reports an unchanged advertisement only once: forget this advertiser, so that its next
        /// report offers its peer again.
        case forget(advertiser: BluetoothAddress)
    }

    /// What a pursuit does next.
    enum Step: Sendable, Hashable {
        /// Wait for the peer's link to us (at most this long), then call ``waitEnded(_:)``.
        case awaitLink(upTo: Duration)
        /// Wait this long, then call ``waitEnded(_:)``.
        case pause(Duration)
        /// Reach the peer (over its link to us, or a connect), then call ``reachEnded(_:_:)``.
        case reach
        /// The pursuit is over and its slot free: perform these actions, and end its task.
        case end([Action])
    }

    /// How one reach of a peer ended.
    enum ReachOutcome: Sendable, Hashable {
        /// No link: the connect failed.
        case failed
        /// The link came up and has ended.
        case ended
        /// The link was idle while another peer waited for a slot: it gave its slot up.
        case yielded
    }

    /// Our adapter's address: the lower of two addresses links first.
    let ownAddress: BluetoothAddress
    let limits: Limits
    let delays: Delays
    /// Peers holding a slot.
    private(set) var pursuits: [BluetoothAddress: Pursuit] = [:]
    /// Peers waiting for a slot, in the order they get one.
    private(set) var waiting: [Candidate] = []
    private(set) var isStopped = false
    private var random: any RandomNumberGenerator & Sendable

    /// A machine for the adapter at `ownAddress`, jittering its delays with draws from `random`.
    init(ownAddress: BluetoothAddress, limits: Limits, delays: Delays,
         random: any RandomNumberGenerator & Sendable = SystemRandomNumberGenerator()) {
        self.ownAddress = ownAddress
        self.limits = limits
        self.delays = delays
        self.random = random
    }

    /// The machine of a binding configured by `configuration`, for the adapter at `ownAddress`.
    init(ownAddress: BluetoothAddress, configuration: BluetoothPeerConfiguration) {
        self.init(ownAddress: ownAddress,
                  limits: Limits(maxConnectedPeers: configuration.maxConnectedPeers, maxWaitingPeers: configuration.maxWaitingPeers,
                                 maxConnectAttempts: configuration.maxConnectAttempts),
                  delays: Delays(reconnect: configuration.reconnectBackoff, yieldPause: configuration.yieldPause,
                                 yieldToLowerAddress: configuration.yieldToLowerAddress))
    }

    /// Whether a peer waits for a slot: a pursuit gives its slot up when it would otherwise wait.
    var hasWaitingPeer: Bool { !waiting.isEmpty }

    /// The peers holding a slot.
    var pursuedPeers: Dictionary<BluetoothAddress, Pursuit>.Keys { pursuits.keys }

    // MARK: Events

    /// `peer` was heard: BlueZ reported its advertisement (from `advertiser`), or it connected to us
    /// (nil). Pursued at once if a slot is free, else queued.
    mutating func heard(_ peer: BluetoothAddress, advertiser: BluetoothAddress?) -> [Action] {
        guard !isStopped, peer != ownAddress, pursuits[peer] == nil else { return [] }
        return admit(Candidate(peer: peer, advertiser: advertiser))
    }

    /// The first step of `peer`'s pursuit (after ``Action/pursue(_:)``). `peerWillLinkToUs`: the peer can
    /// know about us and has no link to us yet (we advertise), so the higher address waits for its link.
    mutating func begin(_ peer: BluetoothAddress, peerWillLinkToUs: Bool) -> Step {
        guard !isStopped, pursuits[peer]?.phase == .starting else { return finish(peer, yielded: nil) }
        // Two peers that find each other connect at once; under emulation (and on some controllers) the
        // crossing pages collide and both connects time out. The higher address lets the lower one go
        // first, so that its own reach then rides on the link that already exists.
        if ownAddress.octets.lexicographicallyPrecedes(peer.octets) {
            pursuits[peer]?.phase = .reaching
            return .reach
        }
        if peerWillLinkToUs {
            pursuits[peer]?.phase = .awaitingLink
            return .awaitLink(upTo: delays.yieldToLowerAddress)
        }
        pursuits[peer]?.phase = .yielding
        return .pause(delays.yieldPause.delay(beforeRetry: 1, using: &random))
    }

    /// `peer`'s wait (for a link, or a pause) is over: reach it.
    mutating func waitEnded(_ peer: BluetoothAddress) -> Step {
        guard !isStopped, let phase = pursuits[peer]?.phase, [.awaitingLink, .yielding, .backingOff].contains(phase) else {
            return finish(peer, yielded: nil)
        }
        pursuits[peer]?.phase = .reaching
        return .reach
    }

    /// A reach of `peer` ended: reach it again after a backoff, give its slot to a waiting peer, or give
    /// up after `maxConnectAttempts` failures in a row.
    mutating func reachEnded(_ peer: BluetoothAddress, _ outcome: ReachOutcome) -> Step {
        guard !isStopped, var pursuit = pursuits[peer], pursuit.phase == .reaching else { return finish(peer, yielded: nil) }
        switch outcome {
        case .yielded: return finish(peer, yielded: 0)
        case .ended: pursuit.failures = 0
        case .failed: pursuit.failures += 1
        }
        if pursuit.failures >= limits.maxConnectAttempts { return finish(peer, yielded: nil) }
        if hasWaitingPeer { return finish(peer, yielded: pursuit.failures) }
        pursuit.phase = .backingOff
        pursuits[peer] = pursuit
        return .pause(delays.reconnect.delay(beforeRetry: pursuit.failures + 1, using: &random))
    }

    /// The binding stops: nobody is pursued any more, nobody waits. Each pursuit's next step is `.end([])`.
    mutating func stop() {
        isStopped = true
        waiting = []
    }

    // MARK: Slots

    /// Pursues `candidate` if a slot is free, else queues it (or forgets its advertiser past the cap).
    private mutating func admit(_ candidate: Candidate) -> [Action] {
        if pursuits.count < limits.maxConnectedPeers {
            waiting.removeAll { $0.peer == candidate.peer }  // reached now, not on a later turn
            pursuits[candidate.peer] = Pursuit(advertiser: candidate.advertiser, failures: candidate.failures, phase: .starting)
            return [.pursue(candidate.peer)]
        }
        if enqueue(candidate) { return [] }
        return candidate.advertiser.map { [.forget(advertiser: $0)] } ?? []
    }

    /// Queues `candidate` unless it waits already; false when `maxWaitingPeers` wait.
    private mutating func enqueue(_ candidate: Candidate) -> Bool {
        if waiting.contains(where: { $0.peer == candidate.peer }) { return true }
        guard waiting.count < limits.maxWaitingPeers else { return false }
        waiting.append(candidate)
        return true
    }

    /// Ends `peer`'s pursuit and frees its slot for the first waiting peer. `yielded`: it gave its slot up
    /// with this many failures in a row, and queues again at the back (or, with nobody waiting any more,
    /// takes its slot straight back); nil: it gave up (or the binding stopped).
    private mutating func finish(_ peer: BluetoothAddress, yielded failures: Int?) -> Step {
        guard let pursuit = pursuits.removeValue(forKey: peer), !isStopped else { return .end([]) }
        var actions: [Action] = []
        let next = waiting.isEmpty ? nil : waiting.removeFirst()
        var remembered = false
        if let failures {
            let again = Candidate(peer: peer, advertiser: pursuit.advertiser, failures: failures)
            if next == nil {
                actions += admit(again)
                remembered = true
            } else {
                remembered = enqueue(again)
            }
        }
        // Reports of an unchanged advertisement are not discoveries: a peer neither pursued nor waiting is
        // forgotten, so that its next report starts over if it is still there.
        if !remembered, let advertiser = pursuit.advertiser { actions.append(.forget(advertiser: advertiser)) }
        if let next { actions += admit(next) }
        return .end(actions)
    }
}
