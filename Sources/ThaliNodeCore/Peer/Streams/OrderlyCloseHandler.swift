import NIOCore

/// Makes an app stream's full close orderly, as TCP's is: what was written is delivered, then the end.
///
/// A multiplexer stream closed while the other side may still send is reset (RST), and a reset drops
/// what the other side had not read yet: an app that wrote its last lines and returned from
/// `executeThenClose` lost them. This handler, first in the stream's pipeline, turns that close into a
/// half-close (FIN after the queued writes), drops what still arrives, and closes the stream once the
/// other side ends its output too (a clean close, no reset), or after `linger`, when it resets it.
final class OrderlyCloseHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private enum State {
        /// Reading and writing.
        case open
        /// The other side ended its output (our reads are over; writes go on).
        case inputEnded
        /// The app closed while the other side could still send: our FIN is on its way; waiting for
        /// the other side's end, or the linger's.
        case lingering(Scheduled<Void>)
        /// The close went to the stream.
        case closed
    }

    private var state = State.open
    private let linger: TimeAmount

    init(linger: TimeAmount) {
        self.linger = linger
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard case .lingering = state else { return context.fireChannelRead(data) }
        // Nobody reads any more: dropped, as a closed TCP socket's kernel would.
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case ChannelEvent.inputClosed = event {
            switch state {
            case .open:
                state = .inputEnded
            case .lingering(let timer):
                timer.cancel()
                state = .closed
                context.close(mode: .all, promise: nil)  // both sides done: a clean close
                return
            case .inputEnded, .closed:
                break
            }
        }
        context.fireUserInboundEventTriggered(event)
    }

    func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        guard mode == .all, case .open = state else {
            if mode == .all { state = .closed }
            return context.close(mode: mode, promise: promise)
        }
        // Our output ends after what was written (an output already ended makes this fail: ignored).
        context.close(mode: .output, promise: nil)
        let timer = context.eventLoop.assumeIsolated().scheduleTask(in: linger) {
            guard case .lingering = self.state else { return }
            self.state = .closed
            context.close(mode: .all, promise: nil)  // the other side never ended: reset
        }
        state = .lingering(timer)
        // The close is done as far as the app goes; the stream itself goes when it ends.
        promise?.succeed(())
    }

    func channelInactive(context: ChannelHandlerContext) {
        if case .lingering(let timer) = state { timer.cancel() }
        state = .closed
        context.fireChannelInactive()
    }
}
