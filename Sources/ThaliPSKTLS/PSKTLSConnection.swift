import NIOConcurrencyHelpers
import NIOCore

/// An established PSK-TLS connection: plaintext in and out, and what the handshake negotiated.
///
/// Use `executeThenClose { inbound, outbound in ... }`: leaving the closure sends close_notify and
/// closes; `outbound.finish()` sends close_notify and half-closes (the peer can still answer). The
/// inbound sequence ends when the peer sends close_notify and throws a `PSKTLSError` on failure (for
/// example `uncleanShutdown` when the peer closed TCP without close_notify). A connection that is
/// dropped without `executeThenClose` is closed in the background.
public final class PSKTLSConnection: Sendable {
    /// What the handshake negotiated (version, suite, DH group size, the PSK identity).
    public let parameters: PSKTLSNegotiatedParameters
    /// The peer's address.
    public let remoteAddress: SocketAddress?

    private let asyncChannel: NIOAsyncChannel<ByteBuffer, ByteBuffer>
    private let claimed = NIOLockedValueBox(false)

    private init(asyncChannel: NIOAsyncChannel<ByteBuffer, ByteBuffer>, parameters: PSKTLSNegotiatedParameters) {
        self.asyncChannel = asyncChannel
        self.parameters = parameters
        self.remoteAddress = asyncChannel.channel.remoteAddress
    }

    deinit {
        guard !claimed.withLockedValue({ $0 }) else { return }
        // NIO requires its async writer to be finished; nobody took this connection, so close it.
        let asyncChannel = self.asyncChannel
        Task { try? await asyncChannel.executeThenClose { _, _ in } }
    }

    /// Gives `body` the plaintext inbound stream and outbound writer, then closes the connection
    /// (close_notify first) when `body` returns or throws.
    public func executeThenClose<Result>(
        isolation actor: isolated (any Actor)? = #isolation,
        _ body: (_ inbound: NIOAsyncChannelInboundStream<ByteBuffer>, _ outbound: NIOAsyncChannelOutboundWriter<ByteBuffer>)
            async throws -> sending Result
    ) async throws -> sending Result {
        claimed.withLockedValue { $0 = true }
        return try await asyncChannel.executeThenClose(isolation: actor, body)
    }

    /// The connection a handshake promise leads to. The async wrapper joins the pipeline in the
    /// promise's callback, which runs on the event loop as the handshake completes and before the
    /// handler delivers any application data, so nothing is lost and a failed handshake leaves no
    /// async channel behind.
    static func afterHandshake(on channel: any Channel,
                               _ handshake: EventLoopFuture<PSKTLSNegotiatedParameters>) -> EventLoopFuture<PSKTLSConnection> {
        handshake.flatMapThrowing { parameters in
            let asyncChannel = try NIOAsyncChannel<ByteBuffer, ByteBuffer>(
                wrappingChannelSynchronously: channel, configuration: asyncConfiguration)
            return PSKTLSConnection(asyncChannel: asyncChannel, parameters: parameters)
        }
    }

    /// How the async layer wraps a channel: small inbound buffering (elements are up to
    /// `plaintextReadChunkSize` bytes) so a slow application stops network reads early, and outbound
    /// half-closure so finishing the writer sends close_notify without ending the input.
    private static let asyncConfiguration = NIOAsyncChannel<ByteBuffer, ByteBuffer>.Configuration(
        backPressureStrategy: .init(lowWatermark: 2, highWatermark: 8),
        isOutboundHalfClosureEnabled: true)
}
