import Foundation
import NIOCore
import ThaliBeacons
import ThaliNodeCore
import ThaliSupport

/// What came back on a marked stream the suite opened, first thing (spec/node.md, "Stream marking").
enum MarkedStreamAnswer: Sendable, Equatable, CustomStringConvertible {
    /// A well-formed status.
    case status(StreamStatus)
    /// Bytes that cannot start a status.
    case malformed(StreamHeaderError)
    /// The stream ended after `received` bytes, before a whole status.
    case ended(received: Int)
    /// No whole status within the timeout, after `received` bytes.
    case timedOut(received: Int)

    /// The refusal code, when it is one.
    var refusalCode: StreamRefusal.Code? {
        if case .status(.refused(let refusal)) = self { return refusal.code }
        return nil
    }

    var description: String {
        switch self {
        case .status(.accepted): "status accepted"
        case .status(.refused(let refusal)): "status \(refusal.code.rawValue) (\(refusal.code)): \(refusal.reason)"
        case .malformed(let error): "a malformed status: \(error)"
        case .ended(let received): "the stream ended after \(received) bytes, before a status"
        case .timedOut(let received): "no whole status within the timeout (\(received) bytes)"
        }
    }
}

/// The suite's side of a marked stream it opens, first in the stream's pipeline: writes `header` (any
/// bytes, malformed ones included; with `endOutput` it then ends its output) as the stream goes live, and
/// reads what comes back until a status decodes, the bytes cannot be one, the stream ends or `timeout`
/// passes: that is `answer`. An accepted stream's later bytes go on to the handlers behind it (it leaves
/// the pipeline); a refused one's are counted and dropped, and `ended` succeeds when the stream's input
/// ends (the refusing side ended its output) or fails after a second `timeout`. Only moves bytes.
final class MarkedStreamOpener: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    /// Raised in `ended` when the stream's input did not end within the timeout.
    struct StillOpen: Error {}

    private let header: [UInt8]
    private let endOutput: Bool
    private let timeout: TimeAmount
    private let answer: EventLoopPromise<MarkedStreamAnswer>
    private let ended: EventLoopPromise<Void>
    private var received = ByteBuffer()
    private var receivedCount = 0
    private var answered: MarkedStreamAnswer?
    private var started = false
    private var timer: Scheduled<Void>?

    init(header: [UInt8], endOutput: Bool = false, timeout: TimeAmount, answer: EventLoopPromise<MarkedStreamAnswer>,
         ended: EventLoopPromise<Void>) {
        self.header = header
        self.endOutput = endOutput
        self.timeout = timeout
        self.answer = answer
        self.ended = ended
    }

    // The header goes out as the stream goes live, whether the handler came before or after that.
    func channelActive(context: ChannelHandlerContext) {
        sendHeader(context: context)
        context.fireChannelActive()
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { sendHeader(context: context) }
    }

    private func sendHeader(context: ChannelHandlerContext) {
        guard !started else { return }
        started = true
        context.writeAndFlush(NIOAny(context.channel.allocator.buffer(bytes: header)), promise: nil)
        if endOutput { context.close(mode: .output, promise: nil) }
        timer = context.schedule(self, in: timeout) { $0.settle(.timedOut(received: $0.receivedCount), context: $1) }
        context.read()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var bytes = unwrapInboundIn(data)
        switch answered {
        case .status(.accepted)?:
            return context.fireChannelRead(data)
        case .some:
            return  // a refused or broken stream: what follows is not graded
        case nil:
            receivedCount += bytes.readableBytes
            received.writeBuffer(&bytes)
        }
        do {
            if let status = try StreamStatus.decode(from: &received) { settle(.status(status), context: context) }
        } catch {
            settle(.malformed(error), context: context)
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard case ChannelEvent.inputClosed = event else { return context.fireUserInboundEventTriggered(event) }
        if case .status(.accepted)? = answered { return context.fireUserInboundEventTriggered(event) }
        inputEnded(context: context)
    }

    func channelInactive(context: ChannelHandlerContext) {
        inputEnded(context: context)
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        timer?.cancel()
        answer.succeed(.ended(received: receivedCount))  // no-ops once settled
        ended.succeed(())
    }

    private func inputEnded(context: ChannelHandlerContext) {
        if answered == nil { settle(.ended(received: receivedCount), context: context) }
        timer?.cancel()
        ended.succeed(())
    }

    /// Records the answer; an acceptance hands the stream to the handlers behind, anything else waits
    /// (bounded) for the stream's input to end.
    private func settle(_ outcome: MarkedStreamAnswer, context: ChannelHandlerContext) {
        guard answered == nil else {
            if case .timedOut = outcome { ended.fail(StillOpen()) }  // the second timeout: the input never ended
            return
        }
        answered = outcome
        timer?.cancel()
        answer.succeed(outcome)
        if case .status(.accepted) = outcome {
            context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
            return
        }
        received.clear()
        timer = context.schedule(self, in: timeout) { $0.settle(.timedOut(received: $0.receivedCount), context: $1) }
    }

    func removeHandler(context: ChannelHandlerContext, removalToken: ChannelHandlerContext.RemovalToken) {
        context.leavePipeline(handingOn: &received, removalToken: removalToken)
    }
}

/// The suite's side of a marked stream the implementation opens, first in the stream's pipeline: reads
/// its header (at most ``StreamHeader/maximumEncodedLength`` bytes, within `timeout`), asks `decide` for
/// the status, and writes it before anything else. An accepted stream is set up by `accepted` (which adds
/// the handlers behind this one) and this handler leaves, handing on the bytes after the header; a
/// refused one has its output ended, and what the implementation still sends is dropped until it closes
/// the stream. `seen` gets the header (or why there was none) once. Only moves bytes.
final class MarkedStreamAcceptor: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// What the implementation sent as its header.
    enum Header: Sendable, Equatable, CustomStringConvertible {
        /// A well-formed header.
        case kind(StreamKind)
        /// Bytes that cannot start a header.
        case malformed(StreamHeaderError, first: [UInt8])
        /// The stream ended, or the timeout passed, after `received` bytes.
        case missing(StreamHeaderError)

        var description: String {
            switch self {
            case .kind(let kind): "header \(kind.name)"
            case .malformed(let error, let first): "a malformed header (\(error)), first bytes \(Hex.encode(first))"
            case .missing(let error): "no header: \(error)"
            }
        }
    }

    private let timeout: TimeAmount
    private let decide: @Sendable (Header) -> StreamStatus
    private let accepted: (Channel) throws -> Void
    private let seen: @Sendable (Header, StreamStatus) -> Void
    private var received = ByteBuffer()
    private var receivedCount = 0
    private var done = false
    private var timer: Scheduled<Void>?

    init(timeout: TimeAmount, decide: @escaping @Sendable (Header) -> StreamStatus, accepted: @escaping (Channel) throws -> Void,
         seen: @escaping @Sendable (Header, StreamStatus) -> Void) {
        self.timeout = timeout
        self.decide = decide
        self.accepted = accepted
        self.seen = seen
    }

    func handlerAdded(context: ChannelHandlerContext) {
        timer = context.schedule(self, in: timeout) { $0.answer(.missing(.headerTimedOut(milliseconds: $0.timeout.nanoseconds / 1_000_000)), context: $1) }
        context.read()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !done else { return }
        var bytes = unwrapInboundIn(data)
        receivedCount += bytes.readableBytes
        received.writeBuffer(&bytes)
        do {
            if let header = try StreamHeader.decode(from: &received) { answer(.kind(header.kind), context: context) }
        } catch {
            let first = received.getBytes(at: received.readerIndex, length: min(16, received.readableBytes)) ?? []
            answer(.malformed(error, first: first), context: context)
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if !done, case ChannelEvent.inputClosed = event {
            return answer(.missing(.endedBeforeHeader(received: receivedCount)), context: context)
        }
        context.fireUserInboundEventTriggered(event)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        timer?.cancel()
    }

    private func answer(_ header: Header, context: ChannelHandlerContext) {
        guard !done else { return }
        done = true
        timer?.cancel()
        let status = decide(header)
        seen(header, status)
        var bytes = context.channel.allocator.buffer(capacity: StreamStatus.maximumEncodedLength)
        status.encode(into: &bytes)
        context.writeAndFlush(wrapOutboundOut(bytes), promise: nil)
        guard case .accepted = status else {
            received.clear()
            context.close(mode: .output, promise: nil)
            timer = context.schedule(self, in: timeout) { $1.close(promise: nil) }
            return
        }
        do {
            try accepted(context.channel)
            context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
        } catch {
            context.close(promise: nil)
        }
    }

    func removeHandler(context: ChannelHandlerContext, removalToken: ChannelHandlerContext.RemovalToken) {
        context.leavePipeline(handingOn: &received, removalToken: removalToken)
    }
}

extension ChannelHandlerContext {
    /// Runs `body` with `handler` and this context on the event loop after `delay` (a handler's timeout).
    func schedule<Handler: AnyObject>(_ handler: Handler, in delay: TimeAmount,
                                      _ body: @escaping (Handler, ChannelHandlerContext) -> Void) -> Scheduled<Void> {
        let bound = NIOLoopBound((handler, self, body), eventLoop: eventLoop)
        return eventLoop.scheduleTask(in: delay) { bound.value.2(bound.value.0, bound.value.1) }
    }

    /// Hands `rest`, bytes a header or status came with (the stream's own), to the handlers behind, in
    /// order, and leaves the pipeline.
    func leavePipeline(handingOn rest: inout ByteBuffer, removalToken: RemovalToken) {
        if rest.readableBytes > 0 {
            let bytes = rest
            rest = ByteBuffer()
            fireChannelRead(NIOAny(bytes))
            fireChannelReadComplete()
        }
        leavePipeline(removalToken: removalToken)
    }
}
