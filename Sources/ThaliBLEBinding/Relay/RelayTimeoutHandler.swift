import NIOCore

/// Bounds how long an incoming Bluetooth relay may hold one of the server's few slots without using it:
/// the client must send more than its handshake octet within `firstBytesTimeout` (a client that says
/// hello and then nothing is cut quickly), and a relay on which nothing moves either way for
/// `idleTimeout` is closed. Sits first in the Bluetooth channel's pipeline, so it sees every byte.
final class RelayTimeoutHandler: ChannelDuplexHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// Why a relay was cut.
    enum Reason: Sendable {
        case silentAfterHandshake
        case idle
    }

    private let firstBytesTimeout: TimeAmount
    private let idleTimeout: TimeAmount
    private let onTimeout: @Sendable (Reason) -> Void
    private var inboundBytes = 0
    private var lastActivity = NIODeadline.now()
    private var firstBytesTask: Scheduled<Void>?
    private var idleTask: Scheduled<Void>?

    init(firstBytesTimeout: TimeAmount, idleTimeout: TimeAmount, onTimeout: @escaping @Sendable (Reason) -> Void) {
        self.firstBytesTimeout = firstBytesTimeout
        self.idleTimeout = idleTimeout
        self.onTimeout = onTimeout
    }

    func handlerAdded(context: ChannelHandlerContext) {
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        firstBytesTask = context.eventLoop.scheduleTask(in: firstBytesTimeout) {
            let (handler, context) = bound.value
            // The handshake is one octet; a relay that carried nothing after it is cut.
            guard handler.inboundBytes < 2 else { return }
            handler.onTimeout(.silentAfterHandshake)
            context.close(promise: nil)
        }
        scheduleIdleCheck(context: context, after: idleTimeout)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        firstBytesTask?.cancel()
        idleTask?.cancel()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        inboundBytes += unwrapInboundIn(data).readableBytes
        lastActivity = .now()
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        lastActivity = .now()
        context.write(data, promise: promise)
    }

    private func scheduleIdleCheck(context: ChannelHandlerContext, after delay: TimeAmount) {
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        idleTask = context.eventLoop.scheduleTask(in: delay) {
            let (handler, context) = bound.value
            let quiet = NIODeadline.now() - handler.lastActivity
            if quiet >= handler.idleTimeout {
                handler.onTimeout(.idle)
                context.close(promise: nil)
            } else {
                handler.scheduleIdleCheck(context: context, after: handler.idleTimeout - quiet)
            }
        }
    }
}
