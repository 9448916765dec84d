import NIOConcurrencyHelpers
import NIOCore
import TCPMultiplexer

/// Puts the delivery protocol on a byte-stream channel (a TCP connection, or a multiplexer stream inside
/// PSK-TLS): an idle timeout, the frame decoder and encoder, and an async wrapper for the session drivers.
package enum DeliveryChannel {
    /// The async channel a ``DeliverySender`` or ``DeliveryReceiver`` runs on.
    package typealias AsyncFrames = NIOAsyncChannel<DeliveryFrame, DeliveryFrame>

    /// Adds the delivery handlers to `channel` and wraps it. Call it on the channel's event loop (e.g. in a
    /// bootstrap's channel initializer). A data frame's payload comes in pieces as it arrives unless
    /// `dataDelivery` asks for whole frames (``DeliveryFrameDecoder``).
    package static func configureSynchronously(_ channel: any Channel, limits: DeliveryLimits,
                                              dataDelivery: DeliveryFrameDecoder.DataDelivery = .piecesAsTheyArrive) throws -> AsyncFrames {
        channel.eventLoop.preconditionInEventLoop()
        try channel.pipeline.syncOperations.addHandlers([
            IdleStateHandler(allTimeout: TimeAmount(limits.idleTimeout)),
            IdleTimeoutHandler(timeout: TimeAmount(limits.idleTimeout)),
            ByteToMessageHandler(DeliveryFrameDecoder(limits: limits, dataDelivery: dataDelivery)),
            DeliveryFrameEncoder(),
        ])
        let backPressure = NIOAsyncSequenceProducerBackPressureStrategies.HighLowWatermark(
            lowWatermark: max(1, limits.inboundFrames / 4), highWatermark: limits.inboundFrames)
        return try AsyncFrames(wrappingChannelSynchronously: channel, configuration: .init(backPressureStrategy: backPressure))
    }

    /// Adds the delivery handlers to `channel` (from any thread) and wraps it. Only for a channel whose
    /// peer cannot send yet; for a multiplexer stream use ``openStream(on:limits:dataDelivery:prepare:)``.
    package static func configure(_ channel: any Channel, limits: DeliveryLimits,
                                 dataDelivery: DeliveryFrameDecoder.DataDelivery = .piecesAsTheyArrive) -> EventLoopFuture<AsyncFrames> {
        channel.eventLoop.submit { try configureSynchronously(channel, limits: limits, dataDelivery: dataDelivery) }
    }

    /// Opens a stream on `session` and returns it configured for delivery (the connecting side, which
    /// receives). The handlers are installed before the stream is live: the sender answers the open
    /// with its first frame at once, and bytes that reach a stream's pipeline before its handlers are
    /// dropped, which would leave the session waiting for a frame already lost.
    ///
    /// `prepare` runs first on the stream's event loop, before the delivery handlers are added (to put
    /// a stream header's handler in front of them, say).
    package static func openStream(on session: MultiplexerSession, limits: DeliveryLimits,
                                  dataDelivery: DeliveryFrameDecoder.DataDelivery = .piecesAsTheyArrive,
                                  prepare: (@Sendable (Channel) throws -> Void)? = nil) async throws -> AsyncFrames {
        let configured = NIOLockedValueBox<AsyncFrames?>(nil)
        _ = try await session.openStream(initializer: { stream in
            stream.eventLoop.makeCompletedFuture {
                try prepare?(stream)
                let frames = try configureSynchronously(stream, limits: limits, dataDelivery: dataDelivery)
                configured.withLockedValue { $0 = frames }
            }
        }).get()
        guard let frames = configured.withLockedValue({ $0 }) else { throw MultiplexerError.sessionClosed }
        return frames
    }
}

extension DeliveryChannel {
    /// The longest a side that reports an error waits for the other side to end the stream before it
    /// closes anyway (the report's write included: a peer that reads nothing cannot hold the session).
    package static let errorReportLinger: TimeAmount = .seconds(2)

    /// Sends `report` (an `error` frame) as the session's last frame so that the other side reads it
    /// [NODE-1.24]: a close while the other side may still send resets a multiplexer stream, and a reset
    /// drops what its reader has not taken yet (the conformance suite saw the report lost in about two
    /// runs in five). So the output ends after the report (FIN), and the stream closes when the other
    /// side ends its own, or after ``errorReportLinger``.
    static func sendLast(_ report: DeliveryFrame, on channel: any Channel) async {
        let linger = channel.eventLoop.scheduleTask(in: errorReportLinger) { channel.close(promise: nil) }
        defer { linger.cancel() }
        do {
            try await channel.writeAndFlush(report).get()
            try await channel.close(mode: .output).get()
        } catch {
            return
        }
        try? await channel.closeFuture.get()
    }
}

/// Nothing moved in either direction for ``DeliveryLimits/idleTimeout``; the session was closed.
public struct DeliveryIdleTimeout: Error, Hashable, CustomStringConvertible {
    /// The timeout that passed.
    public let timeout: Duration
    public var description: String { "nothing sent or received for \(timeout.wholeMilliseconds) ms" }

    /// The timeout that passed was `timeout`.
    public init(timeout: Duration) { self.timeout = timeout }
}

/// Turns an idle event (nothing read and nothing written for the timeout) into a ``DeliveryIdleTimeout``
/// error and closes the channel. Both directions count: a sender streaming a large file reads nothing for
/// a long time, and a stalled peer stops both.
final class IdleTimeoutHandler: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    let timeout: TimeAmount

    init(timeout: TimeAmount) { self.timeout = timeout }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let idle = event as? IdleStateHandler.IdleStateEvent, idle == .all {
            context.fireErrorCaught(DeliveryIdleTimeout(timeout: Duration(timeout)))
            context.close(promise: nil)
            return
        }
        context.fireUserInboundEventTriggered(event)
    }
}
