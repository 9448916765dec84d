/// The local life of one stream channel, apart from the stream's protocol state on the wire
/// (``StreamStateMachine``, kept by the session): whether its pipeline is live, how its output ends,
/// whether the peer's end still waits for a read, and the session's bookkeeping of it. Every change is
/// a transition here, so neither the channel nor the session writes a flag of the other's.
///
/// A value, with no I/O: the channel (``MultiplexerStreamChannel``) holds one and acts on what each
/// transition returns.
struct StreamChannelStateMachine: Sendable {
    /// The channel's pipeline.
    enum Lifecycle: Equatable, Sendable {
        /// Registered; its initializer has not completed yet, so nothing is fired into it.
        case registered
        /// Its initializer completed: reads, writability and the end are fired into it.
        case active
        /// Torn down: queued writes failed, inactive fired, out of the session.
        case tornDown
    }

    /// How the channel's output ends.
    enum OutputEnd: Equatable, Sendable {
        /// Writes are accepted.
        case open
        /// FIN (a close frame in `thali-multiplex`) goes out once the queued writes have; `thenTearDown`:
        /// a graceful `close()` asked for it, and the channel ends once it is out.
        case finQueued(thenTearDown: Bool)
        /// FIN is out.
        case finSent
    }

    /// The peer's end of the stream, as the pipeline sees it.
    enum InputEnd: Equatable, Sendable {
        /// The peer may still send.
        case open
        /// The peer half-closed; the pipeline learns it once the bytes before it have been read.
        case pending
        /// The pipeline has been told (or the channel closed on it).
        case delivered
    }

    private(set) var lifecycle = Lifecycle.registered
    private(set) var outputEnd = OutputEnd.open
    private(set) var inputEnd = InputEnd.open
    /// The pipeline asked for a read that no delivery has answered yet.
    private(set) var readPending = false
    /// Received bytes are being handed to the pipeline (a read it asks for meanwhile waits for the next
    /// delivery rather than nesting one).
    private(set) var isDelivering = false

    // The session's bookkeeping: each is set by one session transition and cleared by another.
    /// In the session's queue of streams with output to send.
    private(set) var isQueuedForWrite = false
    /// In the session's queue of streams to hand received bytes to at the end of its read.
    private(set) var isQueuedForDelivery = false
    /// The session has forgotten the stream's id (it is over on the wire); the channel may still hand
    /// out what it received.
    private(set) var isDetached = false

    var isActive: Bool { lifecycle == .active }
    var isTornDown: Bool { lifecycle == .tornDown }
    /// Whether `write` and `close(mode: .output)` are still accepted (the wire state must allow sending too).
    var acceptsOutput: Bool { outputEnd == .open && lifecycle != .tornDown }
    /// Whether FIN waits for the queued writes.
    var isFINQueued: Bool {
        if case .finQueued = outputEnd { return true }
        return false
    }
    /// Whether a graceful `close()` is already under way.
    var isClosingGracefully: Bool { outputEnd == .finQueued(thenTearDown: true) }

    // MARK: Lifecycle

    /// The initializer completed. Returns whether the channel went live now (not torn down, not live already).
    mutating func activate() -> Bool {
        guard lifecycle == .registered else { return false }
        lifecycle = .active
        return true
    }

    /// The channel ends. Returns `nil` if it had already ended, else whether it had been live (so
    /// whether its pipeline hears of the end).
    mutating func tearDown() -> Bool? {
        guard lifecycle != .tornDown else { return nil }
        let wasActive = lifecycle == .active
        lifecycle = .tornDown
        return wasActive
    }

    // MARK: Output

    /// `close(mode: .output)`: FIN after the queued writes. Returns whether it was accepted.
    mutating func requestFIN() -> Bool {
        guard acceptsOutput else { return false }
        outputEnd = .finQueued(thenTearDown: false)
        return true
    }

    /// A graceful `close()` once the peer is done and this side has not finished: our FIN after the
    /// queued writes, then the channel ends. Returns `false` if one is already under way.
    mutating func requestGracefulClose() -> Bool {
        switch outputEnd {
        case .open, .finQueued(thenTearDown: false):
            outputEnd = .finQueued(thenTearDown: true)
            return true
        case .finQueued(thenTearDown: true), .finSent:
            return false
        }
    }

    /// FIN went out. Returns whether the channel must now end (a graceful close asked for it).
    mutating func finSent() -> Bool {
        guard case .finQueued(let thenTearDown) = outputEnd else { return false }
        outputEnd = .finSent
        return thenTearDown
    }

    // MARK: Input

    /// The peer half-closed.
    mutating func receiveEnd() {
        if inputEnd == .open { inputEnd = .pending }
    }

    /// The pipeline asks for a read. Returns `false` if one is already pending or the channel ended.
    mutating func requestRead() -> Bool {
        guard lifecycle != .tornDown, !readPending else { return false }
        readPending = true
        return true
    }

    /// Whether a delivery may run now: live, a read pending, none running.
    var mayDeliver: Bool { lifecycle == .active && readPending && !isDelivering }

    /// A delivery starts; bytes it hands out answer the pending read.
    mutating func beginDelivery(hasBytes: Bool) {
        isDelivering = true
        if hasBytes { readPending = false }
    }

    mutating func endDelivery() { isDelivering = false }

    /// Takes the peer's end for the pipeline, if it is pending. Returns whether it was.
    mutating func takeInputEnd() -> Bool {
        guard inputEnd == .pending else { return false }
        inputEnd = .delivered
        return true
    }

    var hasPendingInputEnd: Bool { inputEnd == .pending }

    // MARK: The session's bookkeeping

    /// Returns whether the stream joins the session's write queue (it was not in it).
    mutating func queueForWrite() -> Bool {
        defer { isQueuedForWrite = true }
        return !isQueuedForWrite
    }

    /// The session took the stream off its write queue.
    mutating func dequeuedForWrite() { isQueuedForWrite = false }

    /// Returns whether the stream joins the session's delivery queue (it was not in it).
    mutating func queueForDelivery() -> Bool {
        defer { isQueuedForDelivery = true }
        return !isQueuedForDelivery
    }

    /// The session took the stream off its delivery queue.
    mutating func dequeuedForDelivery() { isQueuedForDelivery = false }

    /// The session forgets the stream's id. Returns whether it had not yet.
    mutating func detach() -> Bool {
        defer { isDetached = true }
        return !isDetached
    }
}
