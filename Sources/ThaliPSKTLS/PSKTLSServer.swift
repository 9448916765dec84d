import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import ThaliAdmission

/// A listening PSK-TLS server. Each accepted TCP connection runs the handshake with the server's
/// `PSKLookup`; established connections arrive in `connections`, failed handshakes in
/// `handshakeFailures`. Limits come from `PSKTLSConfiguration`; admission (per source before global) from
/// the ThaliAdmission gate, as on every listener of the suite.
public final class PSKTLSServer: Sendable {
    /// Counters of what the server did, for monitoring and tests.
    public struct Statistics: Hashable, Sendable {
        /// TCP connections accepted and given a handshake.
        public var accepted = 0
        /// TCP connections closed at once by the admission gate (see `admissionCounters` for the reasons).
        public var refused = 0
        /// Handshakes that completed.
        public var established = 0
        /// Handshakes that failed (each also reported in `handshakeFailures`).
        public var failed = 0
        /// Established connections closed because `maximumPendingConnections` were waiting unclaimed.
        public var dropped = 0
        /// Connections open now (handshaking or established).
        public var open = 0
    }

    /// The address the server listens on.
    public let localAddress: SocketAddress
    /// Established connections, in the order their handshakes completed.
    public let connections: AsyncStream<PSKTLSConnection>
    /// Handshake failures (the newest `maximumBufferedFailures` if nobody reads them).
    public let handshakeFailures: AsyncStream<PSKTLSError>
    /// The OpenSSL context shared by all connections.
    public let context: PSKTLSContext

    private let serverChannel: any Channel
    private let counters: NIOLockedValueBox<Statistics>
    private let admission: AdmissionController<String>
    private let sourceFilter: ListenerSourceFilter?

    /// What the admission gate has counted: refusals by reason (per source, global), overloads.
    public var admissionCounters: AdmissionCounters { admission.counters }

    /// The sources the kernel refuses now, before an accept (those in a per-source refusal period; see
    /// `ListenerSourceFilter`). Empty where the listener cannot be filtered.
    public var filteredSources: [String] { sourceFilter?.filteredSources ?? [] }

    /// The admission limits a server uses unless told otherwise: the gate's defaults, with
    /// `maximumConcurrentConnections` as the global bound on open (and unauthenticated) connections.
    public static func defaultAdmission(for configuration: PSKTLSConfiguration) -> AdmissionLimits {
        var limits = AdmissionLimits()
        limits.maxOpenGlobal = configuration.maximumConcurrentConnections
        limits.maxUnauthenticatedGlobal = min(limits.maxUnauthenticatedGlobal, configuration.maximumConcurrentConnections)
        limits.maxTrackedSources = max(limits.maxTrackedSources, configuration.maximumConcurrentConnections)
        return limits
    }
    private let connectionsContinuation: AsyncStream<PSKTLSConnection>.Continuation
    private let failuresContinuation: AsyncStream<PSKTLSError>.Continuation

    /// The port the server listens on.
    public var port: Int { localAddress.port ?? 0 }

    /// A snapshot of the counters.
    public var statistics: Statistics { counters.withLockedValue { $0 } }

    private init(localAddress: SocketAddress, serverChannel: any Channel, context: PSKTLSContext,
                 counters: NIOLockedValueBox<Statistics>, admission: AdmissionController<String>,
                 sourceFilter: ListenerSourceFilter?,
                 connections: (AsyncStream<PSKTLSConnection>, AsyncStream<PSKTLSConnection>.Continuation),
                 failures: (AsyncStream<PSKTLSError>, AsyncStream<PSKTLSError>.Continuation)) {
        self.localAddress = localAddress
        self.serverChannel = serverChannel
        self.context = context
        self.counters = counters
        self.admission = admission
        self.sourceFilter = sourceFilter
        (self.connections, self.connectionsContinuation) = connections
        (self.handshakeFailures, self.failuresContinuation) = failures
    }

    /// Listens on `host:port` (port 0 picks a free one) and serves PSK-TLS with `lookup` deciding
    /// which identities are accepted and with which PSK. Each connection passes `admission` (default
    /// ``defaultAdmission(for:)``) before its handshake starts; it counts as unauthenticated until the
    /// handshake succeeds, so strangers hold at most a few handshakes each. During an overload period
    /// the gate refuses every connection (the listener stays bound).
    public static func serve(host: String, port: Int, configuration: PSKTLSConfiguration = PSKTLSConfiguration(),
                             admission admissionLimits: AdmissionLimits? = nil,
                             eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
                             lookup: @escaping PSKLookup) async throws -> PSKTLSServer {
        let context = try PSKTLSContext(role: .server, configuration: configuration)
        let limits = admissionLimits ?? defaultAdmission(for: configuration)
        if let problem = limits.problem {
            throw PSKTLSError(.invalidConfiguration, role: .server, detail: "admission limits: \(problem)")
        }
        let admission = AdmissionController<String>(limits: limits)
        let counters = NIOLockedValueBox(Statistics())
        let connections = AsyncStream<PSKTLSConnection>.makeStream(
            bufferingPolicy: .bufferingOldest(configuration.maximumPendingConnections))
        let failures = AsyncStream<PSKTLSError>.makeStream(
            bufferingPolicy: .bufferingNewest(configuration.maximumBufferedFailures))
        let connectionsContinuation = connections.continuation
        let failuresContinuation = failures.continuation

        let channel = try await ServerBootstrap(group: eventLoopGroup)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.allowRemoteHalfClosure, value: true)
            .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    guard case .success(let ticket) = admission.admit(channel.remoteAddress?.ipAddress ?? "?") else {
                        counters.withLockedValue { $0.refused += 1 }
                        throw ChannelError.inappropriateOperationForState  // closes the child
                    }
                    counters.withLockedValue {
                        $0.open += 1
                        $0.accepted += 1
                    }
                    ticket.release(when: channel.closeFuture)
                    channel.closeFuture.whenComplete { _ in counters.withLockedValue { $0.open -= 1 } }

                    let promise = channel.eventLoop.makePromise(of: PSKTLSNegotiatedParameters.self)
                    try channel.pipeline.syncOperations.addHandler(
                        PSKTLSHandler(serverContext: context, lookup: lookup, handshakePromise: promise))
                    PSKTLSConnection.afterHandshake(on: channel, promise.futureResult).whenComplete { result in
                        switch result {
                        case .success(let connection):
                            ticket.authenticated()
                            counters.withLockedValue { $0.established += 1 }
                            switch connectionsContinuation.yield(connection) {
                            case .enqueued:
                                break
                            case .dropped:
                                // Released here, the connection closes itself.
                                counters.withLockedValue { $0.dropped += 1 }
                            case .terminated:
                                break
                            @unknown default:
                                break
                            }
                        case .failure(let error):
                            counters.withLockedValue { $0.failed += 1 }
                            failuresContinuation.yield(
                                error as? PSKTLSError ?? PSKTLSError(.failed, role: .server, detail: "\(error)"))
                        }
                    }
                }
            }
            .bind(host: host, port: port).get()
        // Sources in their refusal period are refused by the kernel too, before an accept.
        let sourceFilter = ListenerSourceFilter.attach(to: channel, admission: admission)
        guard let localAddress = channel.localAddress else {
            try? await channel.close()
            throw PSKTLSError(.invalidConfiguration, role: .server, detail: "no local address after bind")
        }
        return PSKTLSServer(localAddress: localAddress, serverChannel: channel, context: context, counters: counters,
                            admission: admission, sourceFilter: sourceFilter,
                            connections: (connections.stream, connectionsContinuation),
                            failures: (failures.stream, failuresContinuation))
    }

    /// Stops accepting and ends both streams. Established connections stay open; their owners close them.
    public func close() async {
        try? await serverChannel.close()
        connectionsContinuation.finish()
        failuresContinuation.finish()
    }
}
