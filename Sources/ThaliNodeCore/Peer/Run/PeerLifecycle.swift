/// Whether the peer runs, and what ``ThaliPeer/start()`` and ``ThaliPeer/stop()`` do about it: a peer
/// starts once; its stop performs every step of ``StopStep`` in their order, once; a stop during the
/// start waits for the start to end, and a stop during a stop waits for that one.
struct PeerLifecycle: Sendable, Hashable {
    enum Phase: Sendable, Hashable {
        case created, starting, running, stopping, stopped
    }

    /// A stop's steps, in the order they are performed (`allCases`).
    enum StopStep: Sendable, Hashable, CaseIterable {
        /// Links, waiters and timers stop deciding anything new; app stream handlers end.
        case refuseNewWork
        /// Bindings say byebye and stop announcing, listening and fetching: nobody comes any more.
        case stopBindings
        /// The single port closes: no connection comes in.
        case closePort
        /// Every PSK-TLS connection (either role) closes: the sessions' tasks see their ends.
        case closeConnections
        /// Every task of the lifetime is cancelled and awaited.
        case endTasks
        /// The data directory's run lock is let go: another peer may run on it.
        case releaseDirectory
        /// ``PeerEvent/stopped`` is reported: event streams end.
        case reportStopped
    }

    /// What a call to ``ThaliPeer/stop()`` does now.
    enum StopDecision: Sendable, Hashable {
        /// Perform these steps, then call ``stopFinished()``.
        case perform([StopStep])
        /// Wait for the start under way to end, then ask again.
        case waitForStart
        /// Wait for the stop under way to end.
        case waitForStop
        /// Nothing: the peer stopped already.
        case none
    }

    private(set) var phase = Phase.created

    /// Whether a stop began (or ended): nothing new is to start.
    var isStopping: Bool { phase == .stopping || phase == .stopped }

    /// A start begins: nil, or why it cannot.
    mutating func start() -> ThaliPeer.StartError? {
        switch phase {
        case .created:
            phase = .starting
            return nil
        case .starting, .running: return .alreadyStarted
        case .stopping, .stopped: return .stopped
        }
    }

    /// The start ended (succeeded, or failed and undid what it did).
    mutating func startEnded() {
        if phase == .starting { phase = .running }
    }

    /// A stop is asked for.
    mutating func stop() -> StopDecision {
        switch phase {
        case .created, .running:
            phase = .stopping
            return .perform(StopStep.allCases)
        case .starting: return .waitForStart
        case .stopping: return .waitForStop
        case .stopped: return .none
        }
    }

    /// The stop's steps were performed.
    mutating func stopFinished() {
        phase = .stopped
    }
}
