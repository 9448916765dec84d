import NIOConcurrencyHelpers
import NIOCore

/// Sits at the end of an authenticated connection's pipeline (after the multiplexer) and reports, once,
/// why the connection ended: the first error any handler raised (TLS, a multiplexer protocol error), or
/// a plain close. So every session the peer reports as connected also gets an end with its reason.
final class ConnectionEndRecorder: ChannelInboundHandler, Sendable {
    typealias InboundIn = Any

    private let firstError = NIOLockedValueBox<(any Error)?>(nil)
    private let ended = NIOLockedValueBox(false)
    private let onEnd: @Sendable (_ error: (any Error)?) -> Void

    /// A recorder that calls `onEnd` once, with the first error on the connection or nil for a plain close.
    init(onEnd: @escaping @Sendable (_ error: (any Error)?) -> Void) {
        self.onEnd = onEnd
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        firstError.withLockedValue { if $0 == nil { $0 = error } }
        context.fireErrorCaught(error)
    }

    func channelInactive(context: ChannelHandlerContext) {
        report()
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        report()
    }

    private func report() {
        guard ended.withLockedValue({ ended in defer { ended = true }; return !ended }) else { return }
        onEnd(firstError.withLockedValue { $0 })
    }
}
