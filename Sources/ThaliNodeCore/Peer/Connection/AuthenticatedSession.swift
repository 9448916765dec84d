import NIOConcurrencyHelpers
import NIOCore
import TCPMultiplexer
import ThaliPSKTLS

/// PSK-TLS with a multiplexer session above it, on one connection, and the peer the handshake
/// authenticated: what every binding runs on the connection it carries (Wi-Fi's TCP, Bluetooth's relayed
/// stream). Like swift-nio-http2's pipeline helpers, it installs the handlers and hands back the session.
///
/// The server's `lookup` returns the peer with the key, so the peer is resolved once, during the
/// handshake, on the event loop: keep it a table lookup (no store, no I/O). Streams the other side opens
/// are initialised only once the handshake authenticated that peer; until then none reaches the caller.
package enum AuthenticatedSession {
    /// What ``configureServer(on:context:multiplexer:lookup:inboundStream:)-(_,_,_,_,(Channel,Peer)->EventLoopFuture<Void>)`` returns.
    package struct Server<Peer: Sendable>: Sendable {
        /// The multiplexer session above TLS.
        package let session: MultiplexerSession
        /// Succeeds with the peer once the handshake authenticated it; fails when the handshake fails.
        package let peer: EventLoopFuture<Peer>
        /// What the handshake negotiated (with ``peer``).
        package let handshake: EventLoopFuture<PSKTLSNegotiatedParameters>
    }

    /// What ``configureClient(on:context:identity:psk:multiplexer:inboundStream:)`` returns.
    package struct Client: Sendable {
        /// The multiplexer session above TLS.
        package let session: MultiplexerSession
        /// Succeeds when the handshake authenticated the server (it knew the PSK); fails otherwise.
        package let handshake: EventLoopFuture<PSKTLSNegotiatedParameters>
    }

    /// The server side: PSK-TLS keyed by `lookup` (identity → key and the peer it belongs to), then a
    /// multiplexer session whose inbound streams go to `inboundStream` with the authenticated peer.
    package static func configureServer<Peer: Sendable>(
        on channel: Channel, context: PSKTLSContext,
        multiplexer: MultiplexerConfiguration = MultiplexerConfiguration(),
        lookup: @escaping @Sendable (String) -> (psk: [UInt8], peer: Peer)?,
        inboundStream: @escaping @Sendable (Channel, Peer) -> EventLoopFuture<Void>
    ) -> EventLoopFuture<Server<Peer>> {
        configureServer(on: channel, context: context, multiplexer: multiplexer, lookup: lookup) { stream, peer, _ in
            inboundStream(stream, peer)
        }
    }

    /// ``configureServer(on:context:multiplexer:lookup:inboundStream:)-(_,_,_,_,(Channel,Peer)->EventLoopFuture<Void>)`` whose `inboundStream` also gets
    /// what the handshake negotiated (its ALPN protocol says whether the session's streams are marked).
    package static func configureServer<Peer: Sendable>(
        on channel: Channel, context: PSKTLSContext,
        multiplexer: MultiplexerConfiguration = MultiplexerConfiguration(),
        lookup: @escaping @Sendable (String) -> (psk: [UInt8], peer: Peer)?,
        inboundStream: @escaping @Sendable (Channel, Peer, PSKTLSNegotiatedParameters) -> EventLoopFuture<Void>
    ) -> EventLoopFuture<Server<Peer>> {
        let handshake = channel.eventLoop.makePromise(of: PSKTLSNegotiatedParameters.self)
        // The peer of the identity the handshake was keyed with: OpenSSL asks once per handshake.
        let resolved = NIOLockedValueBox<(identity: String, peer: Peer)?>(nil)
        let peer = handshake.futureResult.flatMapThrowing { parameters -> Peer in
            guard let found = resolved.withLockedValue({ $0 }), found.identity == parameters.pskIdentity else {
                throw PSKTLSError(.invalidCredentials, role: .server, detail: "no peer for the negotiated identity")
            }
            return found.peer
        }
        return channel.eventLoop.makeCompletedFuture {
            try install(on: channel, handshake: handshake) {
                try PSKTLSHandler(serverContext: context, lookup: { identity in
                    guard let entry = lookup(identity) else { return nil }
                    resolved.withLockedValue { $0 = (identity, entry.peer) }
                    return entry.psk
                }, handshakePromise: handshake)
            }
        }.flatMap {
            MultiplexerSession.configure(on: channel, role: .server, configuration: multiplexer) { stream in
                peer.and(handshake.futureResult).flatMap { inboundStream(stream, $0, $1) }
            }
        }.map { Server(session: $0, peer: peer, handshake: handshake.futureResult) }.flatMapErrorThrowing { error in
            channel.close(promise: nil)
            throw error
        }
    }

    /// The client side: PSK-TLS with `identity` and `psk` (from a beacon match), then a multiplexer
    /// session; streams the server opens go to `inboundStream`.
    package static func configureClient(
        on channel: Channel, context: PSKTLSContext, identity: String, psk: [UInt8],
        multiplexer: MultiplexerConfiguration = MultiplexerConfiguration(),
        inboundStream: MultiplexerHandler.StreamInitializer? = nil
    ) -> EventLoopFuture<Client> {
        var negotiated: (@Sendable (Channel, PSKTLSNegotiatedParameters) -> EventLoopFuture<Void>)?
        if let inboundStream { negotiated = { stream, _ in inboundStream(stream) } }
        return configureClient(on: channel, context: context, identity: identity, psk: psk, multiplexer: multiplexer,
                               negotiatedInboundStream: negotiated)
    }

    /// ``configureClient(on:context:identity:psk:multiplexer:inboundStream:)`` whose initializer for the
    /// streams the server opens runs once the handshake completed, with what it negotiated.
    package static func configureClient(
        on channel: Channel, context: PSKTLSContext, identity: String, psk: [UInt8],
        multiplexer: MultiplexerConfiguration = MultiplexerConfiguration(),
        negotiatedInboundStream inboundStream: (@Sendable (Channel, PSKTLSNegotiatedParameters) -> EventLoopFuture<Void>)?
    ) -> EventLoopFuture<Client> {
        let handshake = channel.eventLoop.makePromise(of: PSKTLSNegotiatedParameters.self)
        let negotiated = handshake.futureResult
        var initializer: MultiplexerHandler.StreamInitializer?
        if let inboundStream {
            initializer = { @Sendable (stream: Channel) -> EventLoopFuture<Void> in
                negotiated.flatMap { (parameters: PSKTLSNegotiatedParameters) -> EventLoopFuture<Void> in inboundStream(stream, parameters) }
            }
        }
        let streamInitializer = initializer
        return channel.eventLoop.makeCompletedFuture {
            try install(on: channel, handshake: handshake) {
                try PSKTLSHandler(clientContext: context, identity: identity, psk: psk, handshakePromise: handshake)
            }
        }.flatMap {
            MultiplexerSession.configure(on: channel, role: .client, configuration: multiplexer,
                                         inboundStreamInitializer: streamInitializer)
        }.map { Client(session: $0, handshake: handshake.futureResult) }.flatMapErrorThrowing { error in
            channel.close(promise: nil)
            throw error
        }
    }

    /// Adds the TLS handler `make` creates. Once added, the handler completes `handshake` (it fails it
    /// when removed, as on close); if it was never added, the promise is failed here.
    private static func install(on channel: Channel, handshake: EventLoopPromise<PSKTLSNegotiatedParameters>,
                                _ make: () throws -> PSKTLSHandler) throws {
        do {
            try channel.pipeline.syncOperations.addHandler(try make())
        } catch {
            handshake.fail(error)
            throw error
        }
    }
}
