import NIOCore

/// Puts the delivery protocol on a byte-stream channel (a TCP connection, or a multiplexer stream inside
/// PSK-TLS): an idle timeout, the frame decoder and encoder, and an async wrapper for the session drivers.
public enum DeliveryChannel {
    /// The async channel a ``DeliverySender`` or ``DeliveryReceiver`` runs on.
    public typealias AsyncFrames = NIOAsyncChannel<DeliveryFrame, DeliveryFrame>

    /// Adds the delivery handlers to `channel` and wraps it. Call it on the channel's event loop (e.g. in a
    /// bootstrap's channel initializer).
    public static func configureSynchronously(_ channel: any Channel, limits: DeliveryLimits) throws -> AsyncFrames {
        channel.eventLoop.preconditionInEventLoop()
        try channel.pipeline.syncOperations.addHandlers([
            IdleStateHandler(readTimeout: limits.idleTimeout),
            IdleTimeoutHandler(timeout: limits.idleTimeout),
            ByteToMessageHandler(DeliveryFrameDecoder(limits: limits)),
            MessageToByteHandler(DeliveryFrameEncoder()),
        ])
        return try AsyncFrames(wrappingChannelSynchronously: channel)
    }

    /// Adds the delivery handlers to `channel` (from any thread) and wraps it.
    public static func configure(_ channel: any Channel, limits: DeliveryLimits) -> EventLoopFuture<AsyncFrames> {
        channel.eventLoop.submit { try configureSynchronously(channel, limits: limits) }
    }
}

/// The peer sent nothing for ``DeliveryLimits/idleTimeout``; the session was closed.
public struct DeliveryIdleTimeout: Error, Hashable, CustomStringConvertible {
    /// The timeout that passed.
    public let timeout: TimeAmount
    public var description: String { "no data from the peer for \(timeout.nanoseconds / 1_000_000) ms" }
}

/// Turns a read-idle event into a ``DeliveryIdleTimeout`` error and closes the channel.
final class IdleTimeoutHandler: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    let timeout: TimeAmount

    init(timeout: TimeAmount) { self.timeout = timeout }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let idle = event as? IdleStateHandler.IdleStateEvent, idle == .read {
            context.fireErrorCaught(DeliveryIdleTimeout(timeout: timeout))
            context.close(promise: nil)
            return
        }
        context.fireUserInboundEventTriggered(event)
    }
}
