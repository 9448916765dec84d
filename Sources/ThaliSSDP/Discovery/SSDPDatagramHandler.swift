import NIOCore

/// Hands each received datagram to the service; only moves bytes.
final class SSDPDatagramHandler: ChannelInboundHandler, Sendable {
    typealias InboundIn = AddressedEnvelope<ByteBuffer>
    private let onDatagram: @Sendable (AddressedEnvelope<ByteBuffer>) -> Void

    init(_ onDatagram: @escaping @Sendable (AddressedEnvelope<ByteBuffer>) -> Void) { self.onDatagram = onDatagram }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) { onDatagram(unwrapInboundIn(data)) }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        // UDP errors (ICMP unreachable after a unicast answer) are per datagram; the socket stays usable.
    }
}
