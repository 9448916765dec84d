import NIOCore

/// Names one stream of a session for its state machine: its table key (yamux: the stream id;
/// `thali-multiplex`: `id << 1 | opened-here`, since both sides may use the same id) and a serial number
/// that tells apart streams that reuse a `thali-multiplex` id.
struct StreamRef: Hashable, Sendable {
    var key: UInt64
    var serial: UInt64
}

/// What the session state machine found in the peer's bytes, for the handler to carry out in order.
enum MultiplexerInputAction: Equatable {
    /// Write these frame bytes (a ping answer, a refusal).
    case write(ByteBuffer)
    /// The peer opened a stream and it was accepted: make its channel and run the inbound initializer.
    case accept(StreamRef, streamID: UInt64, name: String?)
    /// Payload bytes for a stream's reader.
    case deliver(StreamRef, ByteBuffer)
    /// The peer half-closed the stream; `finished`: the stream is over on the wire and left the table.
    case receiveEnd(StreamRef, finished: Bool)
    /// The peer reset the stream.
    case peerReset(StreamRef, message: String?)
    /// The peer broke a stream's rules (or overran its buffer): reset it with `message`, fail it with `error`.
    case resetStream(StreamRef, message: String?, error: MultiplexerError)
    /// The peer granted send window to a stream: queued data may go.
    case sendWindowOpened(StreamRef)
    /// The peer answered ping `id` after `roundTripTime`.
    case pingAnswered(id: UInt32, roundTripTime: TimeAmount)
}

/// The frames of one piece of stream output, in order; the write promise belongs on the last one.
struct OutboundFrames {
    private(set) var buffers: [ByteBuffer] = []

    init() { buffers.reserveCapacity(3) }

    mutating func append(_ buffer: ByteBuffer) { buffers.append(buffer) }
}

/// A ping this side sent: its opaque id and the frame to write.
struct OutboundPing {
    var id: UInt32
    var frame: ByteBuffer
}

/// The protocol state of one stream, kept by the session state machine.
struct StreamRecord {
    let ref: StreamRef
    let streamID: UInt64
    let isLocallyInitiated: Bool
    var state = StreamStateMachine()
    var window: StreamWindow
    /// The stream counts against the accept backlog (accepted, initializer still running).
    var isInAcceptBacklog = false
    /// yamux: the next frame this side sends for the stream must carry ACK (accepted streams).
    var ackPending = false
    /// The peer may still send a frame for the stream after it is over for us: anything that crosses
    /// our reset, or a reset that crosses our close. Only the peer's own reset ends that.
    var peerMaySendAfterDetach = true
}

/// A session's protocol state apart from I/O, for one framing: it takes the peer's bytes and this side's
/// intents (open, send, consumed, reset, ping, GoAway, timers) and returns frames to write and actions for
/// the handler; it enforces every limit of ``MultiplexerConfiguration``. Time comes in as an argument, so
/// tests drive it without sockets or clocks. ``MultiplexerHandler`` holds one and only moves bytes.
///
/// Framing-specific parts are the requirements; what both framings share (the stream table, limits,
/// accounting) is in the extension, on ``core``.
protocol MultiplexerSessionStateMachine {
    /// The state both framings share.
    var core: MultiplexerSessionCore { get set }

    // MARK: Framing-specific

    /// Adds bytes read from the underlying channel; take the actions with ``nextInputAction(now:outputWritable:)``.
    mutating func receive(_ bytes: ByteBuffer)
    /// Decodes the next header or payload piece into queued actions; `false` when more bytes are needed.
    mutating func decodeNext(now: NIODeadline) throws(MultiplexerError) -> Bool
    /// Whether the bytes received so far end inside a frame.
    var isMidFrame: Bool { get }
    /// The stream id of a new local stream, or why it cannot be opened.
    mutating func allocateStreamID() throws(MultiplexerError) -> (streamID: UInt64, key: UInt64)
    /// The frame that opens a local stream.
    func openFrame(streamID: UInt64, name: String?) -> ByteBuffer
    /// The name a local stream's channel reports (`thali-multiplex` sends one; yamux has none).
    func localStreamName(_ name: String?) -> String?
    /// The frame that refuses or resets a stream.
    func resetFrame(streamID: UInt64, locallyInitiated: Bool, message: String?) -> ByteBuffer
    /// The frames carrying `payload` (and FIN) of `ref`; consumes a pending ACK.
    mutating func dataFrames(_ ref: StreamRef, payload: ByteBuffer, fin: Bool) -> OutboundFrames
    /// How many of `wanted` bytes `ref` may send now (frame size, send window); deducts them from the window.
    mutating func reserveSend(_ ref: StreamRef, upTo wanted: Int) -> Int
    /// Whether `ref` could send more if it had data (yamux: send window left).
    func hasSendWindow(_ ref: StreamRef) -> Bool
    /// The reader of `ref` took `bytes`: the window update to send, if one is due.
    mutating func consumed(_ ref: StreamRef, bytes: Int, now: NIODeadline) -> ByteBuffer?
    /// The acknowledgement of an accepted stream whose initializer completed, if still owed.
    mutating func acknowledgeFrame(_ ref: StreamRef) -> ByteBuffer?
    /// This side's GoAway: the frame, or `nil` if already sent or the framing has none.
    mutating func goAway() -> ByteBuffer?
    /// The GoAway announcing `error` before the session ends, if the framing has one.
    mutating func goAwayFrame(for error: Error) -> ByteBuffer?
    /// A ping to send (for the round-trip time or a keepalive).
    mutating func ping(now: NIODeadline) throws(MultiplexerError) -> OutboundPing
    /// The ping sent when the session starts (yamux: measures the round-trip time); `nil` if none.
    mutating func startPing(now: NIODeadline) -> OutboundPing?
    /// Whether ping `id` is still unanswered.
    func isPingOutstanding(_ id: UInt32) -> Bool
    /// The keepalive period, `nil` for none.
    var keepAliveInterval: TimeAmount? { get }
    /// The channel turned writable again: the ping answer held back while it was not, if any.
    mutating func outputBecameWritable() -> ByteBuffer?
    /// A stream left the table (framing bookkeeping, such as `thali-multiplex` id quarantine).
    mutating func streamDetached(_ record: StreamRecord)

    // MARK: Shared (implemented once in the extension)

    // Declared here so that calls through `any MultiplexerSessionStateMachine` (the handler's) reach
    // implementations specialized for the concrete machine: an extension-only member called through the
    // existential runs unspecialized and reads `core` through its getter, copying the whole stream table
    // (retains and releases) on every call, several times per frame.
    var isClosed: Bool { get }
    var metrics: MultiplexerMetrics { get }
    var bufferedTotal: Int { get }
    mutating func nextInputAction(now: NIODeadline, outputWritable: Bool) throws(MultiplexerError) -> MultiplexerInputAction?
    func streamState(_ ref: StreamRef) -> StreamStateMachine
    func window(_ ref: StreamRef) -> StreamWindow?
    mutating func openStream(name: String?, now: NIODeadline) throws(MultiplexerError)
        -> (ref: StreamRef, streamID: UInt64, frame: ByteBuffer)
    mutating func inboundStreamInitialized(_ ref: StreamRef, succeeded: Bool) -> ByteBuffer?
    mutating func sentFIN(_ ref: StreamRef) -> Bool
    mutating func resetStream(_ ref: StreamRef, message: String?, outputWritable: Bool) -> ByteBuffer?
    mutating func detach(_ ref: StreamRef)
    mutating func streamClosed(_ ref: StreamRef, discardedBytes: Int)
    mutating func close() -> Bool
}

/// The most bytes of peer-caused control frames (stream refusals and resets) a session queues while the
/// underlying channel is not writable (``MultiplexerHandler/maxControlBacklog``).
let multiplexerMaxControlBacklog = 64 * 1024

/// What both framings' session state machines share: the session's state, the stream table, the limits
/// and the accounting behind ``MultiplexerMetrics``.
struct MultiplexerSessionCore {
    let configuration: MultiplexerConfiguration
    let role: MultiplexerRole
    /// Whether inbound streams may be accepted at all (the handler has an initializer).
    let acceptsInboundStreams: Bool
    let allocator = ByteBufferAllocator()
    var session = SessionStateMachine()
    private(set) var streams: [UInt64: StreamRecord] = [:]
    private var nextSerial: UInt64 = 0
    private(set) var streamsAwaitingAccept = 0
    /// The sum of all streams' receive window targets (bounded by `maxSessionReceiveBuffer` for growth).
    private(set) var receiveWindowTotal = 0
    /// Bytes received on all streams and not yet taken by their readers.
    var bufferedTotal = 0
    var metrics = MultiplexerMetrics()
    /// The latest measured round-trip time, for window auto-tuning.
    var roundTripTime: TimeAmount?
    /// Bytes of peer-caused control frames written while the channel was not writable.
    var controlBacklog = 0
    /// Actions found in the current frame, not yet handed out.
    var pendingActions = CircularBuffer<MultiplexerInputAction>(initialCapacity: 4)
    /// The stream the payload being received belongs to (`nil`: discard it).
    var currentDataStream: StreamRef?
    /// Whether the underlying channel is writable (ping answers coalesce and control frames count while
    /// it is not).
    var outputWritable = true

    init(configuration: MultiplexerConfiguration, role: MultiplexerRole, acceptsInboundStreams: Bool) {
        self.configuration = configuration
        self.role = role
        self.acceptsInboundStreams = acceptsInboundStreams
    }

    func record(_ ref: StreamRef) -> StreamRecord? {
        guard let record = streams[ref.key], record.ref == ref else { return nil }
        return record
    }

    /// The stream now at `key`, if any.
    func ref(forKey key: UInt64) -> StreamRef? { streams[key]?.ref }

    /// Changes the record of `ref` in place if it is still in the table; `nil` if it is not.
    @discardableResult
    mutating func update<T, E: Error>(_ ref: StreamRef, _ body: (inout StreamRecord) throws(E) -> T) throws(E) -> T? {
        guard let index = streams.index(forKey: ref.key), streams.values[index].ref == ref else { return nil }
        return try body(&streams.values[index])
    }

    mutating func addStream(key: UInt64, streamID: UInt64, locallyInitiated: Bool, now: NIODeadline) -> StreamRef {
        nextSerial += 1
        let ref = StreamRef(key: key, serial: nextSerial)
        let record = StreamRecord(ref: ref, streamID: streamID, isLocallyInitiated: locallyInitiated,
                                  window: StreamWindow(now: now))
        streams[key] = record
        receiveWindowTotal += record.window.receiveWindowTarget
        return ref
    }

    /// Takes `ref` out of the table; the record, if it was there.
    mutating func removeStream(_ ref: StreamRef) -> StreamRecord? {
        guard let record = record(ref) else { return nil }
        streams.removeValue(forKey: ref.key)
        if record.isInAcceptBacklog { streamsAwaitingAccept -= 1 }
        receiveWindowTotal -= record.window.receiveWindowTarget
        if currentDataStream == ref { currentDataStream = nil }
        return record
    }

    mutating func enterAcceptBacklog(_ ref: StreamRef) {
        update(ref) { record in record.isInAcceptBacklog = true }
        streamsAwaitingAccept += 1
    }

    mutating func leaveAcceptBacklog(_ ref: StreamRef) {
        let wasWaiting = update(ref) { record in
            defer { record.isInAcceptBacklog = false }
            return record.isInAcceptBacklog
        }
        if wasWaiting == true { streamsAwaitingAccept -= 1 }
    }

    /// Auto-tuning may add at most this much to the session's windows.
    var windowGrowthBudget: Int { configuration.maxSessionReceiveBuffer - receiveWindowTotal }

    mutating func windowGrew(by growth: Int) {
        receiveWindowTotal += growth
        metrics.windowGrowths += 1
    }

    mutating func queue(_ action: MultiplexerInputAction) { pendingActions.append(action) }

    /// Counts a peer-caused control frame written while the channel is not writable.
    mutating func countControlFrame(bytes: Int) {
        if !outputWritable { controlBacklog += bytes }
    }
}

extension MultiplexerSessionStateMachine {
    var configuration: MultiplexerConfiguration { core.configuration }
    var isClosed: Bool { core.session.isClosed }
    var streamCount: Int { core.streams.count }
    var metrics: MultiplexerMetrics { core.metrics }
    var bufferedTotal: Int { core.bufferedTotal }

    /// The next thing the handler must do about the bytes received so far, `nil` when more are needed.
    /// A thrown error is fatal for the session (the handler fails it).
    mutating func nextInputAction(now: NIODeadline, outputWritable: Bool) throws(MultiplexerError) -> MultiplexerInputAction? {
        core.outputWritable = outputWritable
        while true {
            if let action = core.pendingActions.popFirst() { return action }
            if core.controlBacklog > multiplexerMaxControlBacklog {
                throw .controlFrameBacklog(limit: multiplexerMaxControlBacklog)
            }
            guard !core.session.isClosed, try decodeNext(now: now) else { return nil }
        }
    }

    /// The stream state of `ref` (a stream that left the table is over).
    func streamState(_ ref: StreamRef) -> StreamStateMachine {
        core.record(ref)?.state ?? StreamStateMachine(state: .reset)
    }

    /// The flow-control windows of `ref`, if it is in the table.
    func window(_ ref: StreamRef) -> StreamWindow? { core.record(ref)?.window }

    // MARK: Local intents

    /// Opens a local stream: its reference, wire id and the frame announcing it.
    mutating func openStream(name: String?, now: NIODeadline) throws(MultiplexerError)
        -> (ref: StreamRef, streamID: UInt64, frame: ByteBuffer) {
        guard core.session.mayOpenLocally else {
            throw core.session.isClosed ? MultiplexerError.sessionClosed : MultiplexerError.goingAway
        }
        guard core.streams.count < configuration.maxConcurrentStreams else {
            throw .tooManyStreams(limit: configuration.maxConcurrentStreams)
        }
        let (streamID, key) = try allocateStreamID()
        let ref = core.addStream(key: key, streamID: streamID, locallyInitiated: true, now: now)
        core.metrics.streamsOpenedLocally += 1
        return (ref, streamID, openFrame(streamID: streamID, name: name))
    }

    /// An accepted stream's initializer completed (`succeeded`) or failed: it leaves the accept backlog;
    /// on success, the acknowledgement to send, if still owed.
    mutating func inboundStreamInitialized(_ ref: StreamRef, succeeded: Bool) -> ByteBuffer? {
        core.leaveAcceptBacklog(ref)
        return succeeded ? acknowledgeFrame(ref) : nil
    }

    /// This side sent FIN on `ref`. Returns whether the stream is now over in both directions.
    mutating func sentFIN(_ ref: StreamRef) -> Bool {
        let finished = core.update(ref) { record in
            _ = record.state.sendFIN()
            return record.state.isFinished
        }
        return finished ?? true
    }

    /// This side aborts `ref` (counted as a reset sent): the reset frame, unless the stream is already
    /// over on the wire or the session closed.
    mutating func resetStream(_ ref: StreamRef, message: String?, outputWritable: Bool) -> ByteBuffer? {
        core.outputWritable = outputWritable
        guard let record = core.record(ref), !record.state.isFinished, !core.session.isClosed else { return nil }
        core.update(ref) { record in record.state.reset() }
        core.metrics.resetsSent += 1
        return sendReset(streamID: record.streamID, locallyInitiated: record.isLocallyInitiated, message: message)
    }

    /// Takes `ref` out of the table: it is over on the wire (its id may be reused, in `thali-multiplex`
    /// after its quarantine). Idempotent.
    mutating func detach(_ ref: StreamRef) {
        guard let record = core.removeStream(ref) else { return }
        streamDetached(record)
    }

    /// The stream's channel ended with `discardedBytes` received bytes unread.
    mutating func streamClosed(_ ref: StreamRef, discardedBytes: Int) {
        detach(ref)
        core.bufferedTotal -= discardedBytes
    }

    /// The session ends. Returns `false` if it had already ended.
    mutating func close() -> Bool { core.session.close() }

    /// The underlying channel's input ended (the peer half-closed the connection, or its TLS
    /// close_notify arrived): no frame, window update or ping answer can come any more, so every stream
    /// and the session end with the returned error (a protocol error if the input stopped inside a
    /// frame). Waiting would only end in the keepalive timeout.
    mutating func inputEnded() -> MultiplexerError {
        .inputEnded(midFrame: isMidFrame)
    }

    // MARK: Shared input handling

    /// A reset frame for a refusal or a reset, counted against the control backlog by its size on the
    /// wire in this framing (yamux sends no message; `thali-multiplex` a varint header and the message).
    mutating func sendReset(streamID: UInt64, locallyInitiated: Bool, message: String?) -> ByteBuffer {
        let frame = resetFrame(streamID: streamID, locallyInitiated: locallyInitiated, message: message)
        core.countControlFrame(bytes: frame.readableBytes)
        return frame
    }

    /// The peer opens a stream: accepted (an `.accept` action) unless a limit refuses it (a reset frame).
    @discardableResult
    mutating func acceptRemoteStream(streamID: UInt64, key: UInt64, name: String?, now: NIODeadline) -> StreamRef? {
        guard core.session.mayAcceptRemote, core.acceptsInboundStreams,
              core.streams.count < configuration.maxConcurrentStreams,
              core.streamsAwaitingAccept < configuration.acceptBacklog
        else {
            core.metrics.streamsRefused += 1
            core.queue(.write(sendReset(streamID: streamID, locallyInitiated: false, message: "refused")))
            return nil
        }
        let ref = core.addStream(key: key, streamID: streamID, locallyInitiated: false, now: now)
        core.enterAcceptBacklog(ref)
        core.metrics.streamsAccepted += 1
        core.queue(.accept(ref, streamID: streamID, name: name))
        return ref
    }

    /// Payload bytes of the current data frame.
    mutating func receivePayload(_ bytes: ByteBuffer) {
        guard let ref = core.currentDataStream else { return }
        core.update(ref) { record in record.window.buffer(bytes.readableBytes) }
        core.bufferedTotal += bytes.readableBytes
        core.queue(.deliver(ref, bytes))
    }

    /// The peer half-closes `ref`.
    mutating func receiveFIN(_ ref: StreamRef) {
        do throws(MultiplexerError) {
            let finished = try core.update(ref) { record throws(MultiplexerError) in
                try record.state.receiveFIN(streamID: record.streamID)
                return record.state.isFinished
            }
            guard let finished else { return }
            if finished { detach(ref) }
            core.queue(.receiveEnd(ref, finished: finished))
        } catch {
            core.queue(.resetStream(ref, message: nil, error: error))
        }
    }

    /// The peer sends data on `ref`: an error action (the stream is reset) if its direction is closed.
    mutating func checkReceiveData(_ ref: StreamRef) -> Bool {
        guard let record = core.record(ref) else { return false }
        do throws(MultiplexerError) {
            try record.state.receiveData(streamID: record.streamID)
            return true
        } catch {
            core.queue(.resetStream(ref, message: nil, error: error))
            return false
        }
    }

    /// The peer resets `ref`.
    mutating func receiveReset(_ ref: StreamRef, message: String?) {
        core.metrics.resetsReceived += 1
        core.update(ref) { record in
            record.peerMaySendAfterDetach = false
            record.state.reset()
        }
        core.queue(.peerReset(ref, message: message))
    }

    /// A stream's reader took `bytes`: the session's accounting, and whether the stream still receives.
    mutating func accountConsumed(_ ref: StreamRef, bytes: Int) -> Bool {
        core.bufferedTotal -= bytes
        let receiving = core.update(ref) { record in
            record.window.consumed(bytes)
            return record.state.canReceive
        }
        return receiving ?? false
    }
}

extension MultiplexerConfiguration {
    /// The session state machine for ``framing``: the one place the framing is chosen.
    func makeSessionStateMachine(role: MultiplexerRole, acceptsInboundStreams: Bool) -> any MultiplexerSessionStateMachine {
        switch framing {
        case .yamux:
            return YamuxSessionStateMachine(role: role, configuration: self, acceptsInboundStreams: acceptsInboundStreams)
        case .thaliMultiplex:
            return ThaliMultiplexSessionStateMachine(role: role, configuration: self, acceptsInboundStreams: acceptsInboundStreams)
        }
    }
}
