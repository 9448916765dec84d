import NIOCore
import NIOPosix

/// Carries TCP connections over a multiplexer session, as a Thali binding needs: the connecting
/// side runs a local TCP listener whose connections each become a new stream; the listening side
/// turns each incoming stream into a connection to a local port. An EOF on either end becomes a
/// half-close (FIN) on the other, an error a reset.
public enum MultiplexerBridge {
    /// Connecting side: listens on `host:port` (port 0 picks a free port; read it from the returned
    /// channel's `localAddress`) on the session's event loop; each accepted connection opens a stream on
    /// `session` and is joined to it. `streamInitializer`, if any, runs on each stream before the join
    /// (to observe how the stream ends, say). Close the returned channel to stop listening.
    public static func listen(host: String = "127.0.0.1", port: Int = 0,
                              forwardingTo session: MultiplexerSession,
                              streamInitializer: MultiplexerHandler.StreamInitializer? = nil) -> EventLoopFuture<Channel> {
        let loop = session.channel.eventLoop
        return ServerBootstrap(group: loop)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.allowRemoteHalfClosure, value: true)
            .childChannelOption(.autoRead, value: false)
            .childChannelInitializer { connection in
                // The connection reads nothing until both ends are glued.
                let (tcpGlue, pairedStreamGlue) = StreamGlueHandler.pair()
                let streamGlue = NIOLoopBound(pairedStreamGlue, eventLoop: loop)
                do {
                    try connection.pipeline.syncOperations.addHandler(tcpGlue)
                } catch {
                    return connection.eventLoop.makeFailedFuture(error)
                }
                return session.openStream { stream in
                    (streamInitializer?(stream) ?? stream.eventLoop.makeSucceededVoidFuture()).flatMapThrowing {
                        try stream.syncOptions?.setOption(.allowRemoteHalfClosure, value: true)
                        try stream.pipeline.syncOperations.addHandler(streamGlue.value)
                    }
                }.flatMap { _ in
                    connection.setOption(.autoRead, value: true)
                }
            }
            .bind(host: host, port: port)
    }

    /// Listening side: a stream initializer that connects each incoming stream to `host:port` and
    /// joins them; a failed connection resets the stream. Pass it to
    /// ``MultiplexerSession/configure(on:role:configuration:inboundStreamInitializer:)``.
    public static func connectingInitializer(host: String, port: Int) -> MultiplexerHandler.StreamInitializer {
        connectingInitializer(host: host, port: port, fromCarrierSource: false)
    }

    /// Like ``connectingInitializer(host:port:)``, and with `fromCarrierSource` each connection leaves
    /// from the IP address the session's own connection came from (its remote address): a gateway whose
    /// sessions arrive from distinct loopback addresses keeps them distinct toward `host`.
    public static func connectingInitializer(host: String, port: Int, fromCarrierSource: Bool) -> MultiplexerHandler.StreamInitializer {
        connectingInitializer(host: host, port: port) { stream in
            fromCarrierSource ? stream.parent?.remoteAddress?.ipAddress : nil
        }
    }

    /// Like ``connectingInitializer(host:port:)``, each connection leaving from `source` (a local IP
    /// address; nil: the system's choice).
    public static func connectingInitializer(host: String, port: Int, source: String?) -> MultiplexerHandler.StreamInitializer {
        connectingInitializer(host: host, port: port) { _ in source }
    }

    private static func connectingInitializer(host: String, port: Int,
                                              source: @escaping @Sendable (Channel) -> String?) -> MultiplexerHandler.StreamInitializer {
        return { stream in
            let (pairedTCPGlue, pairedStreamGlue) = StreamGlueHandler.pair()
            let tcpGlue = NIOLoopBound(pairedTCPGlue, eventLoop: stream.eventLoop)
            let streamGlue = NIOLoopBound(pairedStreamGlue, eventLoop: stream.eventLoop)
            var bootstrap = ClientBootstrap(group: stream.eventLoop)
            if let source = source(stream), let local = try? SocketAddress(ipAddress: source, port: 0) {
                bootstrap = bootstrap.bind(to: local)
            }
            bootstrap = bootstrap
                .channelOption(.allowRemoteHalfClosure, value: true)
                .channelOption(.autoRead, value: false)  // until both ends are glued
                .channelInitializer { connection in
                    connection.eventLoop.makeCompletedFuture {
                        try connection.pipeline.syncOperations.addHandler(tcpGlue.value)
                    }
                }
            // Once per relayed connection: an address (the app's 127.0.0.1) is connected to directly; by
            // name NIO resolves it through getaddrinfo and races it Happy-Eyeballs style.
            let connected = if let address = try? SocketAddress(ipAddress: host, port: port) {
                bootstrap.connect(to: address)
            } else {
                bootstrap.connect(host: host, port: port)
            }
            return connected
                .flatMapThrowing { connection -> Channel in
                    try stream.syncOptions?.setOption(.allowRemoteHalfClosure, value: true)
                    try stream.pipeline.syncOperations.addHandler(streamGlue.value)
                    return connection
                }
                .flatMap { connection in
                    connection.setOption(.autoRead, value: true)
                }
        }
    }
}
