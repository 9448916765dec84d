import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import TCPMultiplexer

/// The seed's rule that the TCP multiplexer always runs over the one relayed connection, packaged:
/// the central gets a local port whose every connection becomes a multiplexer stream to the
/// peripheral; the peripheral puts a `MultiplexedAppGateway` between the Bluetooth server and its app, so
/// the app sees one ordinary localhost TCP connection per stream.
public struct MultiplexedBluetoothClient: Sendable {
    private let relayClient: BluetoothRelayClient
    private let group: any EventLoopGroup
    private let configuration: MultiplexerConfiguration

    /// - Parameters:
    ///   - transport: how Bluetooth streams are opened.
    ///   - group: event loops for the relay, the session and the local listener.
    ///   - limits: the Bluetooth binding's timeouts and bounds.
    ///   - configuration: the multiplexer's framing and limits (yamux by default).
    public init(transport: any BluetoothTransport, group: any EventLoopGroup,
                limits: BluetoothBindingLimits = BluetoothBindingLimits(),
                configuration: MultiplexerConfiguration = .beforeAuthentication)
    {
        self.relayClient = BluetoothRelayClient(transport: transport, group: group, limits: limits)
        self.group = group
        self.configuration = configuration
    }

    /// Connects to `address` on RFCOMM `channel`, runs the handshake, takes the relay's one localhost
    /// connection, runs a multiplexer client session over it and opens a local listener whose
    /// connections each become a stream. With `inboundStreamInitializer`, streams the peripheral opens
    /// (through its gateway's ``MultiplexedAppGateway/Session/localPort``) are set up by it, so that one
    /// Bluetooth link carries streams both ways; without, they are refused.
    public func connect(to address: BluetoothAddress, channel: UInt8, hasNotifications: Bool,
                        inboundStreamInitializer: MultiplexerHandler.StreamInitializer? = nil) async throws
        -> MultiplexedBluetoothConnection
    {
        let relay = try await relayClient.connect(to: address, channel: channel, hasNotifications: hasNotifications)
        do {
            // The session is set up in the carrier's initializer, before it reads: the peripheral may send at
            // once (its fetch after our `00` hello), and bytes reaching a pipeline without the multiplexer
            // are dropped, which lost the first stream it opened (its request then waited for a timeout).
            let configured = NIOLockedValueBox<MultiplexerSession?>(nil)
            let configuration = self.configuration
            let carrier = try await ClientBootstrap(group: group)
                .channelInitializer { carrier in
                    MultiplexerSession.configure(on: carrier, role: .client, configuration: configuration,
                                                 inboundStreamInitializer: inboundStreamInitializer)
                        .map { session in configured.withLockedValue { $0 = session } }
                }
                .connect(host: "127.0.0.1", port: relay.localPort).get()
            guard let session = configured.withLockedValue({ $0 }) else {
                carrier.close(promise: nil)
                throw BluetoothRelayError.noSession
            }
            let listener = try await MultiplexerBridge.listen(host: "127.0.0.1", port: 0, forwardingTo: session).get()
            // The Bluetooth stream ending ends the listener as well.
            relay.closeFuture.whenComplete { _ in listener.close(promise: nil) }
            guard let port = listener.localAddress?.port else {
                listener.close(promise: nil)
                throw BluetoothRelayError.noLocalPort
            }
            return MultiplexedBluetoothConnection(relay: relay, session: session, listener: listener, localPort: port)
        } catch {
            await relay.close()
            throw error
        }
    }
}

/// A central's multiplexed connection to one peripheral.
public struct MultiplexedBluetoothConnection: Sendable {
    /// The Bluetooth relay underneath.
    public let relay: BluetoothClientRelay
    /// The multiplexer session over the relayed connection (open streams directly, ping, metrics).
    public let session: MultiplexerSession
    private let listener: any Channel
    /// The 127.0.0.1 port whose every connection becomes a new stream to the peripheral's app.
    public let localPort: Int

    init(relay: BluetoothClientRelay, session: MultiplexerSession, listener: any Channel, localPort: Int) {
        self.relay = relay
        self.session = session
        self.listener = listener
        self.localPort = localPort
    }

    /// Completes when the Bluetooth stream has closed.
    public var closeFuture: EventLoopFuture<Void> { relay.closeFuture }

    /// Stops the listener, ends the session (GoAway, streams closed) and with it the Bluetooth stream.
    public func close() async {
        try? await listener.close()
        try? await session.close().get()
        await relay.close()
    }
}

/// The peripheral's side of the multiplexer: a localhost listener for `BluetoothRelayServer`'s
/// connections. Each connection carries a multiplexer server session, and each stream the central opens
/// is joined to a new TCP connection to the app's port (FIN carried as half-close, reset as reset).
/// Started with `onSession`, each session also gets a local port whose connections become streams the
/// other way, to the central (if it accepts them), so one Bluetooth link serves both directions.
public final class MultiplexedAppGateway: Sendable {
    /// One central's session, reported to `onSession`.
    public struct Session: Sendable {
        /// The address the relay's connection came from (with `BluetoothRelayServer`'s `sourcePerPeer`,
        /// the central's `BluetoothAddress.loopbackSource`).
        public let source: String?
        /// The 127.0.0.1 port whose every connection becomes a stream to the central.
        public let localPort: Int
        /// Completes when the session's connection (and with it the Bluetooth stream) has closed.
        public let closeFuture: EventLoopFuture<Void>
    }

    private let listener: any Channel
    /// The 127.0.0.1 port to give `BluetoothRelayServer` as its app port.
    public let port: Int

    private init(listener: any Channel, port: Int) {
        self.listener = listener
        self.port = port
    }

    /// Listens on 127.0.0.1 (a free port) and joins every stream to `127.0.0.1:appPort`.
    public static func start(group: any EventLoopGroup, forwardingTo appPort: Int,
                             configuration: MultiplexerConfiguration = .beforeAuthentication) async throws
        -> MultiplexedAppGateway
    {
        try await start(group: group, configuration: configuration,
                        streamInitializer: MultiplexerBridge.connectingInitializer(host: "127.0.0.1", port: appPort))
    }

    /// Listens on 127.0.0.1 (a free port); `streamInitializer` sets up every stream the central opens.
    /// With `onSession`, each session gets a local port for streams toward the central, reported there.
    public static func start(group: any EventLoopGroup, configuration: MultiplexerConfiguration = .beforeAuthentication,
                             streamInitializer: @escaping MultiplexerHandler.StreamInitializer,
                             onSession: (@Sendable (Session) -> Void)? = nil) async throws
        -> MultiplexedAppGateway
    {
        let listener = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { carrier in
                MultiplexerSession.configure(on: carrier, role: .server, configuration: configuration,
                                             inboundStreamInitializer: streamInitializer).flatMap { session in
                    guard let onSession else { return carrier.eventLoop.makeSucceededVoidFuture() }
                    return MultiplexerBridge.listen(host: "127.0.0.1", port: 0, forwardingTo: session).map { reverse in
                        carrier.closeFuture.whenComplete { _ in reverse.close(promise: nil) }
                        if let port = reverse.localAddress?.port {
                            onSession(Session(source: carrier.remoteAddress?.ipAddress, localPort: port,
                                              closeFuture: carrier.closeFuture))
                        }
                    }
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        guard let port = listener.localAddress?.port else {
            try? await listener.close()
            throw BluetoothRelayError.noLocalPort
        }
        return MultiplexedAppGateway(listener: listener, port: port)
    }

    /// Stops listening (sessions already running continue until their Bluetooth stream ends).
    public func close() async {
        try? await listener.close()
    }
}

/// The multiplexer bounds of the Bluetooth binding.
extension MultiplexerConfiguration {
    /// The bounds of a multiplexer session that runs below TLS, before anyone is authenticated (the
    /// Bluetooth gateway's outer session): 8 streams at once (a Thali peer needs the beacon stream and a
    /// TLS stream or two), an accept backlog of 8, and windows held at yamux's initial 256 KiB, so one
    /// unauthenticated client can hold at most 2 MiB of buffers and 8 connections to the app.
    public static var beforeAuthentication: MultiplexerConfiguration {
        var configuration = MultiplexerConfiguration()
        configuration.maxConcurrentStreams = 8
        configuration.acceptBacklog = 8
        configuration.maxStreamWindowSize = 256 * 1024
        configuration.maxStreamReceiveBuffer = 256 * 1024
        configuration.maxSessionReceiveBuffer = 8 * 256 * 1024
        return configuration
    }
}
