import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

/// What the Bluetooth server reports.
public enum BluetoothServerEvent: Hashable, Sendable {
    /// A client completed the handshake and its stream is relayed to the app's port.
    case relayed(BluetoothAddress, BluetoothHandshake.ClientHello)
    /// A client said it has notification beacons: the seed treats this like a BLE advertisement of that
    /// Bluetooth address with an unknown BLE address (a "surprise connection"), so fetch its beacons.
    case discoveredByConnection(BluetoothAddress)
    /// A connection was refused by the DoS gate.
    case refused(IncomingConnectionGate.Decision)
    /// A client broke the handshake; its stream was closed.
    case handshakeFailed(BluetoothAddress, BluetoothHandshake.Violation)
    /// The app's localhost port could not be reached; the Bluetooth stream was closed.
    case appUnreachable(BluetoothAddress)
}

/// The Bluetooth server side of the binding: every incoming Bluetooth stream gets the handshake and,
/// after it, its own localhost TCP connection to the app's port; closing either end closes the other.
/// Incoming connections pass an `IncomingConnectionGate` first.
public final class BluetoothRelayServer: Sendable {
    /// The server's counters: the gate's, plus what happened after admission.
    public struct Counters: Hashable, Sendable {
        /// The DoS gate's counters.
        public var gate = IncomingConnectionGate.Counters()
        /// Handshakes that failed (wrong octet, timeout, early close).
        public var handshakeFailures = 0
        /// Streams relayed to the app.
        public var relayed = 0
        /// Relays closed because the client sent nothing after its handshake octet within
        /// `relayFirstBytesTimeout`.
        public var silentRelaysClosed = 0
        /// Relays closed because nothing moved for `relayIdleTimeout`.
        public var idleRelaysClosed = 0
        /// Connections to the app's port that failed.
        public var appConnectFailures = 0
    }

    private struct State {
        var gate: IncomingConnectionGate
        var counters = Counters()
        var listener: (any BluetoothListener)?
        var acceptTask: Task<Void, Never>?
    }

    private let transport: any BluetoothTransport
    private let group: any EventLoopGroup
    private let limits: BluetoothBindingLimits
    private let appPort: Int
    private let sourcePerPeer: Bool
    private let state: NIOLockedValueBox<State>
    private let continuation: AsyncStream<BluetoothServerEvent>.Continuation

    /// Events as they happen (newest kept if nobody reads: at most `eventBufferLimit`).
    public let events: AsyncStream<BluetoothServerEvent>
    /// How many unread events are kept.
    public static let eventBufferLimit = 256

    /// - Parameters:
    ///   - transport: where incoming Bluetooth streams come from.
    ///   - group: event loops for the relays.
    ///   - appPort: the app's TCP port on 127.0.0.1 that each stream is relayed to.
    ///   - sourcePerPeer: connect to the app from the peer's `BluetoothAddress.loopbackSource` instead
    ///     of 127.0.0.1, so that the app can tell (and limit) Bluetooth peers apart by source address.
    ///   - limits: DoS bounds and timeouts.
    public init(transport: any BluetoothTransport, group: any EventLoopGroup, appPort: Int,
                limits: BluetoothBindingLimits = BluetoothBindingLimits(), sourcePerPeer: Bool = false)
    {
        self.sourcePerPeer = sourcePerPeer
        self.transport = transport
        self.group = group
        self.appPort = appPort
        self.limits = limits
        self.state = NIOLockedValueBox(State(gate: IncomingConnectionGate(limits: limits)))
        (self.events, self.continuation) = AsyncStream.makeStream(
            of: BluetoothServerEvent.self, bufferingPolicy: .bufferingNewest(Self.eventBufferLimit))
    }

    /// A snapshot of the counters.
    public var counters: Counters {
        state.withLockedValue { state in
            var counters = state.counters
            counters.gate = state.gate.counters
            return counters
        }
    }

    /// Relays admitted and not yet closed (at most `BluetoothBindingLimits.maxConcurrentIncomingConnections`).
    public var openRelays: Int { state.withLockedValue { $0.gate.open } }

    /// Listens on RFCOMM `channel` of the transport and serves every incoming stream until `stop()`.
    public func start(channel: UInt8) async throws {
        let listener = try await transport.listen(channel: channel)
        let task = Task { [self] in
            while true {
                do {
                    let socket = try await listener.accept()
                    handle(socket)
                } catch {
                    return
                }
            }
        }
        state.withLockedValue { state in
            state.listener = listener
            state.acceptTask = task
        }
    }

    /// Stops listening (open relays keep running until either end closes).
    public func stop() {
        let (listener, task) = state.withLockedValue { state in
            defer { state.listener = nil; state.acceptTask = nil }
            return (state.listener, state.acceptTask)
        }
        listener?.close()
        task?.cancel()
        continuation.finish()
    }

    /// Serves one incoming stream (from `start`'s listener, or handed over by BlueZ through a
    /// registered profile's `NewConnection`).
    public func handle(_ socket: BluetoothSocket) {
        let address = socket.remoteAddress
        let decision = state.withLockedValue { $0.gate.admit(address) }
        guard case .accept = decision else {
            socket.close()
            continuation.yield(.refused(decision))
            return
        }
        Task { [self] in
            await relay(socket)
        }
    }

    private func relay(_ socket: BluetoothSocket) async {
        let address = socket.remoteAddress
        let loop = group.next()
        let limits = self.limits
        let bluetooth: any Channel
        let handshake = loop.makePromise(of: BluetoothHandshake.Outcome.self)
        let halves: NIOLoopBound<(StreamRelayHandler, StreamRelayHandler)>
        do {
            halves = try await loop.submit { NIOLoopBound(StreamRelayHandler.makePair(), eventLoop: loop) }.get()
            bluetooth = try await socket.makeChannel(on: loop) { [state] channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(RelayTimeoutHandler(
                        firstBytesTimeout: TimeAmount(limits.relayFirstBytesTimeout), idleTimeout: TimeAmount(limits.relayIdleTimeout)
                    ) { reason in
                        state.withLockedValue {
                            switch reason {
                            case .silentAfterHandshake: $0.counters.silentRelaysClosed += 1
                            case .idle: $0.counters.idleRelaysClosed += 1
                            }
                        }
                    })
                    try channel.pipeline.syncOperations.addHandler(
                        BluetoothHandshakeHandler(role: .server, timeout: TimeAmount(limits.handshakeTimeout),
                                                  outcome: handshake, successor: halves.value.0))
                }
            }
        } catch {
            handshake.fail(error)
            socket.close()
            state.withLockedValue { $0.gate.release(address) }
            return
        }
        bluetooth.closeFuture.whenComplete { [state] _ in state.withLockedValue { $0.gate.release(address) } }

        let hello: BluetoothHandshake.ClientHello
        do {
            guard case .serverReceived(let received) = try await handshake.futureResult.get() else { return }
            hello = received
        } catch {
            state.withLockedValue { $0.counters.handshakeFailures += 1 }
            let violation = error as? BluetoothHandshake.Violation ?? .closedBeforeHandshake
            continuation.yield(.handshakeFailed(address, violation))
            return
        }
        if hello == .hasNotifications { continuation.yield(.discoveredByConnection(address)) }

        do {
            var bootstrap = ClientBootstrap(group: loop)
            if sourcePerPeer { bootstrap = bootstrap.bind(to: try SocketAddress(ipAddress: address.loopbackSource, port: 0)) }
            let app = try await bootstrap
                .connectTimeout(TimeAmount(limits.appConnectTimeout))
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(halves.value.1)
                    }
                }
                .connect(host: "127.0.0.1", port: appPort).get()
            _ = app
            state.withLockedValue { $0.counters.relayed += 1 }
            continuation.yield(.relayed(address, hello))
        } catch {
            state.withLockedValue { $0.counters.appConnectFailures += 1 }
            continuation.yield(.appUnreachable(address))
            bluetooth.close(promise: nil)
        }
    }
}
