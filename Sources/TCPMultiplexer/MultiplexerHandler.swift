import NIOCore

/// The session: sits at the end of a channel's pipeline (a TCP connection, or any byte stream such as a
/// Bluetooth relay) and multiplexes the streams' ``MultiplexerStreamChannel``s onto the channel. It only
/// moves bytes: the framing's session state machine (chosen once, from
/// ``MultiplexerConfiguration/framing``) decodes frames, keeps the streams' protocol state and flow
/// control, enforces the limits and encodes frames; the handler carries out what it returns. Use it
/// through ``MultiplexerSession``.
///
/// Data moves without copies: received payloads are slices of the channel's reads, and queued writes
/// are sent as slices behind a 12-byte (yamux) or varint (`thali-multiplex`) header. Frames are
/// written stream by stream in turns of ``MultiplexerConfiguration/sendChunkSize`` while the channel
/// is writable, and flushed once per batch.
public final class MultiplexerHandler: ChannelInboundHandler, RemovableChannelHandler {
    public typealias InboundIn = ByteBuffer
    public typealias OutboundOut = ByteBuffer

    /// Called on the event loop for each stream the peer opens; the stream goes live when the future
    /// succeeds, and is reset if it fails.
    public typealias StreamInitializer = @Sendable (Channel) -> EventLoopFuture<Void>

    let configuration: MultiplexerConfiguration
    let role: MultiplexerRole
    private let inboundStreamInitializer: StreamInitializer?
    /// Called once when the session ends (the async API ends its inbound sequence with it).
    private var sessionEnded: (() -> Void)?

    private var context: ChannelHandlerContext?
    /// The framing's protocol state; the only place the framing matters.
    private(set) var stateMachine: any MultiplexerSessionStateMachine
    private var streams: [UInt64: MultiplexerStreamChannel] = [:]
    private var readyToWrite = CircularBuffer<MultiplexerStreamChannel>()
    private var pendingDelivery: [MultiplexerStreamChannel] = []
    private var flushDeferred = 0
    private var needsFlush = false
    private var keepAliveTask: RepeatedTask?
    private var idleTask: Scheduled<Void>?
    /// The promises of pings the application sent, by ping id.
    private var pingPromises: [UInt32: EventLoopPromise<TimeAmount>] = [:]
    private var started = false
    /// The session ended (``end(error:)`` ran; the state machine is closed). Kept here because asking the
    /// state machine through its existential copies the whole machine (its stream table, decoder and
    /// queues, with a retain and a release each), and channelRead and writePending ask on every read
    /// and every write turn: perf showed those copies on the hot path.
    private var hasEnded = false
    /// I/O counters (the state machine counts the protocol's).
    private var bytesReceived = 0
    private var bytesSent = 0
    private var bytesSentOnStreams = 0

    /// The most bytes of peer-caused control frames (stream refusals and resets) the session queues
    /// while the underlying channel is not writable; beyond it the peer is flooding without reading and
    /// the session ends with ``MultiplexerError/controlFrameBacklog(limit:)``. 64 KiB.
    public static let maxControlBacklog = multiplexerMaxControlBacklog

    /// Creates a session handler. `inboundStreamInitializer` configures each stream the peer opens;
    /// without one, every inbound stream is refused with a reset.
    public convenience init(role: MultiplexerRole, configuration: MultiplexerConfiguration = MultiplexerConfiguration(),
                            inboundStreamInitializer: StreamInitializer?) {
        self.init(role: role, configuration: configuration, inboundStreamInitializer: inboundStreamInitializer,
                  sessionEnded: nil)
    }

    /// A session handler that calls `sessionEnded` once, on the event loop, when the session ends (the
    /// channel went inactive, a fatal error, `close()`, or the handler was removed).
    init(role: MultiplexerRole, configuration: MultiplexerConfiguration,
         inboundStreamInitializer: StreamInitializer?, sessionEnded: (() -> Void)?) {
        self.role = role
        self.configuration = configuration
        self.inboundStreamInitializer = inboundStreamInitializer
        self.sessionEnded = sessionEnded
        stateMachine = configuration.makeSessionStateMachine(role: role,
                                                             acceptsInboundStreams: inboundStreamInitializer != nil)
    }

    // MARK: Channel events

    public func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        if context.channel.isActive { start() }
    }

    public func handlerRemoved(context: ChannelHandlerContext) {
        end(error: MultiplexerError.sessionClosed)
        stopTimers()
        self.context = nil
    }

    public func channelActive(context: ChannelHandlerContext) {
        start()
        context.fireChannelActive()
    }

    public func channelInactive(context: ChannelHandlerContext) {
        end(error: MultiplexerError.sessionClosed)
        context.fireChannelInactive()
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !hasEnded else { return }
        let bytes = unwrapInboundIn(data)
        bytesReceived += bytes.readableBytes
        flushDeferred += 1
        defer { flushDeferred -= 1 }
        stateMachine.receive(bytes)
        let now = context.eventLoop.now
        do {
            while let action = try stateMachine.nextInputAction(now: now, outputWritable: context.channel.isWritable) {
                perform(action)
            }
        } catch {
            fail(error)
        }
    }

    public func channelReadComplete(context: ChannelHandlerContext) {
        flushDeferred += 1
        let streams = pendingDelivery
        pendingDelivery.removeAll(keepingCapacity: true)
        for stream in streams {
            stream.channelState.dequeuedForDelivery()
            stream.deliverIfReadPending()
        }
        flushDeferred -= 1
        flushIfNeeded()
        context.fireChannelReadComplete()
    }

    public func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable {
            if let answer = stateMachine.outputBecameWritable() { write(answer, promise: nil) }
            writePending()
        }
        context.fireChannelWritabilityChanged()
    }

    public func errorCaught(context: ChannelHandlerContext, error: Error) {
        context.fireErrorCaught(error)
    }

    /// The channel's input ended (`ChannelEvent.inputClosed`: a TCP half-closure with
    /// `allowRemoteHalfClosure`, or a TLS close_notify): the session ends at once, its streams failing
    /// with ``MultiplexerError/inputEnded(midFrame:)``, instead of waiting for the keepalive timeout.
    /// Input ending inside a frame is a protocol error and is also fired through `errorCaught`.
    public func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case ChannelEvent.inputClosed = event, !hasEnded {
            let error = stateMachine.inputEnded()
            fail(error, report: error == .inputEnded(midFrame: true))
        }
        context.fireUserInboundEventTriggered(event)
    }

    // MARK: Input actions

    /// The live channel of `ref`, if it still has one.
    private func channel(_ ref: StreamRef) -> MultiplexerStreamChannel? {
        guard let stream = streams[ref.key], stream.ref == ref else { return nil }
        return stream
    }

    private func perform(_ action: MultiplexerInputAction) {
        switch action {
        case .write(let frame):
            write(frame, promise: nil)
        case .accept(let ref, let streamID, let name):
            acceptRemoteStream(ref, streamID: streamID, name: name)
        case .deliver(let ref, let bytes):
            guard let stream = channel(ref) else { return }
            stream.receive(bytes)
            queueDelivery(stream)
        case .receiveEnd(let ref, let finished):
            guard let stream = channel(ref) else { return }
            stream.receiveEnd()
            if finished { detach(stream) }
            queueDelivery(stream)
        case .peerReset(let ref, let message):
            channel(ref)?.tearDown(error: MultiplexerError.streamReset(message: message))
        case .resetStream(let ref, let message, let error):
            guard let stream = channel(ref) else { return }
            resetStream(stream, message: message, error: error)
        case .sendWindowOpened(let ref):
            guard let stream = channel(ref), !stream.pending.isEmpty else { return }
            streamHasOutput(stream)
        case .pingAnswered(let id, let roundTripTime):
            pingPromises.removeValue(forKey: id)?.succeed(roundTripTime)
        }
    }

    private func acceptRemoteStream(_ ref: StreamRef, streamID: UInt64, name: String?) {
        guard let context, let initializer = inboundStreamInitializer else { return }
        let stream = MultiplexerStreamChannel(session: self, parent: context.channel, ref: ref, streamID: streamID,
                                              isLocallyInitiated: false, name: name)
        addStream(stream)
        stream.register()
        let loop = context.eventLoop
        let bound = NIOLoopBound((self, stream), eventLoop: loop)
        initializer(stream).hop(to: loop).whenComplete { result in
            let (handler, stream) = bound.value
            guard !stream.tornDown else { return }
            switch result {
            case .success:
                if let ack = handler.stateMachine.inboundStreamInitialized(stream.ref, succeeded: true) {
                    handler.write(ack, promise: nil)
                    handler.flushIfNeeded()
                }
                stream.activate()
            case .failure(let error):
                _ = handler.stateMachine.inboundStreamInitialized(stream.ref, succeeded: false)
                handler.resetStream(stream, message: nil, error: error)
            }
        }
    }

    // MARK: Operations (event loop only; used by MultiplexerSession)

    /// Opens a stream (event loop only): runs `initializer` on its channel, announces it to the peer, and completes
    /// with the channel once it is live.
    func createStream(name: String?, on loop: EventLoop, initializer: StreamInitializer?) -> EventLoopFuture<Channel> {
        createStream(name: name, on: loop) { stream in
            (initializer?(stream) ?? stream.eventLoop.makeSucceededVoidFuture()).map { stream }
        }
    }

    /// Opens a stream (event loop only) whose `initializer` makes an `Output` of its channel; completes
    /// with it once the stream is live.
    func createStream<Output: Sendable>(name: String?, on loop: EventLoop,
                                        initializer: @escaping @Sendable (Channel) -> EventLoopFuture<Output>) -> EventLoopFuture<Output> {
        guard let context else { return loop.makeFailedFuture(MultiplexerError.sessionClosed) }
        let opened: (ref: StreamRef, streamID: UInt64, frame: ByteBuffer)
        do {
            opened = try stateMachine.openStream(name: name, now: now)
        } catch {
            return loop.makeFailedFuture(error)
        }
        let stream = MultiplexerStreamChannel(session: self, parent: context.channel, ref: opened.ref,
                                              streamID: opened.streamID, isLocallyInitiated: true,
                                              name: stateMachine.localStreamName(name))
        addStream(stream)
        stream.register()
        write(opened.frame, promise: nil)
        flushIfNeeded()
        let promise = loop.makePromise(of: Output.self)
        let bound = NIOLoopBound((self, stream), eventLoop: loop)
        initializer(stream).hop(to: loop).whenComplete { result in
            let (handler, stream) = bound.value
            switch result {
            case .success(let output):
                stream.activate()
                if stream.tornDown { promise.fail(MultiplexerError.sessionClosed) } else { promise.succeed(output) }
            case .failure(let error):
                handler.resetStream(stream, message: nil, error: error)
                promise.fail(error)
            }
        }
        return promise.futureResult
    }

    /// Sends GoAway (yamux; `thali-multiplex` has none): the peer may open no more streams, existing
    /// ones continue.
    func goAway() {
        guard let frame = stateMachine.goAway() else { return }
        write(frame, promise: nil)
        flushIfNeeded()
    }

    /// Sends a yamux ping and completes with the round-trip time.
    func ping(on loop: EventLoop) -> EventLoopFuture<TimeAmount> {
        guard context != nil, !hasEnded else { return loop.makeFailedFuture(MultiplexerError.sessionClosed) }
        let promise = loop.makePromise(of: TimeAmount.self)
        do {
            sendPing(try stateMachine.ping(now: now), promise: promise)
        } catch {
            promise.fail(error)
        }
        return promise.futureResult
    }

    /// Ends the session: GoAway (yamux), every stream closed, the channel closed.
    func shutdown(promise: EventLoopPromise<Void>?) {
        goAway()
        guard end(error: MultiplexerError.sessionClosed), let context else { promise?.succeed(()); return }
        context.close(promise: promise)
    }

    /// A snapshot of the session's counters.
    func currentMetrics() -> MultiplexerMetrics {
        var snapshot = stateMachine.metrics
        snapshot.bytesReceived = bytesReceived
        snapshot.bytesSent = bytesSent
        snapshot.bytesSentOnStreams = bytesSentOnStreams
        snapshot.openStreams = streams.count
        snapshot.bufferedReceiveBytes = stateMachine.bufferedTotal
        snapshot.streams = streams.values.map {
            let window = stateMachine.window($0.ref)
            return MultiplexerMetrics.Stream(streamID: $0.streamID, isLocallyInitiated: $0.isLocallyInitiated,
                                             bufferedReceiveBytes: $0.inboundBytes,
                                             receiveWindow: window?.receiveWindowTarget ?? 0,
                                             sendWindow: window?.sendWindow ?? 0, queuedSendBytes: $0.pendingBytes)
        }
        return snapshot
    }

    // MARK: Called by streams

    /// The protocol state of `stream` (over once it left the session's table).
    func streamState(_ stream: MultiplexerStreamChannel) -> StreamStateMachine {
        stateMachine.streamState(stream.ref)
    }

    func streamHasOutput(_ stream: MultiplexerStreamChannel) {
        if stream.channelState.queueForWrite() { readyToWrite.append(stream) }
        writePending()
    }

    func streamConsumed(_ stream: MultiplexerStreamChannel, bytes: Int) {
        guard let update = stateMachine.consumed(stream.ref, bytes: bytes, now: now) else { return }
        write(update, promise: nil)
        flushIfNeeded()
    }

    /// Aborts a stream: RST / reset frame to the peer, then the channel is torn down with `error`.
    func resetStream(_ stream: MultiplexerStreamChannel, message: String?, error: Error?) {
        guard !stream.tornDown else { return }
        if let frame = stateMachine.resetStream(stream.ref, message: message, outputWritable: isWritable) {
            write(frame, promise: nil)
        }
        stream.tearDown(error: error)
        flushIfNeeded()
    }

    func streamTornDown(_ stream: MultiplexerStreamChannel) {
        detach(stream)
        stateMachine.streamClosed(stream.ref, discardedBytes: stream.inboundBytes)
    }

    /// The stream is over on the wire: forget its id at once (`thali-multiplex` peers reuse an id as
    /// soon as both sides closed it), even if its channel still has buffered bytes to hand out.
    private func detach(_ stream: MultiplexerStreamChannel) {
        guard stream.channelState.detach() else { return }
        if streams[stream.ref.key] === stream { streams.removeValue(forKey: stream.ref.key) }
        stateMachine.detach(stream.ref)
        if streams.isEmpty { scheduleIdleTimeout() }
    }

    private func addStream(_ stream: MultiplexerStreamChannel) {
        streams[stream.ref.key] = stream
        idleTask?.cancel()
        idleTask = nil
    }

    private func queueDelivery(_ stream: MultiplexerStreamChannel) {
        if stream.channelState.queueForDelivery() { pendingDelivery.append(stream) }
    }

    // MARK: Output

    private var isWritable: Bool { context?.channel.isWritable ?? false }
    /// The event loop's clock (an embedded loop's is moved by its test).
    private var now: NIODeadline { context?.eventLoop.now ?? .now() }

    /// Sends queued stream data in turns while the channel is writable, then flushes once.
    private func writePending() {
        guard let context, !hasEnded else { return }
        flushDeferred += 1
        while context.channel.isWritable, let stream = readyToWrite.popFirst() {
            stream.channelState.dequeuedForWrite()
            if emitFrames(for: stream), stream.channelState.queueForWrite() { readyToWrite.append(stream) }
        }
        flushDeferred -= 1
        flushIfNeeded()
    }

    /// Writes up to one turn of `stream`'s queued data (and its FIN once the queue is empty). Returns
    /// whether it has more it could send now.
    private func emitFrames(for stream: MultiplexerStreamChannel) -> Bool {
        guard !stream.tornDown else { return false }
        var budget = configuration.sendChunkSize
        var sent = 0
        while budget > 0, let first = stream.pending.first {
            let allowed = stateMachine.reserveSend(stream.ref, upTo: min(first.data.readableBytes, budget))
            if first.data.readableBytes > 0 && allowed == 0 { break }
            let index = stream.pending.startIndex
            guard let slice = stream.pending[index].data.readSlice(length: allowed) else { break }
            let done = stream.pending[index].data.readableBytes == 0
            let promise = done ? stream.pending[index].promise : nil
            if done { stream.pending.removeFirst() }
            if allowed > 0 || promise != nil {
                let withFIN = done && stream.pending.isEmpty && stream.channelState.isFINQueued && stream.state.canSend
                writeFrames(stateMachine.dataFrames(stream.ref, payload: slice, fin: withFIN), promise: promise)
                if withFIN { finSent(stream) }
            }
            budget -= allowed
            sent += allowed
        }
        if sent > 0 {
            bytesSentOnStreams += sent
            stream.didSend(bytes: sent)
        }
        if stream.pending.isEmpty && stream.channelState.isFINQueued && stream.state.canSend && !stream.tornDown {
            writeFrames(stateMachine.dataFrames(stream.ref, payload: ByteBuffer(), fin: true), promise: nil)
            finSent(stream)
        }
        return !stream.tornDown && !stream.pending.isEmpty && stateMachine.hasSendWindow(stream.ref)
    }

    private func finSent(_ stream: MultiplexerStreamChannel) {
        let finished = stateMachine.sentFIN(stream.ref)
        if stream.finSent() {
            stream.tearDown(error: nil)
        } else if finished {
            // Over on the wire; but the peer's last bytes and its end may still wait for a read (they can
            // arrive in the same read as the window update that let our FIN out): the channel ends once
            // they are delivered.
            if stream.hasUndeliveredInput { detach(stream) } else { stream.tearDown(error: nil) }
        }
    }

    private func sendPing(_ ping: OutboundPing, promise: EventLoopPromise<TimeAmount>?) {
        if let promise { pingPromises[ping.id] = promise }
        write(ping.frame, promise: nil)
        flushIfNeeded()
        // With keepalive on, every ping must be answered within the timeout.
        guard stateMachine.keepAliveInterval != nil, let context else { return }
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        context.eventLoop.scheduleTask(in: TimeAmount(configuration.keepAliveTimeout)) {
            let handler = bound.value
            if !handler.hasEnded && handler.stateMachine.isPingOutstanding(ping.id) {
                handler.fail(MultiplexerError.keepAliveTimeout)
            }
        }
    }

    private func writeFrames(_ frames: OutboundFrames, promise: EventLoopPromise<Void>?) {
        let last = frames.buffers.count - 1
        for (index, buffer) in frames.buffers.enumerated() {
            write(buffer, promise: index == last ? promise : nil)
        }
    }

    private func write(_ buffer: ByteBuffer, promise: EventLoopPromise<Void>?) {
        guard let context else { promise?.fail(MultiplexerError.sessionClosed); return }
        bytesSent += buffer.readableBytes
        context.write(wrapOutboundOut(buffer), promise: promise)
        needsFlush = true
    }

    private func flushIfNeeded() {
        guard flushDeferred == 0, needsFlush, let context else { return }
        needsFlush = false
        context.flush()
    }

    // MARK: Failure, timers

    /// A fatal session error: GoAway with the matching code (yamux), every stream fails with `error`,
    /// the channel closes. `report`: `error` is also fired through `errorCaught`.
    private func fail(_ error: Error, report: Bool = true) {
        if let frame = stateMachine.goAwayFrame(for: error) { write(frame, promise: nil) }
        needsFlush = false
        context?.flush()
        guard end(error: error) else { return }
        if report { context?.fireErrorCaught(error) }
        context?.close(promise: nil)
    }

    /// Ends the session once: timers stop, every stream ends with `error`, pings fail, and
    /// `sessionEnded` runs. Returns `false` if the session had already ended.
    @discardableResult
    private func end(error: Error) -> Bool {
        guard !hasEnded else { return false }
        hasEnded = true
        _ = stateMachine.close()
        stopTimers()
        tearDownAllStreams(error: error)
        let ended = sessionEnded
        sessionEnded = nil
        ended?()
        return true
    }

    private func tearDownAllStreams(error: Error) {
        for stream in Array(streams.values) { stream.tearDown(error: error) }
        for (_, promise) in pingPromises { promise.fail(error) }
        pingPromises.removeAll()
        readyToWrite.removeAll()
        // Streams already over on the wire are no longer the session's: what they received (their end
        // included, perhaps in the same read as the session's end) is still theirs to hand on. Dropped,
        // a stream whose end was queued here never ended.
        let finished = pendingDelivery.filter { $0.channelState.isDetached && !$0.tornDown }
        pendingDelivery.removeAll()
        for stream in finished {
            stream.channelState.dequeuedForDelivery()
            stream.deliverIfReadPending()
        }
    }

    private func start() {
        guard !started, let context else { return }
        started = true
        scheduleIdleTimeout()
        // yamux: measures the round-trip time for window auto-tuning.
        guard let ping = stateMachine.startPing(now: now) else { return }
        sendPing(ping, promise: nil)
        if let interval = stateMachine.keepAliveInterval {
            let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
            keepAliveTask = context.eventLoop.scheduleRepeatedTask(initialDelay: interval, delay: interval) { _ in
                bound.value.keepAlive()
            }
        }
    }

    private func keepAlive() {
        guard !hasEnded, let ping = try? stateMachine.ping(now: now) else { return }
        sendPing(ping, promise: nil)
    }

    private func scheduleIdleTimeout() {
        guard let timeout = configuration.idleTimeout, let context, idleTask == nil, !hasEnded else { return }
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        idleTask = context.eventLoop.scheduleTask(in: TimeAmount(timeout)) {
            let handler = bound.value
            handler.idleTask = nil
            guard handler.streams.isEmpty else { return }
            handler.goAway()
            handler.fail(MultiplexerError.idleTimeout)
        }
    }

    private func stopTimers() {
        keepAliveTask?.cancel()
        keepAliveTask = nil
        idleTask?.cancel()
        idleTask = nil
    }
}
