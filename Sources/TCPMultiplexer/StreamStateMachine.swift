import ThaliMutants

/// The life of one stream, the same for both framings: each direction is closed on its own (FIN /
/// close frame) and a reset ends both at once.
struct StreamStateMachine: Sendable {
    enum State: Sendable, Hashable {
        /// Both directions carry data.
        case open
        /// This side sent FIN; the peer may still send.
        case localClosed
        /// The peer sent FIN; this side may still send.
        case remoteClosed
        /// Both sides sent FIN.
        case closed
        /// Either side reset the stream.
        case reset
    }

    private(set) var state: State

    /// A stream in `state` (new streams are open).
    init(state: State = .open) {
        self.state = state
    }

    /// Whether this side may still send data or FIN.
    var canSend: Bool { state == .open || state == .remoteClosed }
    /// Whether the peer may still send data or FIN.
    var canReceive: Bool { state == .open || state == .localClosed }
    /// Whether the stream is over in both directions.
    var isFinished: Bool { state == .closed || state == .reset }

    /// This side sends FIN. Returns `false` (state unchanged) if its direction was already closed.
    mutating func sendFIN() -> Bool {
        switch state {
        case .open: state = .localClosed
        case .remoteClosed: state = .closed
        case .localClosed, .closed, .reset: return false
        }
        return true
    }

    /// The peer sent FIN.
    mutating func receiveFIN(streamID: UInt64) throws(MultiplexerError) {
        switch state {
        case .open: state = .remoteClosed
        case .localClosed: state = .closed
        case .remoteClosed, .closed, .reset: throw .unexpectedFrame(streamID: streamID, reason: "FIN after the peer's FIN")
        }
    }

    /// The peer sends data: allowed only while its direction is open.
    func receiveData(streamID: UInt64) throws(MultiplexerError) {
        guard canReceive || Mutant.yamuxAcceptsDataAfterFIN.isActive else {
            throw .unexpectedFrame(streamID: streamID, reason: "data after the peer's FIN")
        }
    }

    /// Either side resets the stream.
    mutating func reset() { state = .reset }
}

/// The session as a whole: open, then draining once a GoAway went either way, then closed.
struct SessionStateMachine: Sendable {
    enum State: Sendable, Hashable {
        /// Streams may be opened in both directions.
        case active
        /// A GoAway was sent and/or received: no new streams in the closed direction(s).
        case draining(localGoAwaySent: Bool, remoteGoAwayReceived: Bool)
        /// The session is over.
        case closed
    }

    private(set) var state: State = .active

    /// Whether this side may open a stream.
    var mayOpenLocally: Bool {
        switch state {
        case .active: return true
        case .draining(_, let remote): return !remote
        case .closed: return false
        }
    }

    /// Whether the peer may open a stream.
    var mayAcceptRemote: Bool {
        switch state {
        case .active: return true
        case .draining(let local, _): return !local
        case .closed: return false
        }
    }

    var isClosed: Bool { state == .closed }

    /// This side sends GoAway. Returns `false` if it was already sent or the session is closed.
    mutating func sendGoAway() -> Bool {
        switch state {
        case .active: state = .draining(localGoAwaySent: true, remoteGoAwayReceived: false)
        case .draining(false, let remote): state = .draining(localGoAwaySent: true, remoteGoAwayReceived: remote)
        case .draining(true, _), .closed: return false
        }
        return true
    }

    /// The peer sent a normal GoAway.
    mutating func receiveGoAway() {
        switch state {
        case .active: state = .draining(localGoAwaySent: false, remoteGoAwayReceived: true)
        case .draining(let local, _): state = .draining(localGoAwaySent: local, remoteGoAwayReceived: true)
        case .closed: break
        }
    }

    /// The session ends. Returns `false` if it had already ended.
    mutating func close() -> Bool {
        guard state != .closed else { return false }
        state = .closed
        return true
    }
}
