import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

/// The Bluetooth client side of the binding (seed, "Binding TCP/IP to Bluetooth"): connect to a peer,
/// send the handshake, then offer a localhost TCP port that accepts exactly one connection and relays
/// it to the Bluetooth stream. The app runs the TCP multiplexer over that one connection.
public struct BluetoothRelayClient: Sendable {
    private let transport: any BluetoothTransport
    private let group: any EventLoopGroup
    private let limits: BluetoothBindingLimits

    /// - Parameters:
    ///   - transport: how Bluetooth streams are opened (RFCOMM, or the in-process stand-in).
    ///   - group: the event loops for the Bluetooth and localhost channels.
    ///   - limits: timeouts and bounds.
    public init(transport: any BluetoothTransport, group: any EventLoopGroup,
                limits: BluetoothBindingLimits = BluetoothBindingLimits())
    {
        self.transport = transport
        self.group = group
        self.limits = limits
    }

    /// Connects to `address` on RFCOMM `channel`, runs the handshake (announcing whether we have
    /// notification beacons) and opens the localhost listener.
    /// - Returns: the relay; connect to `127.0.0.1:localPort` once.
    /// - Throws: `BluetoothTransportError`, `BluetoothHandshake.Violation`, or NIO's errors.
    public func connect(to address: BluetoothAddress, channel: UInt8, hasNotifications: Bool) async throws
        -> BluetoothClientRelay
    {
        let socket = try await transport.connect(to: address, channel: channel)
        let loop = group.next()
        let limits = self.limits
        let halves = try await loop.submit {
            NIOLoopBound(StreamRelayHandler.makePair(), eventLoop: loop)
        }.get()
        let handshake = loop.makePromise(of: BluetoothHandshake.Outcome.self)
        let hello: BluetoothHandshake.ClientHello = hasNotifications ? .hasNotifications : .hasNoNotifications
        let bluetooth = try await socket.makeChannel(on: loop) { channel in
            channel.eventLoop.makeCompletedFuture {
                try channel.pipeline.syncOperations.addHandler(
                    BluetoothHandshakeHandler(role: .client(hello), timeout: TimeAmount(limits.handshakeTimeout),
                                              outcome: handshake, successor: halves.value.0))
            }
        }
        _ = try await handshake.futureResult.get()

        let taken = NIOLockedValueBox(false)
        let listener: any Channel
        do {
            listener = try await ServerBootstrap(group: loop, childGroup: loop)
                .serverChannelOption(.backlog, value: 1)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                .childChannelInitializer { child in
                    child.eventLoop.makeCompletedFuture {
                        let first = taken.withLockedValue { value in
                            defer { value = true }
                            return !value
                        }
                        // Exactly one connection: the first gets the relay, then the listener closes. Not
                        // right here: NIO drops a child whose listener is already closed when setup ends.
                        if let parent = child.parent {
                            child.eventLoop.execute { parent.close(promise: nil) }
                        }
                        guard first else { throw BluetoothRelayError.secondLocalConnection }
                        try child.pipeline.syncOperations.addHandler(halves.value.1)
                    }
                }
                .bind(host: "127.0.0.1", port: 0).get()
        } catch {
            bluetooth.close(promise: nil)
            throw error
        }
        // Read before anything can close the listener: a closed channel has no local address, and the
        // Bluetooth stream may have ended already (a server whose app port is dead closes it at once).
        guard let port = listener.localAddress?.port else {
            listener.close(promise: nil)
            bluetooth.close(promise: nil)
            throw BluetoothRelayError.noLocalPort
        }
        // The Bluetooth stream ending (or the app never coming) ends the listener too.
        bluetooth.closeFuture.whenComplete { _ in listener.close(promise: nil) }
        let timeout = loop.scheduleTask(in: TimeAmount(limits.relayAcceptTimeout)) {
            if !taken.withLockedValue({ $0 }) {
                listener.close(promise: nil)
                bluetooth.close(promise: nil)
            }
        }
        listener.closeFuture.whenComplete { _ in timeout.cancel() }
        return BluetoothClientRelay(remoteAddress: address, localPort: port, bluetooth: bluetooth)
    }
}

/// One client-side relay: a handshaken Bluetooth stream and the localhost port that leads into it.
public struct BluetoothClientRelay: Sendable {
    /// The peer at the other end.
    public let remoteAddress: BluetoothAddress
    /// The localhost TCP port (on 127.0.0.1) that accepts the one relayed connection.
    public let localPort: Int
    private let bluetooth: any Channel

    init(remoteAddress: BluetoothAddress, localPort: Int, bluetooth: any Channel) {
        self.remoteAddress = remoteAddress
        self.localPort = localPort
        self.bluetooth = bluetooth
    }

    /// Completes when the Bluetooth stream (and with it the relay) has closed.
    public var closeFuture: EventLoopFuture<Void> { bluetooth.closeFuture }

    /// Closes the Bluetooth stream; the localhost side follows.
    public func close() async {
        try? await bluetooth.close()
    }
}

/// Failures of the relay itself.
public enum BluetoothRelayError: Error, Hashable, Sendable, CustomStringConvertible {
    /// A second connection reached the client-side listener, which accepts exactly one.
    case secondLocalConnection
    /// The localhost listener has no port (should not happen with IPv4 loopback).
    case noLocalPort
    /// The multiplexer session over the relayed connection was not set up (should not happen: it is set
    /// up before the connection completes).
    case noSession

    public var description: String {
        switch self {
        case .secondLocalConnection: return "the Bluetooth relay's localhost listener accepts exactly one connection"
        case .noLocalPort: return "the Bluetooth relay's localhost listener has no port"
        case .noSession: return "no multiplexer session over the Bluetooth relay"
        }
    }
}
