import NIOConcurrencyHelpers
import NIOCore

/// One stream of a multiplexer session, as a NIO child channel of the session's channel. Reads and
/// writes `ByteBuffer`s. Everything runs on the parent channel's event loop.
///
/// Closing: `close(mode: .output)` half-closes (FIN / close frame) after the queued writes. `close()`
/// after the peer has finished sending is a graceful close (FIN if not yet sent); `close()` while the
/// peer may still send aborts the stream (RST / reset frame), as does the outbound user event
/// ``MultiplexerStreamReset``. When the peer half-closes, the channel fires
/// `ChannelEvent.inputClosed` if `ChannelOptions.allowRemoteHalfClosure` is set, else it closes.
/// A reset by the peer fires ``MultiplexerError/streamReset(message:)`` and closes.
///
/// Backpressure: received bytes are handed to the pipeline only on `read()` (with `autoRead`, after
/// each read cycle), and a yamux stream's window is replenished only for bytes so handed out, so a
/// stream whose reader stops holds at most its window. Writes queue in the stream until the session
/// may send them (send window, parent writability); `isWritable` turns false above
/// ``MultiplexerConfiguration/streamWriteBufferHighWatermark``.
public final class MultiplexerStreamChannel: Channel, ChannelCore, @unchecked Sendable {
    // @unchecked Sendable: every mutable field is touched only on `eventLoop`, except the two boxed flags.

    /// The stream id on the wire (in `thali-multiplex`, ids of the two sides' streams may coincide).
    public let streamID: UInt64
    /// Whether this side opened the stream.
    public let isLocallyInitiated: Bool
    /// The stream's name: `thali-multiplex` open frames carry one (an empty one names the stream by its
    /// id); `nil` in yamux.
    public let name: String?

    public let eventLoop: EventLoop
    public let parent: Channel?
    public var allocator: ByteBufferAllocator { parent?.allocator ?? ByteBufferAllocator() }
    public var closeFuture: EventLoopFuture<Void> { closePromise.futureResult }
    public var pipeline: ChannelPipeline { _pipeline }
    public var _channelCore: ChannelCore { self }
    public var localAddress: SocketAddress? { parent?.localAddress }
    public var remoteAddress: SocketAddress? { parent?.remoteAddress }
    public var isWritable: Bool { writableBox.withLockedValue { $0 } }
    public var isActive: Bool { activeBox.withLockedValue { $0 } }

    private let closePromise: EventLoopPromise<Void>
    private var _pipeline: ChannelPipeline!
    private let writableBox = NIOLockedValueBox(true)
    private let activeBox = NIOLockedValueBox(false)
    weak var session: MultiplexerHandler?
    /// The stream in the session's state machine.
    let ref: StreamRef

    // MARK: State (event loop only)
    /// The stream's protocol state, kept by the session's state machine.
    var state: StreamStateMachine { session?.streamState(self) ?? StreamStateMachine(state: .reset) }
    /// The channel's own state: its lifecycle, how its output ends, the peer's end, the session's bookkeeping.
    /// The session changes it only through its transitions.
    var channelState = StreamChannelStateMachine()
    /// Whether the channel has been torn down.
    var tornDown: Bool { channelState.isTornDown }

    // Inbound
    private var inbound = CircularBuffer<ByteBuffer>(initialCapacity: 8)
    /// Received bytes not yet handed to the pipeline.
    private(set) var inboundBytes = 0

    // Outbound
    struct PendingWrite {
        var data: ByteBuffer
        var promise: EventLoopPromise<Void>?
    }
    private var unflushed = CircularBuffer<PendingWrite>(initialCapacity: 8)
    var pending = CircularBuffer<PendingWrite>(initialCapacity: 8)
    /// Bytes written by the pipeline and not yet handed to the parent channel.
    private(set) var pendingBytes = 0
    /// Completed when FIN is out (`close(mode: .output)`'s promise).
    private var finPromise: EventLoopPromise<Void>?
    /// Completed when a graceful `close()` has sent FIN and ended the channel.
    private var gracefulClosePromise: EventLoopPromise<Void>?

    // Options
    private var autoRead = true
    private var allowRemoteHalfClosure = false

    init(session: MultiplexerHandler, parent: Channel, ref: StreamRef, streamID: UInt64,
         isLocallyInitiated: Bool, name: String?) {
        self.session = session
        self.parent = parent
        self.eventLoop = parent.eventLoop
        self.ref = ref
        self.streamID = streamID
        self.isLocallyInitiated = isLocallyInitiated
        self.name = name
        self.closePromise = parent.eventLoop.makePromise()
        self._pipeline = ChannelPipeline(channel: self)
    }

    // MARK: Channel

    public func setOption<Option: ChannelOption>(_ option: Option, value: Option.Value) -> EventLoopFuture<Void> {
        if eventLoop.inEventLoop {
            return eventLoop.makeCompletedFuture { try setOption0(option, value: value) }
        }
        return eventLoop.submit { try self.setOption0(option, value: value) }
    }

    public func getOption<Option: ChannelOption>(_ option: Option) -> EventLoopFuture<Option.Value> {
        if eventLoop.inEventLoop {
            return eventLoop.makeCompletedFuture { try getOption0(option) }
        }
        return eventLoop.submit { try self.getOption0(option) }
    }

    public var syncOptions: NIOSynchronousChannelOptions? { SynchronousOptions(channel: self) }

    private struct SynchronousOptions: NIOSynchronousChannelOptions {
        let channel: MultiplexerStreamChannel
        func setOption<Option: ChannelOption>(_ option: Option, value: Option.Value) throws {
            try channel.setOption0(option, value: value)
        }
        func getOption<Option: ChannelOption>(_ option: Option) throws -> Option.Value {
            try channel.getOption0(option)
        }
    }

    private func setOption0<Option: ChannelOption>(_ option: Option, value: Option.Value) throws {
        eventLoop.preconditionInEventLoop()
        switch option {
        case _ as ChannelOptions.Types.AutoReadOption:
            // The cast cannot fail: the option's value type is Bool.
            let enable = value as? Bool ?? autoRead
            if enable && !autoRead { autoRead = true; read0() } else { autoRead = enable }
        case _ as ChannelOptions.Types.AllowRemoteHalfClosureOption:
            allowRemoteHalfClosure = value as? Bool ?? allowRemoteHalfClosure
        default:
            throw ChannelError.operationUnsupported
        }
    }

    private func getOption0<Option: ChannelOption>(_ option: Option) throws -> Option.Value {
        eventLoop.preconditionInEventLoop()
        switch option {
        case _ as ChannelOptions.Types.AutoReadOption:
            if let value = autoRead as? Option.Value { return value }
        case _ as ChannelOptions.Types.AllowRemoteHalfClosureOption:
            if let value = allowRemoteHalfClosure as? Option.Value { return value }
        default:
            break
        }
        throw ChannelError.operationUnsupported
    }

    // MARK: ChannelCore

    public func localAddress0() throws -> SocketAddress {
        guard let address = parent?.localAddress else { throw ChannelError.operationUnsupported }
        return address
    }

    public func remoteAddress0() throws -> SocketAddress {
        guard let address = parent?.remoteAddress else { throw ChannelError.operationUnsupported }
        return address
    }

    public func register0(promise: EventLoopPromise<Void>?) {
        promise?.fail(ChannelError.operationUnsupported)
    }

    public func registerAlreadyConfigured0(promise: EventLoopPromise<Void>?) {
        promise?.fail(ChannelError.operationUnsupported)
    }

    public func bind0(to address: SocketAddress, promise: EventLoopPromise<Void>?) {
        promise?.fail(ChannelError.operationUnsupported)
    }

    public func connect0(to address: SocketAddress, promise: EventLoopPromise<Void>?) {
        promise?.fail(ChannelError.operationUnsupported)
    }

    public func write0(_ data: NIOAny, promise: EventLoopPromise<Void>?) {
        guard !tornDown else { promise?.fail(ChannelError.ioOnClosedChannel); return }
        guard state.canSend, channelState.acceptsOutput else { promise?.fail(MultiplexerError.outputClosed); return }
        let buffer = unwrapData(data, as: ByteBuffer.self)
        unflushed.append(PendingWrite(data: buffer, promise: promise))
        pendingBytes += buffer.readableBytes
        updateWritability()
    }

    public func flush0() {
        guard !tornDown, !unflushed.isEmpty else { return }
        while let write = unflushed.popFirst() { pending.append(write) }
        session?.streamHasOutput(self)
    }

    public func read0() {
        guard channelState.requestRead() else { return }
        if channelState.mayDeliver && hasUndeliveredInput { deliverPendingReads() }
    }

    public func close0(error: Error, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        guard !tornDown else { promise?.fail(ChannelError.alreadyClosed); return }
        switch mode {
        case .output:
            guard state.canSend, channelState.requestFIN() else { promise?.fail(ChannelError.outputClosed); return }
            flush0()
            finPromise = promise
            session?.streamHasOutput(self)
        case .input:
            promise?.fail(ChannelError.operationUnsupported)
        case .all:
            if state.isFinished {
                tearDown(error: nil)
                promise?.succeed(())
            } else if !state.canReceive {
                // The peer is done: finish our side cleanly, then go.
                guard channelState.requestGracefulClose() else {
                    // Already closing: this close completes with the first.
                    if let promise { closePromise.futureResult.cascade(to: promise) }
                    return
                }
                flush0()
                gracefulClosePromise = promise
                session?.streamHasOutput(self)
            } else {
                session?.resetStream(self, message: nil, error: nil)
                promise?.succeed(())
            }
        }
    }

    public func triggerUserOutboundEvent0(_ event: Any, promise: EventLoopPromise<Void>?) {
        guard let reset = event as? MultiplexerStreamReset else {
            promise?.fail(ChannelError.operationUnsupported)
            return
        }
        guard !tornDown else { promise?.fail(ChannelError.alreadyClosed); return }
        session?.resetStream(self, message: reset.message, error: nil)
        promise?.succeed(())
    }

    public func channelRead0(_ data: NIOAny) {
        // Reads that reached the end of the pipeline unhandled are dropped.
    }

    public func errorCaught0(error: Error) {
        // Errors that reached the end of the pipeline unhandled are dropped.
    }

    // MARK: Called by the session

    /// Runs the pipeline's registration; the channel becomes usable once `activate()` runs.
    func register() {
        pipeline.fireChannelRegistered()
    }

    /// The initializer completed: the stream goes live.
    func activate() {
        guard channelState.activate() else { return }
        activeBox.withLockedValue { $0 = true }
        pipeline.fireChannelActive()
        if autoRead { pipeline.read() }
        if channelState.mayDeliver && hasUndeliveredInput { deliverPendingReads() }
    }

    /// Received payload bytes (already checked against the window/buffer limits).
    func receive(_ bytes: ByteBuffer) {
        inbound.append(bytes)
        inboundBytes += bytes.readableBytes
    }

    /// The peer half-closed: delivered once the buffered bytes have been read.
    func receiveEnd() {
        channelState.receiveEnd()
    }

    /// Whether received bytes or the peer's end still wait for the pipeline to read them.
    var hasUndeliveredInput: Bool { !inbound.isEmpty || channelState.hasPendingInputEnd }

    /// Hands buffered bytes (and a pending end) to the pipeline if a read is pending.
    func deliverIfReadPending() {
        if channelState.mayDeliver { deliverPendingReads() }
    }

    private func deliverPendingReads() {
        channelState.beginDelivery(hasBytes: !inbound.isEmpty)
        defer { channelState.endDelivery() }
        var delivered = 0
        if !inbound.isEmpty {
            while let bytes = inbound.popFirst(), !tornDown {
                inboundBytes -= bytes.readableBytes
                delivered += bytes.readableBytes
                pipeline.fireChannelRead(bytes)
            }
            session?.streamConsumed(self, bytes: delivered)
            pipeline.fireChannelReadComplete()
        }
        if inbound.isEmpty && !tornDown && channelState.takeInputEnd() {
            if allowRemoteHalfClosure {
                pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
                if state.isFinished { tearDown(error: nil) }
            } else {
                close0(error: ChannelError.eof, mode: .all, promise: nil)
            }
        }
        if autoRead && channelState.isActive && delivered > 0 { pipeline.read() }
    }

    /// FIN went out: completes `close(mode: .output)`'s promise. Returns whether the channel must now
    /// end (a graceful `close()` asked for the FIN).
    func finSent() -> Bool {
        finPromise?.succeed(())
        finPromise = nil
        return channelState.finSent()
    }

    /// Counts bytes handed to the parent and updates writability.
    func didSend(bytes: Int) {
        pendingBytes -= bytes
        updateWritability()
    }

    private func updateWritability() {
        let limit = session?.configuration.streamWriteBufferHighWatermark ?? Int.max
        let wasWritable = isWritable
        let nowWritable = wasWritable ? pendingBytes <= limit : pendingBytes <= limit / 2
        guard nowWritable != wasWritable else { return }
        writableBox.withLockedValue { $0 = nowWritable }
        if channelState.isActive { pipeline.fireChannelWritabilityChanged() }
    }

    /// Ends the channel: fails queued writes, fires `error` (if any), inactive and unregistered, and
    /// leaves the session's table.
    func tearDown(error: Error?) {
        guard let wasActive = channelState.tearDown() else { return }
        let failure: Error = error ?? ChannelError.ioOnClosedChannel
        while let write = unflushed.popFirst() { write.promise?.fail(failure) }
        while let write = pending.popFirst() { write.promise?.fail(failure) }
        pendingBytes = 0
        finPromise?.fail(failure)
        finPromise = nil
        gracefulClosePromise?.succeed(())
        gracefulClosePromise = nil
        session?.streamTornDown(self)
        inbound.removeAll()
        inboundBytes = 0
        activeBox.withLockedValue { $0 = false }
        if let error, wasActive { pipeline.fireErrorCaught(error) }
        if wasActive { pipeline.fireChannelInactive() }
        pipeline.fireChannelUnregistered()
        eventLoop.execute { self.removeHandlers(pipeline: self.pipeline) }
        closePromise.succeed(())
    }
}

/// Outbound user event that resets a stream (RST in yamux; a reset frame carrying `message` in
/// `thali-multiplex`): `channel.triggerUserOutboundEvent(MultiplexerStreamReset(message: "boom"))`.
public struct MultiplexerStreamReset: Sendable, Hashable {
    /// The error message a `thali-multiplex` reset frame carries (yamux has no room for it).
    public var message: String?
    /// A reset carrying `message` (if the framing has room for it).
    public init(message: String? = nil) { self.message = message }
}
