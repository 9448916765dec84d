import NIOCore

/// Tells a TLS connection from an HTTP request by its first byte, on a port that serves both: 0x16 is a
/// TLS handshake record's content type, and no HTTP method starts with it. Waits for that byte, lets the
/// chosen initializer add its handlers behind this one, then leaves the pipeline and re-delivers what it
/// held. It only holds what arrived before the initializer finished (at most a few reads).
package final class ConnectionKindSniffer: ChannelInboundHandler, RemovableChannelHandler {
    package typealias InboundIn = ByteBuffer
    package typealias InboundOut = ByteBuffer

    /// The content type of a TLS handshake record (RFC 5246 §6.2.1), the first byte a TLS client sends.
    static let tlsHandshakeRecord: UInt8 = 0x16

    private enum State {
        case waitingForFirstByte
        case configuring
        case forwarding
    }

    private let http: @Sendable (Channel) throws -> Void
    private let secure: @Sendable (Channel) -> EventLoopFuture<Void>
    private var state = State.waitingForFirstByte
    private var held: [NIOAny] = []

    package init(http: @escaping @Sendable (Channel) throws -> Void, secure: @escaping @Sendable (Channel) -> EventLoopFuture<Void>) {
        self.http = http
        self.secure = secure
    }

    package func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch state {
        case .forwarding:
            context.fireChannelRead(data)
        case .configuring:
            held.append(data)
        case .waitingForFirstByte:
            let buffer = unwrapInboundIn(data)
            guard let first = buffer.getInteger(at: buffer.readerIndex, as: UInt8.self) else { return }
            held.append(data)
            state = .configuring
            let channel = context.channel
            let configured: EventLoopFuture<Void> = first == Self.tlsHandshakeRecord
                ? secure(channel)
                : channel.eventLoop.makeCompletedFuture { try http(channel) }
            let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            configured.hop(to: context.eventLoop).whenComplete { result in
                let (handler, context) = loopBound.value
                switch result {
                case .success:
                    context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
                case .failure(let error):
                    handler.held.removeAll()
                    context.fireErrorCaught(error)
                    context.close(promise: nil)
                }
            }
        }
    }

    package func channelReadComplete(context: ChannelHandlerContext) {
        if case .forwarding = state { context.fireChannelReadComplete() }
    }

    package func removeHandler(context: ChannelHandlerContext, removalToken: ChannelHandlerContext.RemovalToken) {
        state = .forwarding
        let held = self.held
        self.held.removeAll()
        for data in held { context.fireChannelRead(data) }
        if !held.isEmpty { context.fireChannelReadComplete() }
        context.leavePipeline(removalToken: removalToken)
    }
}
