import NIOCore

/// The session: sits at the end of a channel's pipeline (a TCP connection, or any byte stream such as a
/// Bluetooth relay), decodes frames, drives the stream and session state machines and multiplexes the
/// streams' ``MultiplexerStreamChannel``s onto the channel. Use it through ``MultiplexerSession``.
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

    private enum Decoder {
        case yamux(YamuxFrameDecoder)
        case thaliMultiplex(ThaliMultiplexFrameDecoder)
    }

    private var context: ChannelHandlerContext?
    private var decoder: Decoder
    private var session = SessionStateMachine()
    private var streams: [UInt64: MultiplexerStreamChannel] = [:]
    /// The stream the payload being received belongs to (`nil`: discard it).
    private var currentDataStream: MultiplexerStreamChannel?
    /// yamux flags of the data frame being received, applied once its payload is in.
    private var currentDataFlags: YamuxHeader.Flags = []
    private var readyToWrite = CircularBuffer<MultiplexerStreamChannel>()
    private var pendingDelivery: [MultiplexerStreamChannel] = []
    private var flushDeferred = 0
    private var needsFlush = false
    private var nextYamuxStreamID: UInt64
    private var usedLocalThaliIDs = Set<UInt64>()
    /// `thali-multiplex` ids of our ended streams the peer could still send a frame for, oldest first
    /// (see ``MultiplexerConfiguration/maxQuarantinedStreamIDs``).
    private var quarantinedLocalThaliIDs = Set<UInt64>()
    private var quarantineOrder: [UInt64] = []
    private var streamsAwaitingAccept = 0
    private var receiveWindowTotal = 0
    private var bufferedTotal = 0
    private var keepAliveTask: RepeatedTask?
    private var idleTask: Scheduled<Void>?
    private var nextPingID: UInt32 = 1
    private var outstandingPings: [UInt32: (sent: NIODeadline, promise: EventLoopPromise<TimeAmount>?)] = [:]
    /// The latest measured round-trip time (yamux pings), used by window auto-tuning.
    private var roundTripTime: TimeAmount?
    private var started = false
    /// A ping to answer once the channel is writable again.
    private var pendingPingAnswer: UInt32?
    /// Bytes of frames the peer caused (refusals, resets) written while the channel was not writable.
    private var controlBacklog = 0

    /// The most bytes of peer-caused control frames (stream refusals and resets) the session queues
    /// while the underlying channel is not writable; beyond it the peer is flooding without reading and
    /// the session ends with ``MultiplexerError/controlFrameBacklog(limit:)``. 64 KiB.
    public static let maxControlBacklog = 64 * 1024
    private(set) var metrics = MultiplexerMetrics()

    /// Creates a session handler. `inboundStreamInitializer` configures each stream the peer opens;
    /// without one, every inbound stream is refused with a reset.
    public init(role: MultiplexerRole, configuration: MultiplexerConfiguration = MultiplexerConfiguration(),
                inboundStreamInitializer: StreamInitializer?) {
        self.role = role
        self.configuration = configuration
        self.inboundStreamInitializer = inboundStreamInitializer
        switch configuration.framing {
        case .yamux:
            decoder = .yamux(YamuxFrameDecoder(maxDataLength: min(configuration.maxStreamWindowSize, Int(UInt32.max))))
        case .thaliMultiplex:
            decoder = .thaliMultiplex(ThaliMultiplexFrameDecoder(maxPayloadLength: configuration.maxFrameSize))
        }
        nextYamuxStreamID = role == .client ? 1 : 2
    }

    // MARK: Channel events

    public func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        if context.channel.isActive { start() }
    }

    public func handlerRemoved(context: ChannelHandlerContext) {
        stopTimers()
        self.context = nil
    }

    public func channelActive(context: ChannelHandlerContext) {
        start()
        context.fireChannelActive()
    }

    public func channelInactive(context: ChannelHandlerContext) {
        if session.close() {
            stopTimers()
            tearDownAllStreams(error: MultiplexerError.sessionClosed)
        }
        context.fireChannelInactive()
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !session.isClosed else { return }
        let bytes = unwrapInboundIn(data)
        metrics.bytesReceived += bytes.readableBytes
        flushDeferred += 1
        defer { flushDeferred -= 1 }
        do {
            switch decoder {
            case .yamux(var yamux):
                yamux.feed(bytes)
                decoder = .yamux(YamuxFrameDecoder(maxDataLength: 0))  // keep one copy of the buffer
                defer { decoder = .yamux(yamux) }
                while !session.isClosed, let event = try yamux.next() {
                    try handleYamux(event, payloadRemaining: yamux.pendingPayloadBytes)
                    if controlBacklogExceeded { throw MultiplexerError.controlFrameBacklog(limit: Self.maxControlBacklog) }
                }
            case .thaliMultiplex(var thali):
                thali.feed(bytes)
                decoder = .thaliMultiplex(ThaliMultiplexFrameDecoder(maxPayloadLength: 0))
                defer { decoder = .thaliMultiplex(thali) }
                while !session.isClosed, let event = try thali.next() {
                    try handleThali(event)
                    if controlBacklogExceeded { throw MultiplexerError.controlFrameBacklog(limit: Self.maxControlBacklog) }
                }
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
            stream.isQueuedForDelivery = false
            stream.deliverIfReadPending()
        }
        flushDeferred -= 1
        flushIfNeeded()
        context.fireChannelReadComplete()
    }

    public func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable {
            controlBacklog = 0
            if let ping = pendingPingAnswer {
                pendingPingAnswer = nil
                writeYamuxHeader(YamuxHeader(type: .ping, flags: .ack, streamID: 0, length: ping))
            }
            writePending()
        }
        context.fireChannelWritabilityChanged()
    }

    public func errorCaught(context: ChannelHandlerContext, error: Error) {
        context.fireErrorCaught(error)
    }

    // MARK: Operations (event loop only; used by MultiplexerSession)

    /// Opens a stream (event loop only): runs `initializer` on its channel, announces it to the peer, and completes
    /// with the channel once it is live.
    func createStream(name: String?, on loop: EventLoop, initializer: StreamInitializer?) -> EventLoopFuture<Channel> {
        guard let context else { return loop.makeFailedFuture(MultiplexerError.sessionClosed) }
        guard session.mayOpenLocally else {
            return loop.makeFailedFuture(session.isClosed ? MultiplexerError.sessionClosed : MultiplexerError.goingAway)
        }
        guard streams.count < configuration.maxConcurrentStreams else {
            return loop.makeFailedFuture(MultiplexerError.tooManyStreams(limit: configuration.maxConcurrentStreams))
        }
        let streamID: UInt64
        let key: UInt64
        switch configuration.framing {
        case .yamux:
            guard nextYamuxStreamID <= UInt64(UInt32.max) else {
                return loop.makeFailedFuture(MultiplexerError.streamIDsExhausted)
            }
            streamID = nextYamuxStreamID
            nextYamuxStreamID += 2
            key = streamID
        case .thaliMultiplex:
            // The lowest id not in use, as multiplex 6.7.0 picks it.
            var candidate: UInt64 = 0
            while usedLocalThaliIDs.contains(candidate) || quarantinedLocalThaliIDs.contains(candidate) { candidate += 1 }
            streamID = candidate
            usedLocalThaliIDs.insert(candidate)
            key = candidate << 1 | 1
        }
        let stream = MultiplexerStreamChannel(session: self, parent: context.channel, key: key, streamID: streamID,
                                              isLocallyInitiated: true, name: configuration.framing == .yamux ? nil : name)
        addStream(stream)
        stream.register()
        flushDeferred += 1
        switch configuration.framing {
        case .yamux:
            writeYamuxHeader(YamuxHeader(type: .windowUpdate, flags: .syn, streamID: UInt32(streamID), length: 0))
        case .thaliMultiplex:
            var body = context.channel.allocator.buffer(capacity: name?.utf8.count ?? 0)
            if let name { body.writeString(name) }
            writeThali(ThaliMultiplexHeader(streamID: streamID, flag: .open, length: body.readableBytes), body: body)
        }
        metrics.streamsOpenedLocally += 1
        flushDeferred -= 1
        flushIfNeeded()
        let promise = loop.makePromise(of: Channel.self)
        let initialized = initializer?(stream) ?? loop.makeSucceededVoidFuture()
        let bound = NIOLoopBound((self, stream), eventLoop: loop)
        initialized.hop(to: loop).whenComplete { result in
            let (handler, stream) = bound.value
            switch result {
            case .success:
                stream.activate()
                if stream.tornDown { promise.fail(MultiplexerError.sessionClosed) } else { promise.succeed(stream) }
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
        guard configuration.framing == .yamux, session.sendGoAway() else { return }
        writeYamuxHeader(YamuxHeader(type: .goAway, streamID: 0, length: YamuxHeader.GoAwayCode.normal.rawValue))
        flushIfNeeded()
    }

    /// Sends a yamux ping and completes with the round-trip time.
    func ping(on loop: EventLoop) -> EventLoopFuture<TimeAmount> {
        guard context != nil, !session.isClosed else { return loop.makeFailedFuture(MultiplexerError.sessionClosed) }
        guard configuration.framing == .yamux else {
            return loop.makeFailedFuture(MultiplexerError.unsupported("ping in thali-multiplex"))
        }
        let promise = loop.makePromise(of: TimeAmount.self)
        sendPing(promise: promise)
        return promise.futureResult
    }

    /// Ends the session: GoAway (yamux), every stream closed, the channel closed.
    func shutdown(promise: EventLoopPromise<Void>?) {
        goAway()
        guard session.close(), let context else { promise?.succeed(()); return }
        stopTimers()
        tearDownAllStreams(error: MultiplexerError.sessionClosed)
        context.close(promise: promise)
    }

    /// A snapshot of the session's counters.
    func currentMetrics() -> MultiplexerMetrics {
        var snapshot = metrics
        snapshot.openStreams = streams.count
        snapshot.bufferedReceiveBytes = bufferedTotal
        snapshot.streams = streams.values.map {
            MultiplexerMetrics.Stream(streamID: $0.streamID, isLocallyInitiated: $0.isLocallyInitiated,
                                      bufferedReceiveBytes: $0.inboundBytes, receiveWindow: $0.receiveWindowTarget,
                                      sendWindow: $0.sendWindow, queuedSendBytes: $0.pendingBytes)
        }
        return snapshot
    }

    // MARK: Called by streams

    func streamHasOutput(_ stream: MultiplexerStreamChannel) {
        if !stream.isQueuedForWrite {
            stream.isQueuedForWrite = true
            readyToWrite.append(stream)
        }
        writePending()
    }

    func streamConsumed(_ stream: MultiplexerStreamChannel, bytes: Int) {
        bufferedTotal -= bytes
        guard configuration.framing == .yamux, !stream.tornDown, stream.state.canReceive else { return }
        let granted = stream.receiveWindow + stream.inboundBytes
        guard stream.receiveWindowTarget - granted >= stream.receiveWindowTarget / 2 else { return }
        let now = NIODeadline.now()
        if let rtt = roundTripTime, now - stream.windowEpoch < rtt * 4,
           stream.receiveWindowTarget < configuration.maxStreamWindowSize {
            // The window turned over within a few round trips: it limits the stream, so grow it while
            // the session's memory budget allows.
            let grown = min(stream.receiveWindowTarget * 2, configuration.maxStreamWindowSize, Int(UInt32.max))
            if receiveWindowTotal + grown - stream.receiveWindowTarget <= configuration.maxSessionReceiveBuffer {
                receiveWindowTotal += grown - stream.receiveWindowTarget
                stream.receiveWindowTarget = grown
                metrics.windowGrowths += 1
            }
        }
        stream.windowEpoch = now
        let delta = stream.receiveWindowTarget - granted
        stream.receiveWindow += delta
        var flags: YamuxHeader.Flags = []
        if stream.ackPending { flags.insert(.ack); stream.ackPending = false }
        writeYamuxHeader(YamuxHeader(type: .windowUpdate, flags: flags, streamID: UInt32(stream.streamID), length: UInt32(delta)))
        metrics.windowUpdatesSent += 1
        flushIfNeeded()
    }

    /// Aborts a stream: RST / reset frame to the peer, then the channel is torn down with `error`.
    func resetStream(_ stream: MultiplexerStreamChannel, message: String?, error: Error?) {
        guard !stream.tornDown else { return }
        if !stream.state.isFinished && !session.isClosed {
            sendReset(streamID: stream.streamID, locallyInitiated: stream.isLocallyInitiated, message: message)
            metrics.resetsSent += 1
        }
        stream.tearDown(error: error)
        flushIfNeeded()
    }

    func streamTornDown(_ stream: MultiplexerStreamChannel) {
        detach(stream)
        bufferedTotal -= stream.inboundBytes
    }

    /// The stream is over on the wire: forget its id at once (`thali-multiplex` peers reuse an id as
    /// soon as both sides closed it), even if its channel still has buffered bytes to hand out.
    private func detach(_ stream: MultiplexerStreamChannel) {
        guard !stream.isDetached else { return }
        stream.isDetached = true
        if streams[stream.key] === stream { streams.removeValue(forKey: stream.key) }
        if stream.isLocallyInitiated && configuration.framing == .thaliMultiplex {
            usedLocalThaliIDs.remove(stream.streamID)
            if stream.peerMaySendAfterDetach { quarantine(stream.streamID) }
        }
        leaveAcceptBacklog(stream)
        receiveWindowTotal -= stream.receiveWindowTarget
        if currentDataStream === stream { currentDataStream = nil }
        if streams.isEmpty { scheduleIdleTimeout() }
    }

    private func quarantine(_ streamID: UInt64) {
        guard configuration.maxQuarantinedStreamIDs > 0, quarantinedLocalThaliIDs.insert(streamID).inserted else { return }
        quarantineOrder.append(streamID)
        if quarantineOrder.count > configuration.maxQuarantinedStreamIDs {
            quarantinedLocalThaliIDs.remove(quarantineOrder.removeFirst())
        }
    }

    /// The peer's reset for one of our quarantined ids: nothing of the old stream can follow it.
    private func releaseQuarantine(_ streamID: UInt64) {
        guard quarantinedLocalThaliIDs.remove(streamID) != nil else { return }
        quarantineOrder.removeAll { $0 == streamID }
    }

    private func leaveAcceptBacklog(_ stream: MultiplexerStreamChannel) {
        guard stream.isInAcceptBacklog else { return }
        stream.isInAcceptBacklog = false
        streamsAwaitingAccept -= 1
    }

    // MARK: yamux input

    private var controlBacklogExceeded = false

    private func controlBacklogChecked() {
        if controlBacklog > Self.maxControlBacklog { controlBacklogExceeded = true }
    }

    private func handleYamux(_ event: YamuxFrameDecoder.Event, payloadRemaining: Int) throws {
        switch event {
        case .data(let bytes):
            if let stream = currentDataStream {
                stream.receive(bytes)
                bufferedTotal += bytes.readableBytes
                queueDelivery(stream)
            }
            if payloadRemaining == 0 { finishYamuxDataFrame() }
        case .header(let header):
            metrics.framesReceived += 1
            defer { controlBacklogChecked() }
            switch header.type {
            case .data, .windowUpdate:
                try handleYamuxStreamFrame(header)
            case .ping:
                if header.flags.contains(.syn) {
                    if context?.channel.isWritable ?? false {
                        writeYamuxHeader(YamuxHeader(type: .ping, flags: .ack, streamID: 0, length: header.length))
                    } else {
                        // Congested: answer only the latest ping once writable, so a ping flood
                        // cannot queue answers without bound.
                        pendingPingAnswer = header.length
                    }
                } else if header.flags.contains(.ack), let ping = outstandingPings.removeValue(forKey: header.length) {
                    let rtt = NIODeadline.now() - ping.sent
                    roundTripTime = rtt
                    ping.promise?.succeed(rtt)
                }
            case .goAway:
                guard header.length == YamuxHeader.GoAwayCode.normal.rawValue else {
                    throw MultiplexerError.remoteGoAway(code: header.length)
                }
                session.receiveGoAway()
                metrics.goAwaysReceived += 1
            }
        }
    }

    private func handleYamuxStreamFrame(_ header: YamuxHeader) throws {
        let id = UInt64(header.streamID)
        guard id != 0 else { throw MultiplexerError.invalidStreamID(0) }
        var stream = streams[id]
        if header.flags.contains(.syn) {
            guard stream == nil else { throw MultiplexerError.duplicateStream(id) }
            // The client opens odd ids, the server even ones.
            let remoteOpensOdd = role == .server
            guard (id % 2 == 1) == remoteOpensOdd else { throw MultiplexerError.invalidStreamID(id) }
            stream = acceptRemoteStream(streamID: id, key: id, name: nil)
        }
        currentDataStream = nil
        currentDataFlags = []
        guard let stream else { return }  // A stream already gone (we reset it): drop the frame.
        if header.flags.contains(.rst) {
            receiveReset(stream, message: nil)
            return
        }
        if header.type == .windowUpdate {
            guard stream.sendWindow + Int(header.length) <= Int(UInt32.max) else {
                throw MultiplexerError.sendWindowOverflow(streamID: id)
            }
            stream.sendWindow += Int(header.length)
            if header.flags.contains(.fin) { receiveFIN(stream) }
            if header.length > 0 && !stream.pending.isEmpty { streamHasOutput(stream) }
            return
        }
        let length = Int(header.length)
        if length > 0 {
            guard length <= stream.receiveWindow else {
                throw MultiplexerError.receiveWindowExceeded(streamID: id, window: stream.receiveWindow, length: length)
            }
            do {
                try stream.state.receiveData(streamID: id)
            } catch {
                resetStream(stream, message: nil, error: error)
                return
            }
            stream.receiveWindow -= length
            currentDataStream = stream
            currentDataFlags = header.flags
        } else if header.flags.contains(.fin) {
            receiveFIN(stream)
        }
    }

    private func finishYamuxDataFrame() {
        if let stream = currentDataStream, currentDataFlags.contains(.fin) { receiveFIN(stream) }
        currentDataStream = nil
        currentDataFlags = []
    }

    // MARK: thali-multiplex input

    private func handleThali(_ event: ThaliMultiplexFrameDecoder.Event) throws {
        switch event {
        case .data(let bytes):
            if let stream = currentDataStream {
                stream.receive(bytes)
                bufferedTotal += bytes.readableBytes
                queueDelivery(stream)
            }
        case .header(let header, let body):
            metrics.framesReceived += 1
            defer { controlBacklogChecked() }
            // Frames from the opener name a stream the peer opened (key bit 0 clear), the others one we opened.
            let key = header.streamID << 1 | (header.flag.fromInitiator ? 0 : 1)
            currentDataStream = nil
            switch header.flag.kind {
            case .open:
                guard streams[key] == nil else { throw MultiplexerError.duplicateStream(header.streamID) }
                let name = body.map { String(decoding: $0.readableBytesView, as: UTF8.self) } ?? ""
                _ = acceptRemoteStream(streamID: header.streamID, key: key,
                                       name: name.isEmpty ? String(header.streamID) : name)
            case .message:
                guard let stream = streams[key] else { return }
                do {
                    try stream.state.receiveData(streamID: header.streamID)
                } catch {
                    resetStream(stream, message: nil, error: error)
                    return
                }
                if stream.inboundBytes + header.length > configuration.maxStreamReceiveBuffer
                    || bufferedTotal + header.length > configuration.maxSessionReceiveBuffer {
                    // No flow control in this framing: a reader that falls this far behind loses its stream.
                    metrics.overflowResets += 1
                    resetStream(stream, message: "receive buffer overflow",
                                error: MultiplexerError.receiveBufferOverflow(streamID: header.streamID,
                                                                              limit: configuration.maxStreamReceiveBuffer))
                    return
                }
                currentDataStream = stream
            case .close:
                // For a quarantined id: the peer may still reset it after its close.
                guard let stream = streams[key] else { return }
                receiveFIN(stream)
            case .reset:
                guard let stream = streams[key] else {
                    if !header.flag.fromInitiator { releaseQuarantine(header.streamID) }
                    return
                }
                let message = body.flatMap { $0.readableBytes > 0 ? String(decoding: $0.readableBytesView, as: UTF8.self) : nil }
                receiveReset(stream, message: message)
            }
        }
    }

    // MARK: Stream events shared by both framings

    private func acceptRemoteStream(streamID: UInt64, key: UInt64, name: String?) -> MultiplexerStreamChannel? {
        guard let context else { return nil }
        guard session.mayAcceptRemote, let initializer = inboundStreamInitializer,
              streams.count < configuration.maxConcurrentStreams,
              streamsAwaitingAccept < configuration.acceptBacklog
        else {
            metrics.streamsRefused += 1
            sendReset(streamID: streamID, locallyInitiated: false, message: "refused")
            return nil
        }
        let stream = MultiplexerStreamChannel(session: self, parent: context.channel, key: key, streamID: streamID,
                                              isLocallyInitiated: false, name: name)
        // yamux: our first frame on the stream acknowledges it.
        stream.ackPending = configuration.framing == .yamux
        addStream(stream)
        streamsAwaitingAccept += 1
        stream.isInAcceptBacklog = true
        metrics.streamsAccepted += 1
        stream.register()
        let loop = context.eventLoop
        let bound = NIOLoopBound((self, stream), eventLoop: loop)
        initializer(stream).hop(to: loop).whenComplete { result in
            let (handler, stream) = bound.value
            guard !stream.tornDown else { return }
            handler.leaveAcceptBacklog(stream)
            switch result {
            case .success:
                if handler.configuration.framing == .yamux && stream.ackPending {
                    stream.ackPending = false
                    handler.writeYamuxHeader(YamuxHeader(type: .windowUpdate, flags: .ack,
                                                         streamID: UInt32(stream.streamID), length: 0))
                    handler.flushIfNeeded()
                }
                stream.activate()
            case .failure(let error):
                handler.resetStream(stream, message: nil, error: error)
            }
        }
        return stream
    }

    private func receiveFIN(_ stream: MultiplexerStreamChannel) {
        do {
            try stream.state.receiveFIN(streamID: stream.streamID)
        } catch {
            resetStream(stream, message: nil, error: error)
            return
        }
        stream.receiveEnd()
        if stream.state.isFinished { detach(stream) }
        queueDelivery(stream)
    }

    private func receiveReset(_ stream: MultiplexerStreamChannel, message: String?) {
        metrics.resetsReceived += 1
        stream.peerMaySendAfterDetach = false
        stream.state.reset()
        stream.tearDown(error: MultiplexerError.streamReset(message: message))
    }

    private func addStream(_ stream: MultiplexerStreamChannel) {
        streams[stream.key] = stream
        receiveWindowTotal += stream.receiveWindowTarget
        idleTask?.cancel()
        idleTask = nil
    }

    private func queueDelivery(_ stream: MultiplexerStreamChannel) {
        guard !stream.isQueuedForDelivery else { return }
        stream.isQueuedForDelivery = true
        pendingDelivery.append(stream)
    }

    // MARK: Output

    /// Sends queued stream data in turns while the channel is writable, then flushes once.
    private func writePending() {
        guard let context, !session.isClosed else { return }
        flushDeferred += 1
        while context.channel.isWritable, let stream = readyToWrite.popFirst() {
            stream.isQueuedForWrite = false
            if emitFrames(for: stream) {
                stream.isQueuedForWrite = true
                readyToWrite.append(stream)
            }
        }
        flushDeferred -= 1
        flushIfNeeded()
    }

    /// Writes up to one turn of `stream`'s queued data (and its FIN once the queue is empty). Returns
    /// whether it has more it could send now.
    private func emitFrames(for stream: MultiplexerStreamChannel) -> Bool {
        guard !stream.tornDown else { return false }
        var budget = configuration.sendChunkSize
        let yamux = configuration.framing == .yamux
        var sent = 0
        while budget > 0, let first = stream.pending.first {
            var allowed = min(first.data.readableBytes, budget, configuration.maxFrameSize)
            if yamux { allowed = min(allowed, stream.sendWindow) }
            if first.data.readableBytes > 0 && allowed == 0 { break }
            let index = stream.pending.startIndex
            guard let slice = stream.pending[index].data.readSlice(length: allowed) else { break }
            let done = stream.pending[index].data.readableBytes == 0
            let promise = done ? stream.pending[index].promise : nil
            if done { stream.pending.removeFirst() }
            if allowed > 0 || promise != nil {
                let withFIN = done && stream.pending.isEmpty && stream.finRequested && stream.state.canSend
                writeDataFrame(stream: stream, payload: slice, fin: withFIN, promise: promise)
                if withFIN { finSent(stream) }
            }
            budget -= allowed
            sent += allowed
            if yamux { stream.sendWindow -= allowed }
        }
        if sent > 0 {
            metrics.bytesSentOnStreams += sent
            stream.didSend(bytes: sent)
        }
        if stream.pending.isEmpty && stream.finRequested && stream.state.canSend && !stream.tornDown {
            let empty = ByteBuffer()
            writeDataFrame(stream: stream, payload: empty, fin: true, promise: nil)
            finSent(stream)
        }
        return !stream.tornDown && !stream.pending.isEmpty && (!yamux || stream.sendWindow > 0)
    }

    private func finSent(_ stream: MultiplexerStreamChannel) {
        _ = stream.state.sendFIN()
        stream.finRequested = false
        stream.finPromise?.succeed(())
        stream.finPromise = nil
        if stream.closeAfterFINRequested {
            stream.tearDown(error: nil)
        } else if stream.state.isFinished {
            // Over on the wire; but the peer's last bytes and its end may still wait for a read (they can
            // arrive in the same read as the window update that let our FIN out): the channel ends once
            // they are delivered.
            if stream.hasUndeliveredInput { detach(stream) } else { stream.tearDown(error: nil) }
        }
    }

    private func writeDataFrame(stream: MultiplexerStreamChannel, payload: ByteBuffer, fin: Bool,
                                promise: EventLoopPromise<Void>?) {
        switch configuration.framing {
        case .yamux:
            var flags: YamuxHeader.Flags = fin ? .fin : []
            if stream.ackPending { flags.insert(.ack); stream.ackPending = false }
            if payload.readableBytes == 0 {
                // A bare FIN travels as a window update, as hashicorp/yamux sends it.
                writeYamuxHeader(YamuxHeader(type: .windowUpdate, flags: flags, streamID: UInt32(stream.streamID), length: 0),
                                 promise: promise)
                return
            }
            writeYamuxHeader(YamuxHeader(type: .data, flags: flags, streamID: UInt32(stream.streamID),
                                         length: UInt32(payload.readableBytes)))
            write(payload, promise: promise)
        case .thaliMultiplex:
            let fromInitiator = stream.isLocallyInitiated
            if payload.readableBytes > 0 || !fin {
                writeThali(ThaliMultiplexHeader(streamID: stream.streamID,
                                                flag: .init(kind: .message, fromInitiator: fromInitiator),
                                                length: payload.readableBytes), body: payload, promise: fin ? nil : promise)
            }
            if fin {
                writeThali(ThaliMultiplexHeader(streamID: stream.streamID, flag: .init(kind: .close, fromInitiator: fromInitiator),
                                                length: 0), body: nil, promise: promise)
            }
        }
    }

    private func sendReset(streamID: UInt64, locallyInitiated: Bool, message: String?) {
        if let context, !context.channel.isWritable {
            controlBacklog += YamuxHeader.size + (message?.utf8.count ?? 0)
        }
        switch configuration.framing {
        case .yamux:
            writeYamuxHeader(YamuxHeader(type: .windowUpdate, flags: .rst, streamID: UInt32(truncatingIfNeeded: streamID), length: 0))
        case .thaliMultiplex:
            var body: ByteBuffer?
            if let message, let context {
                body = context.channel.allocator.buffer(string: message)
            }
            writeThali(ThaliMultiplexHeader(streamID: streamID, flag: .init(kind: .reset, fromInitiator: locallyInitiated),
                                            length: body?.readableBytes ?? 0), body: body)
        }
        flushIfNeeded()
    }

    private func sendPing(promise: EventLoopPromise<TimeAmount>?) {
        let id = nextPingID
        nextPingID &+= 1
        outstandingPings[id] = (NIODeadline.now(), promise)
        writeYamuxHeader(YamuxHeader(type: .ping, flags: .syn, streamID: 0, length: id))
        flushIfNeeded()
        // With keepalive on, every ping must be answered within the timeout.
        guard configuration.keepAliveInterval != nil, let context else { return }
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        context.eventLoop.scheduleTask(in: configuration.keepAliveTimeout) {
            let handler = bound.value
            if !handler.session.isClosed && handler.outstandingPings[id] != nil {
                handler.fail(MultiplexerError.keepAliveTimeout)
            }
        }
    }

    private func writeYamuxHeader(_ header: YamuxHeader, promise: EventLoopPromise<Void>? = nil) {
        guard let context else { promise?.fail(MultiplexerError.sessionClosed); return }
        var buffer = context.channel.allocator.buffer(capacity: YamuxHeader.size)
        header.write(to: &buffer)
        write(buffer, promise: promise)
    }

    private func writeThali(_ header: ThaliMultiplexHeader, body: ByteBuffer?, promise: EventLoopPromise<Void>? = nil) {
        guard let context else { promise?.fail(MultiplexerError.sessionClosed); return }
        var buffer = context.channel.allocator.buffer(capacity: 2 * ThaliMultiplexHeader.maxVarintLength)
        header.write(to: &buffer)
        if let body, body.readableBytes > 0 {
            write(buffer, promise: nil)
            write(body, promise: promise)
        } else {
            write(buffer, promise: promise)
        }
    }

    private func write(_ buffer: ByteBuffer, promise: EventLoopPromise<Void>?) {
        guard let context else { promise?.fail(MultiplexerError.sessionClosed); return }
        metrics.bytesSent += buffer.readableBytes
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
    /// the channel closes.
    private func fail(_ error: Error) {
        if configuration.framing == .yamux, session.sendGoAway() {
            let code: YamuxHeader.GoAwayCode
            switch error as? MultiplexerError {
            case .keepAliveTimeout?, .idleTimeout?: code = .normal
            case .remoteGoAway?: code = .normal
            case .some: code = .protocolError; metrics.protocolErrors += 1
            case nil: code = .internalError
            }
            writeYamuxHeader(YamuxHeader(type: .goAway, streamID: 0, length: code.rawValue))
        }
        needsFlush = false
        context?.flush()
        guard session.close() else { return }
        stopTimers()
        tearDownAllStreams(error: error)
        context?.fireErrorCaught(error)
        context?.close(promise: nil)
    }

    private func tearDownAllStreams(error: Error) {
        for stream in Array(streams.values) { stream.tearDown(error: error) }
        for (_, ping) in outstandingPings { ping.promise?.fail(error) }
        outstandingPings.removeAll()
        readyToWrite.removeAll()
        pendingDelivery.removeAll()
    }

    private func start() {
        guard !started, let context else { return }
        started = true
        scheduleIdleTimeout()
        guard configuration.framing == .yamux else { return }
        sendPing(promise: nil)  // measures the round-trip time for window auto-tuning
        if let interval = configuration.keepAliveInterval {
            let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
            keepAliveTask = context.eventLoop.scheduleRepeatedTask(initialDelay: interval, delay: interval) { _ in
                bound.value.keepAlive()
            }
        }
    }

    private func keepAlive() {
        guard !session.isClosed else { return }
        sendPing(promise: nil)
    }

    private func scheduleIdleTimeout() {
        guard let timeout = configuration.idleTimeout, let context, idleTask == nil, !session.isClosed else { return }
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        idleTask = context.eventLoop.scheduleTask(in: timeout) {
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
