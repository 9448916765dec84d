import NIOCore
import NIOPosix
import ThaliPSKTLS

/// A PSK-TLS session of a probe: the client side of one handshake, with the probe's own handlers around
/// our TLS handler.
enum ProbeSession {
    /// Connects to `host:port` and runs the handshake with `identity` and `psk`; `below` sit between TCP
    /// and TLS, `above` after TLS. Returns the channel once the handshake is done; throws (the channel
    /// closed) when the connection or the handshake fails.
    static func connect(host: String, port: Int, identity: String, psk: [UInt8], timeout: TimeAmount, on eventLoop: EventLoop,
                        below: [any ChannelHandler & Sendable] = [], above: [any ChannelHandler & Sendable] = []) async throws -> Channel {
        let handshake = eventLoop.makePromise(of: PSKTLSNegotiatedParameters.self)
        let context = try PSKTLSContext(role: .client)
        let channel: Channel
        do {
            channel = try await ClientBootstrap(group: eventLoop)
                .connectTimeout(timeout)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        let tls = try PSKTLSHandler(clientContext: context, identity: identity, psk: psk, handshakePromise: handshake)
                        try channel.pipeline.syncOperations.addHandlers(below + [tls] + above)
                    }
                }
                .connect(host: host, port: port).get()
        } catch {
            handshake.fail(error)
            throw error
        }
        do {
            _ = try await handshake.futureResult.get()
        } catch {
            channel.close(promise: nil)
            throw error
        }
        return channel
    }
}
