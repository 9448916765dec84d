import NIOCore
import ThaliMutants

/// The opener's side of a marked stream, first in its pipeline: writes the ``StreamHeader`` as the
/// stream goes live (before any byte of the handlers behind it), lets the stream's own bytes follow at
/// once without waiting for the answer (no round trip added), and takes the ``StreamStatus`` off the
/// front of what comes back. On acceptance it leaves the pipeline; on a refusal, a malformed or late
/// status, or an end before one, it fires the typed error (``StreamRefusal`` or ``StreamHeaderError``)
/// down the pipeline, reports it to `failed`, and closes the stream.
final class StreamHeaderWriter: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let header: StreamHeader
    private let timeout: TimeAmount
    private let failed: @Sendable (any Error) -> Void
    private var received = ByteBuffer()
    private var receivedCount = 0
    private var started = false
    private var done = false
    private var timer: Scheduled<Void>?

    /// Writes `header`; waits at most `timeout` for the status.
    init(header: StreamHeader, timeout: TimeAmount, failed: @escaping @Sendable (any Error) -> Void) {
        self.header = header
        self.timeout = timeout
        self.failed = failed
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { start(context: context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        start(context: context)
        context.fireChannelActive()
    }

    private func start(context: ChannelHandlerContext) {
        guard !started else { return }
        started = true
        var bytes = context.channel.allocator.buffer(capacity: StreamHeader.maximumEncodedLength)
        header.encode(into: &bytes)
        context.writeAndFlush(wrapOutboundOut(bytes), promise: nil)
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        timer = context.eventLoop.scheduleTask(in: timeout) {
            let (handler, context) = bound.value
            handler.fail(StreamHeaderError.statusTimedOut(milliseconds: handler.timeout.nanoseconds / 1_000_000), context: context)
        }
        context.read()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !done else { return context.fireChannelRead(data) }
        var bytes = unwrapInboundIn(data)
        receivedCount += bytes.readableBytes
        received.writeBuffer(&bytes)
        let status: StreamStatus?
        do {
            status = try StreamStatus.decode(from: &received)
        } catch {
            return fail(error, context: context)
        }
        switch status {
        case nil:
            return
        case .accepted:
            done = true
            timer?.cancel()
            if Mutant.streamsOpenerKeepsStatus.isActive { received.moveReaderIndex(to: 0) }
            context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
        case .refused(let refusal):
            fail(refusal, context: context)
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if !done { context.read() }
        context.fireChannelReadComplete()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if !done, case ChannelEvent.inputClosed = event {
            return fail(StreamHeaderError.endedBeforeStatus(received: receivedCount), context: context)
        }
        context.fireUserInboundEventTriggered(event)
    }

    func channelInactive(context: ChannelHandlerContext) {
        if !done { fail(StreamHeaderError.endedBeforeStatus(received: receivedCount), context: context) }
        context.fireChannelInactive()
    }

    func removeHandler(context: ChannelHandlerContext, removalToken: ChannelHandlerContext.RemovalToken) {
        // Bytes that came with the status are the stream's own: they go on, in order.
        if received.readableBytes > 0 {
            let rest = received
            received = ByteBuffer()
            context.fireChannelRead(wrapInboundOut(rest))
            context.fireChannelReadComplete()
        }
        context.leavePipeline(removalToken: removalToken)
    }

    private func fail(_ error: any Error, context: ChannelHandlerContext) {
        guard !done else { return }
        done = true
        timer?.cancel()
        failed(error)
        context.fireErrorCaught(error)
        context.close(promise: nil)
    }
}

/// The accepting side of a marked stream, first in its pipeline: reads the ``StreamHeader`` (at most
/// ``StreamHeader/maximumEncodedLength`` bytes, within `timeout`), asks `dispatch` to set the stream up
/// for its kind (it adds its handlers behind this one), writes the ``StreamStatus`` before any byte of
/// theirs (their earlier writes wait here), then leaves, handing on the bytes that came after the
/// header. A refusal, a bad header, a late one or an end before one is answered with a refusal status,
/// reported to `refused`, and the stream's output ends (it closes when the opener's does, or after
/// `timeout`).
final class StreamHeaderReader: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// Sets `channel` up for `kind` and answers whether it is served; runs on the event loop.
    typealias Dispatch = (StreamKind, Channel) -> EventLoopFuture<StreamStatus>

    private enum State {
        case awaitingHeader
        case dispatching(StreamKind)
        /// Accepted: the stream is its kind's; whatever still reaches this handler (it is leaving the
        /// pipeline) goes on to them.
        case accepted
        /// Refused: the stream is closing, and what the opener still sends is dropped.
        case refused
    }

    private let timeout: TimeAmount
    private let dispatch: Dispatch
    private let refused: @Sendable (StreamKind?, StreamRefusal) -> Void
    private var state = State.awaitingHeader
    private var received = ByteBuffer()
    private var receivedCount = 0
    private var inputClosed = false
    private var readPending = false
    /// The stream's half-closure option before the reader turned it on (restored when it accepts).
    private var halfClosureBefore: Bool?
    private var heldWrites: [(NIOAny, EventLoopPromise<Void>?)] = []
    private var timer: Scheduled<Void>?

    init(timeout: TimeAmount, dispatch: @escaping Dispatch,
         refused: @escaping @Sendable (StreamKind?, StreamRefusal) -> Void) {
        self.timeout = timeout
        self.dispatch = dispatch
        self.refused = refused
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { start(context: context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        start(context: context)
        context.fireChannelActive()
    }

    private func start(context: ChannelHandlerContext) {
        guard timer == nil, case .awaitingHeader = state else { return }
        // The opener's FIN before a whole header must reach this handler as the end of its input (to be
        // refused bad-header, with a status), not close the stream unanswered; the kind's handlers get
        // the stream's own setting back when it is accepted.
        if let options = context.channel.syncOptions {
            halfClosureBefore = try? options.getOption(.allowRemoteHalfClosure)
            try? options.setOption(.allowRemoteHalfClosure, value: true)
        }
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        timer = context.eventLoop.scheduleTask(in: timeout) {
            let (handler, context) = bound.value
            guard case .awaitingHeader = handler.state else { return }
            handler.refuse(nil, .badHeader,
                           reason: StreamHeaderError.headerTimedOut(milliseconds: handler.timeout.nanoseconds / 1_000_000).description,
                           context: context)
        }
        context.read()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var bytes = unwrapInboundIn(data)
        switch state {
        case .accepted:
            return context.fireChannelRead(wrapInboundOut(bytes))
        case .refused:
            return
        case .dispatching:
            // At most what one read brought: no further read is asked for until the stream is set up.
            received.writeBuffer(&bytes)
            return
        case .awaitingHeader:
            receivedCount += bytes.readableBytes
            received.writeBuffer(&bytes)
        }
        let header: StreamHeader?
        do {
            header = try StreamHeader.decode(from: &received)
        } catch {
            return refuse(nil, Mutant.streamsBadHeaderAsUnknownKind.isActive ? .unknownKind : .badHeader, reason: error.description, context: context)
        }
        guard let header else { return }
        timer?.cancel()
        state = .dispatching(header.kind)
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        dispatch(header.kind, context.channel).hop(to: context.eventLoop).whenComplete { result in
            let (handler, context) = bound.value
            switch result {
            case .success(.accepted): handler.accept(context: context)
            case .success(.refused(let refusal)): handler.refuse(header.kind, refusal.code, reason: refusal.reason, context: context)
            case .failure(let error): handler.refuse(header.kind, .notServed, reason: "\(error)", context: context)
            }
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if case .awaitingHeader = state { context.read() }
        // The handlers behind see reads only once the stream is theirs.
        if case .accepted = state { context.fireChannelReadComplete() }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard case ChannelEvent.inputClosed = event else { return context.fireUserInboundEventTriggered(event) }
        switch state {
        case .awaitingHeader:
            refuse(nil, .badHeader, reason: StreamHeaderError.endedBeforeHeader(received: receivedCount).description, context: context)
        case .dispatching:
            inputClosed = true
        case .accepted:
            context.fireUserInboundEventTriggered(event)
        case .refused:
            break
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        timer?.cancel()
        context.fireChannelInactive()
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        switch state {
        case .awaitingHeader, .dispatching: heldWrites.append((data, promise))
        case .accepted: context.write(data, promise: promise)
        case .refused: promise?.fail(ChannelError.outputClosed)
        }
    }

    func flush(context: ChannelHandlerContext) {
        if case .accepted = state { context.flush() }
    }

    func read(context: ChannelHandlerContext) {
        // While the kind's handlers are being set up, the stream reads nothing more: what the opener
        // sends meanwhile waits in the multiplexer's window, not here.
        if case .dispatching = state { readPending = true } else { context.read() }
    }

    private func accept(context: ChannelHandlerContext) {
        guard case .dispatching(let kind) = state else { return }
        state = .accepted
        // An app stream's setup asked for half-closure (the opener's FIN ends only its input, so the app
        // can still answer, as over TCP): it keeps it. Putting the setting from before back closed the
        // stream at the opener's FIN, and the reply was lost. Other kinds get their own setting back.
        if let before = halfClosureBefore, kind.appProtocol == nil {
            try? context.channel.syncOptions?.setOption(.allowRemoteHalfClosure, value: before)
        }
        writeStatus(.accepted, context: context)
        let held = heldWrites
        heldWrites = []
        for (data, promise) in held { context.write(data, promise: promise) }
        context.flush()
        context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
    }

    private func refuse(_ kind: StreamKind?, _ code: StreamRefusal.Code, reason: String, context: ChannelHandlerContext) {
        switch state {
        case .accepted, .refused: return
        case .awaitingHeader, .dispatching: state = .refused
        }
        timer?.cancel()
        let refusal = StreamRefusal(code, reason: reason)
        refused(kind, refusal)
        for (_, promise) in heldWrites { promise?.fail(refusal) }
        heldWrites = []
        writeStatus(.refused(refusal), context: context)
        context.flush()
        // The answer, then the end of our output: a full close now would reset the stream (the opener may
        // still be sending) and lose the answer. The opener closes on reading it; one that does not is
        // cut off after the header timeout.
        context.close(mode: .output, promise: nil)
        let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
        context.eventLoop.scheduleTask(in: timeout) { bound.value.close(promise: nil) }
        context.read()
    }

    private func writeStatus(_ status: StreamStatus, context: ChannelHandlerContext) {
        var bytes = context.channel.allocator.buffer(capacity: StreamStatus.maximumEncodedLength)
        status.encode(into: &bytes)
        context.write(wrapOutboundOut(bytes), promise: nil)
    }

    func removeHandler(context: ChannelHandlerContext, removalToken: ChannelHandlerContext.RemovalToken) {
        if received.readableBytes > 0 {
            let rest = received
            received = ByteBuffer()
            context.fireChannelRead(wrapInboundOut(rest))
            context.fireChannelReadComplete()
        }
        if inputClosed { context.fireUserInboundEventTriggered(ChannelEvent.inputClosed) }
        if readPending { context.read() }
        context.leavePipeline(removalToken: removalToken)
    }
}
