import NIOCore
import NIOPosix

/// Connects to PSK-TLS servers. Holds one client `PSKTLSContext` for all its connections.
public struct PSKTLSClient: Sendable {
    /// The OpenSSL context shared by this client's connections.
    public let context: PSKTLSContext
    /// The event loops the connections run on.
    public let eventLoopGroup: any EventLoopGroup

    /// A client with its own OpenSSL context built from `configuration`.
    public init(configuration: PSKTLSConfiguration = PSKTLSConfiguration(),
                eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton) throws(PSKTLSError) {
        context = try PSKTLSContext(role: .client, configuration: configuration)
        self.eventLoopGroup = eventLoopGroup
    }

    /// Opens a TCP connection to `host:port` and runs the handshake with `identity` and `psk`.
    /// Returns once the handshake has finished and its parameters passed the profile's checks; throws
    /// a `PSKTLSError` (for example `alertReceived(.unknownPSKIdentity)`) or a connection error.
    public func connect(host: String, port: Int, identity: String, psk: [UInt8]) async throws -> PSKTLSConnection {
        let context = self.context
        // Check the credentials before any network traffic.
        _ = try PSKTLSHandler.clientCredentials(identity: identity, psk: psk)
        let connection = try await ClientBootstrap(group: eventLoopGroup)
            .channelOption(.allowRemoteHalfClosure, value: true)
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .connectTimeout(TimeAmount(context.configuration.connectTimeout))
            .connect(host: host, port: port) { channel in
                channel.eventLoop.makeCompletedFuture {
                    let promise = channel.eventLoop.makePromise(of: PSKTLSNegotiatedParameters.self)
                    let handler = try PSKTLSHandler(clientContext: context, identity: identity, psk: psk, handshakePromise: promise)
                    try channel.pipeline.syncOperations.addHandler(handler)
                    return PSKTLSConnection.afterHandshake(on: channel, promise.futureResult)
                }
            }
        return try await connection.get()
    }

    /// Connects once with a client built from `configuration` (a new OpenSSL context each call; keep a
    /// `PSKTLSClient` to connect often).
    public static func connect(host: String, port: Int, identity: String, psk: [UInt8],
                               configuration: PSKTLSConfiguration = PSKTLSConfiguration(),
                               eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton) async throws -> PSKTLSConnection {
        try await PSKTLSClient(configuration: configuration, eventLoopGroup: eventLoopGroup)
            .connect(host: host, port: port, identity: identity, psk: psk)
    }
}
