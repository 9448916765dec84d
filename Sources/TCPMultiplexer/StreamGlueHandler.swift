import NIOCore
import NIOPosix

/// Joins two channels on the same event loop, a TCP connection and a multiplexer stream, so that bytes
/// read on one are written to the other. Reading stops while the other side is not writable, so a
/// slow end slows the other instead of filling memory. Closing rules: an end of input (EOF / FIN)
/// half-closes the other side once the bytes before it are written; an error (reset) aborts the other
/// side (RST on the stream, a TCP reset on the connection).
final class StreamGlueHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// What the glued channel is, which decides how to abort it.
    enum Side { case tcp, stream }

    private let side: Side
    private var partner: StreamGlueHandler?
    private var context: ChannelHandlerContext?
    private var readRequested = false
    private var outputClosed = false

    private init(side: Side) { self.side = side }

    /// Two handlers glued to each other: add the first to the TCP channel, the second to the stream.
    static func pair() -> (tcp: StreamGlueHandler, stream: StreamGlueHandler) {
        let tcp = StreamGlueHandler(side: .tcp)
        let stream = StreamGlueHandler(side: .stream)
        tcp.partner = stream
        stream.partner = tcp
        return (tcp, stream)
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        self.partner = nil
    }

    // MARK: Driven by the partner

    private var isWritable: Bool { context?.channel.isWritable ?? false }

    private func partnerWrite(_ data: NIOAny) {
        context?.write(data, promise: nil)
    }

    private func partnerFlush() {
        context?.flush()
    }

    /// The partner's input ended: half-close our output after what is queued.
    private func partnerInputEnded() {
        guard let context, !outputClosed else { return }
        outputClosed = true
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(channel.allocator.buffer(capacity: 0))).whenComplete { _ in
            channel.close(mode: .output, promise: nil)
        }
    }

    /// The partner is gone: close after what is queued.
    private func partnerClosed() {
        guard let context else { return }
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(channel.allocator.buffer(capacity: 0))).whenComplete { _ in
            channel.close(promise: nil)
        }
    }

    /// The partner failed: abort our channel.
    private func partnerFailed() {
        guard let context else { return }
        switch side {
        case .stream:
            context.channel.triggerUserOutboundEvent(MultiplexerStreamReset(message: "connection reset"), promise: nil)
        case .tcp:
            // A zero linger turns close into a TCP reset.
            let channel = context.channel
            guard let provider = channel as? SocketOptionProvider else { return channel.close(promise: nil) }
            provider.setSoLinger(linger(l_onoff: 1, l_linger: 0)).whenComplete { _ in channel.close(promise: nil) }
        }
    }

    private func partnerWritabilityChanged(_ writable: Bool) {
        if writable && readRequested {
            readRequested = false
            context?.read()
        }
    }

    // MARK: Our channel's events

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        partner?.partnerWrite(data)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        partner?.partnerFlush()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        partner?.partnerWritabilityChanged(context.channel.isWritable)
        context.fireChannelWritabilityChanged()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case ChannelEvent.inputClosed = event {
            partner?.partnerInputEnded()
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        partner?.partnerFailed()
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        partner?.partnerClosed()
        context.fireChannelInactive()
    }

    func read(context: ChannelHandlerContext) {
        if partner?.isWritable ?? true {
            context.read()
        } else {
            readRequested = true
        }
    }
}
