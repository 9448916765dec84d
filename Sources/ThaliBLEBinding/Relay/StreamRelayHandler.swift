import NIOCore

/// One half of a byte relay between two channels on the same event loop (the Bluetooth stream and its
/// localhost TCP connection). Octets read on one side are written to the other; a side reads only while
/// the other side is writable (Bluetooth brings no TCP window across, so this is the flow control);
/// when either side closes, the other is closed too (seed: TCP FINs are not carried, so closing is the
/// only end-of-stream signal).
///
/// The halves are made as a pair before both channels exist: until its partner is in a pipeline a half
/// keeps what it already read (at most one read's worth, because it stops asking for more) and forwards
/// it once the partner arrives.
final class StreamRelayHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private var partner: StreamRelayHandler?
    private var context: ChannelHandlerContext?
    private var pendingRead = false
    private var held: [ByteBuffer] = []
    private var closeRequested = false

    /// Makes two connected halves.
    static func makePair() -> (StreamRelayHandler, StreamRelayHandler) {
        let first = StreamRelayHandler()
        let second = StreamRelayHandler()
        first.partner = second
        second.partner = first
        return (first, second)
    }

    private init() {}

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        if closeRequested {
            context.close(promise: nil)
            return
        }
        partner?.partnerBecameReady()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        partner = nil
    }

    // MARK: Inbound

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        if let partner, partner.isReady {
            partner.write(buffer)
        } else {
            held.append(buffer)
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        partner?.flush()
    }

    func channelInactive(context: ChannelHandlerContext) {
        partner?.partnerClosed()
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // Any I/O error ends both sides: a relay cannot resynchronise.
        context.close(promise: nil)
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { partner?.partnerBecameWritable() }
        context.fireChannelWritabilityChanged()
    }

    // MARK: Outbound

    func read(context: ChannelHandlerContext) {
        if let partner, partner.isReady, partner.isWritable {
            context.read()
        } else {
            pendingRead = true
        }
    }

    // MARK: Calls from the partner (same event loop)

    private var isReady: Bool { context != nil }
    private var isWritable: Bool { context?.channel.isWritable ?? false }

    private func write(_ buffer: ByteBuffer) {
        guard let context else { return }
        context.write(wrapOutboundOut(buffer), promise: nil)
    }

    private func flush() {
        context?.flush()
    }

    private func partnerBecameReady() {
        guard let context else { return }
        if !held.isEmpty, let partner {
            for buffer in held { partner.write(buffer) }
            held.removeAll()
            partner.flush()
        }
        if pendingRead {
            pendingRead = false
            context.read()
        }
    }

    private func partnerBecameWritable() {
        guard let context, pendingRead else { return }
        pendingRead = false
        context.read()
    }

    private func partnerClosed() {
        if let context {
            // Push out what is already queued, then close.
            let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
            context.writeAndFlush(wrapOutboundOut(context.channel.allocator.buffer(capacity: 0))).whenComplete { _ in
                bound.value.close(promise: nil)
            }
        } else {
            closeRequested = true
        }
    }
}
