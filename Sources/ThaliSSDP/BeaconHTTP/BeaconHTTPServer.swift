import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import ThaliAdmission

/// Bounds of the `/NotificationBeacons` server (the seed: "if the load of requests on the server becomes
/// excessive the server will either filter out excessive requesters or ... not offer the server port for
/// a period of time"). Both happen here: per-requester filtering, and closing the port on global overload.
public struct BeaconHTTPServerLimits: Sendable {
    /// Connections accepted from one source address per `sourceWindow`; more are closed at once. A peer
    /// needs one request per beacon change.
    public var maxRequestsPerSource: Int = 10
    /// The per-source window.
    public var sourceWindow: Duration = .seconds(10)
    /// Source addresses remembered for the per-source limit (bounds its memory).
    public var maxTrackedSources: Int = 4096
    /// Connections accepted from everyone per `globalWindow`; beyond it the port closes.
    public var maxRequestsGlobal: Int = 200
    /// The global window.
    public var globalWindow: Duration = .seconds(1)
    /// How long the port stays closed after a global overload.
    public var overloadClosePeriod: Duration = .seconds(30)
    /// Connections open at once; more are closed at once.
    public var maxConcurrentConnections: Int = 64
    /// Time a connection may take to send its request and receive the answer, beyond two retransmission
    /// timeouts of its round trip as the kernel measured it at accept; slow requesters are cut.
    public var connectionTimeout: Duration = .seconds(2)
    /// The longest a connection may take, however slow its path: what a requester that delays its
    /// handshake's last ACK to look slow can hold a connection for.
    public var maxConnectionTimeout: Duration = .seconds(8)
    /// Connections accepted from everyone per `globalWindow` past which the server is busy: a request is
    /// answered `503 Service Unavailable` with `Retry-After` as soon as its head is read (`spec/ssdp.md`
    /// 6.1), long before `maxRequestsGlobal` closes the port. Half of it by default.
    public var busyRequestsGlobal: Int = 100
    /// Connections open at once (the asking one included) past which the server is busy.
    public var busyConcurrentConnections: Int = 48
    /// The longest `Retry-After` of a busy answer: each draws a whole number of seconds from 1 to this.
    public var maxBusyRetryAfter: Duration = .seconds(2)

    /// The defaults above.
    public init() {}

    /// These bounds as the suite's one admission mechanism (ThaliAdmission): per source first (rate; a
    /// source over it is refused until its window ends), then for everyone (concurrent connections; the
    /// global rate, whose excess closes the port). A beacon fetch never authenticates, so concurrent
    /// connections bound both the open and the unauthenticated slots.
    public var admission: AdmissionLimits {
        var admission = AdmissionLimits()
        admission.maxConnectionsPerSource = maxRequestsPerSource
        admission.sourceWindow = sourceWindow
        admission.sourceRefusalPeriod = .zero
        admission.maxTrackedSources = max(maxTrackedSources, maxConcurrentConnections)
        admission.maxOpenPerSource = maxConcurrentConnections
        admission.maxUnauthenticatedPerSource = maxConcurrentConnections
        admission.maxOpenGlobal = maxConcurrentConnections
        admission.maxUnauthenticatedGlobal = maxConcurrentConnections
        admission.maxConnectionsGlobal = maxRequestsGlobal
        admission.globalWindow = globalWindow
        admission.overloadClosePeriod = overloadClosePeriod
        admission.busyConnectionsGlobal = busyRequestsGlobal
        admission.busyUnauthenticatedGlobal = busyConcurrentConnections
        admission.maxBusyRetryAfter = maxBusyRetryAfter
        return admission
    }
}

/// What the beacon server has counted; read with `BeaconHTTPServer.counters`.
public struct BeaconHTTPServerCounters: Hashable, Sendable {
    /// Requests answered (200, 204, 404 or 405).
    public var requestsAnswered = 0
    /// Requests answered `503` with `Retry-After` because the server was busy (`busyRequestsGlobal`).
    public var answeredBusy = 0
    /// Connections closed because their source exceeded `maxRequestsPerSource`.
    public var rejectedPerSource = 0
    /// Connections closed because `maxConcurrentConnections` were open or the global limit was hit.
    public var rejectedGlobal = 0
    /// Times the port was closed for `overloadClosePeriod`.
    public var overloadShutdowns = 0
    /// Connections cut by `connectionTimeout`.
    public var timedOut = 0
    /// All zero.
    public init() {}
}

/// The HTTP server answering `GET /NotificationBeacons` with the advertised stream: 204 when nothing is
/// advertised, else 200 `application/octet-stream`, `Cache-Control: no-cache`. One request per connection.
public final class BeaconHTTPServer: Sendable {
    private struct State: Sendable {
        var beacons: [UInt8]?
        var counters = BeaconHTTPServerCounters()
        var closedUntil: NIODeadline?
        var channel: Channel?
        var stopped = false
    }

    /// The address the server listens on.
    public let host: String
    /// The limits in force.
    public let limits: BeaconHTTPServerLimits
    private let group: EventLoopGroup
    private let state: NIOLockedValueBox<State>
    private let boundPort = NIOLockedValueBox<Int>(0)
    private let overloadHandler: @Sendable (Duration) -> Void
    private let admission: AdmissionController<String>
    private let logger: Logger

    /// A server on `host` (port chosen at `start`). `onOverload` is told when the port closes, and for how long.
    ///
    /// An app that serves beacons on a port of its own (the node's single port, which carries PSK-TLS too)
    /// uses ``configureRequestHandling(on:beacons:)`` behind its own admission instead.
    public init(host: String, limits: BeaconHTTPServerLimits = .init(), group: EventLoopGroup,
                logger: Logger = Logger(label: "thali.ssdp.http-server"),
                onOverload: @escaping @Sendable (Duration) -> Void = { _ in }) {
        self.host = host
        self.limits = limits
        self.group = group
        self.logger = logger
        self.overloadHandler = onOverload
        self.state = NIOLockedValueBox(State())
        // The gate reports an overload back here; a weak link, so the gate does not keep the server alive.
        let overloadTarget = NIOLockedValueBox(WeakServer())
        self.admission = AdmissionController(limits: limits.admission) { _ in
            overloadTarget.withLockedValue { $0.server }?.closeForOverload()
        }
        overloadTarget.withLockedValue { $0.server = self }
    }

    private struct WeakServer: Sendable { weak var server: BeaconHTTPServer? }

    /// What the admission gate has counted (refusals by reason, overloads).
    public var admissionCounters: AdmissionCounters { admission.counters }

    /// Sets up `channel`'s pipeline to answer one `GET /NotificationBeacons` with `beacons()` (nil: 204),
    /// then close. For a listener that does its own admission and timeouts.
    public static func configureRequestHandling(on channel: Channel, beacons: @escaping @Sendable () -> [UInt8]?) throws {
        try configureRequestHandling(on: channel, beacons: beacons, onRequest: nil)
    }

    /// As ``configureRequestHandling(on:beacons:)``, and asks `retryAfterIfBusy` as soon as a request's
    /// head is read: a number of seconds answers a `GET /NotificationBeacons` with `503 Service
    /// Unavailable` and `Retry-After` at once, without reading the rest or serving the stream
    /// (`spec/ssdp.md` 6.1; pass `AdmissionController.retryAfterIfBusy(now:)` (ThaliAdmission) of the port's gate).
    public static func configureRequestHandling(on channel: Channel, beacons: @escaping @Sendable () -> [UInt8]?,
                                                retryAfterIfBusy: @escaping @Sendable () -> Int?) throws {
        let sync = channel.pipeline.syncOperations
        try sync.configureHTTPServerPipeline(withPipeliningAssistance: false, withErrorHandling: true)
        try sync.addHandler(BeaconRequestHandler(beacons: beacons, retryAfterIfBusy: retryAfterIfBusy))
    }

    /// As ``configureRequestHandling(on:beacons:)``, and tells `onRequest` the head of the request it
    /// answers (for a test suite that grades what a client sends).
    public static func configureRequestHandling(on channel: Channel, beacons: @escaping @Sendable () -> [UInt8]?,
                                                onRequest: (@Sendable (HTTPRequestHead) -> Void)?) throws {
        let sync = channel.pipeline.syncOperations
        try sync.configureHTTPServerPipeline(withPipeliningAssistance: false, withErrorHandling: true)
        try sync.addHandler(BeaconRequestHandler(beacons: beacons, onRequest: onRequest))
    }

    /// The port the server is bound to (0 before `start`).
    public var port: Int { boundPort.withLockedValue { $0 } }

    /// What the server has counted so far.
    public var counters: BeaconHTTPServerCounters { state.withLockedValue { $0.counters } }

    /// Whether the port is currently closed because of an overload.
    public var isClosedForOverload: Bool { state.withLockedValue { $0.closedUntil != nil } }

    /// Sets the stream served (nil: answer 204).
    public func setBeacons(_ bytes: [UInt8]?) { state.withLockedValue { $0.beacons = bytes } }

    /// Binds `host:port` (0 picks a free port) and returns the port.
    @discardableResult
    public func start(port: Int = 0) async throws -> Int {
        let channel = try await bind(port: port).get()
        let bound = channel.localAddress?.port ?? port
        boundPort.withLockedValue { $0 = bound }
        state.withLockedValue { $0.channel = channel }
        return bound
    }

    /// Closes the listening port for good.
    public func stop() async {
        let channel = state.withLockedValue { state -> Channel? in
            state.stopped = true
            defer { state.channel = nil }
            return state.channel
        }
        try? await channel?.close()
    }

    private func bind(port: Int) -> EventLoopFuture<Channel> {
        ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .serverChannelOption(.backlog, value: 64)
            .childChannelInitializer { [self] channel in self.admit(channel) }
            .bind(host: host, port: port)
            .map { [admission] channel in
                // Sources in their refusal period are refused by the kernel too, before an accept.
                ListenerSourceFilter.attach(to: channel, admission: admission)
                return channel
            }
    }

    /// Decides, per accepted connection, whether it is served; enforces every limit before any byte is
    /// read: per source first (a refused source costs the global budget nothing), then global.
    private func admit(_ channel: Channel) -> EventLoopFuture<Void> {
        let source = channel.remoteAddress?.ipAddress ?? "?"
        if state.withLockedValue({ $0.stopped }) { return channel.close() }
        let ticket: AdmissionTicket<String>
        switch admission.admit(source) {
        case .success(let admitted):
            ticket = admitted
        case .failure(let refusal):
            state.withLockedValue {
                if refusal.isPerSource { $0.counters.rejectedPerSource += 1 } else { $0.counters.rejectedGlobal += 1 }
            }
            return channel.close()
        }
        ticket.release(when: channel.closeFuture)
        // A path whose handshake the kernel measured slow gets longer (a lost request is retransmitted
        // after the requester's retransmission timeout).
        let limits = self.limits
        let timeout = channel.kernelRoundTrip().map { [state] roundTrip in
            let wait = limits.connectionTimeout.widened(forRoundTrip: roundTrip?.retransmissionTimeout, factor: 2,
                                                        cap: limits.maxConnectionTimeout)
            return channel.eventLoop.scheduleTask(in: TimeAmount(wait)) {
                state.withLockedValue { $0.counters.timedOut += 1 }
                channel.close(promise: nil)
            }
        }
        channel.closeFuture.whenComplete { _ in timeout.whenSuccess { $0.cancel() } }
        return channel.eventLoop.makeCompletedFuture { [state, admission] in
            try Self.configureRequestHandling(on: channel, beacons: {
                state.withLockedValue { state in
                    state.counters.requestsAnswered += 1
                    return state.beacons
                }
            }, retryAfterIfBusy: {
                guard let seconds = admission.retryAfterIfBusy() else { return nil }
                state.withLockedValue { $0.counters.answeredBusy += 1 }
                return seconds
            })
        }
    }

    /// Closes the listening socket for `overloadClosePeriod`, then binds the same port again.
    private func closeForOverload() {
        let channel = state.withLockedValue { state -> Channel? in
            guard state.closedUntil == nil, !state.stopped else { return nil }
            state.closedUntil = .now() + TimeAmount(limits.overloadClosePeriod)
            state.counters.overloadShutdowns += 1
            defer { state.channel = nil }
            return state.channel
        }
        guard let channel else { return }
        logger.warning("beacon server overloaded; port closed", metadata: ["milliseconds": "\(TimeAmount(limits.overloadClosePeriod).nanoseconds / 1_000_000)"])
        channel.close(promise: nil)
        overloadHandler(limits.overloadClosePeriod)
        channel.eventLoop.scheduleTask(in: TimeAmount(limits.overloadClosePeriod)) { [self] in self.reopen() }
    }

    private func reopen() {
        guard !state.withLockedValue({ $0.stopped }) else { return }
        bind(port: port).whenComplete { [self] result in
            switch result {
            case .success(let channel):
                let keep = state.withLockedValue { state -> Bool in
                    state.closedUntil = nil
                    guard !state.stopped else { return false }
                    state.channel = channel
                    return true
                }
                if !keep { channel.close(promise: nil) }
            case .failure(let error):
                logger.error("beacon server could not reopen its port", metadata: ["error": "\(error)"])
                state.withLockedValue { $0.closedUntil = nil }
            }
        }
    }
}

/// Answers one request per connection; only moves bytes between the HTTP codec and the beacon stream.
final class BeaconRequestHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let beacons: @Sendable () -> [UInt8]?
    private var head: HTTPRequestHead?
    /// One answer per connection (`Connection: close`): requests pipelined behind the first are dropped
    /// unread, or one small packet could draw the stream many times over before the close.
    private var answered = false

    private let onRequest: (@Sendable (HTTPRequestHead) -> Void)?
    /// Seconds to send back in `Retry-After` when the server is busy now (nil: it is not).
    private let retryAfterIfBusy: (@Sendable () -> Int?)?

    init(beacons: @escaping @Sendable () -> [UInt8]?, onRequest: (@Sendable (HTTPRequestHead) -> Void)? = nil,
         retryAfterIfBusy: (@Sendable () -> Int?)? = nil) {
        self.beacons = beacons
        self.onRequest = onRequest
        self.retryAfterIfBusy = retryAfterIfBusy
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !answered else { return }
        switch unwrapInboundIn(data) {
        case .head(let head):
            // A busy server answers from the head alone: the cheapest "later" it can give.
            if self.head == nil, head.method == .GET, Self.path(of: head) == BeaconLocation.notificationBeaconsPath,
               let seconds = retryAfterIfBusy?() {
                answered = true
                return respondBusy(context: context, retryAfterSeconds: seconds)
            }
            self.head = self.head ?? head
        case .body: break  // a GET has none; whatever arrives is dropped, not buffered
        case .end:
            guard let head else { return }
            answered = true
            onRequest?(head)
            respond(context: context, to: head)
        }
    }

    private static func path(of head: HTTPRequestHead) -> String {
        head.uri.split(separator: "?", maxSplits: 1).first.map(String.init) ?? head.uri
    }

    /// `503 Service Unavailable`, `Retry-After: seconds`, no body; the connection closes after it.
    private func respondBusy(context: ChannelHandlerContext, retryAfterSeconds: Int) {
        let headers = HTTPHeaders([("Connection", "close"), ("Retry-After", String(retryAfterSeconds)), ("Content-Length", "0")])
        finish(context: context, head: HTTPResponseHead(version: .http1_1, status: .serviceUnavailable, headers: headers), body: [])
    }

    private func respond(context: ChannelHandlerContext, to head: HTTPRequestHead) {
        let path = Self.path(of: head)
        var headers = HTTPHeaders([("Connection", "close")])
        let status: HTTPResponseStatus
        var body: [UInt8] = []
        if path != BeaconLocation.notificationBeaconsPath {
            status = .notFound
        } else if head.method != .GET {
            status = .methodNotAllowed
            headers.add(name: "Allow", value: "GET")
        } else if let stream = beacons() {
            status = .ok
            body = stream
            headers.add(name: "Content-Type", value: "application/octet-stream")
            headers.add(name: "Cache-Control", value: "no-cache")
        } else {
            status = .noContent
        }
        if status != .noContent { headers.add(name: "Content-Length", value: String(body.count)) }
        finish(context: context, head: HTTPResponseHead(version: .http1_1, status: status, headers: headers), body: body)
    }

    private func finish(context: ChannelHandlerContext, head: HTTPResponseHead, body: [UInt8]) {
        context.write(wrapOutboundOut(.head(head)), promise: nil)
        if !body.isEmpty {
            context.write(wrapOutboundOut(.body(.byteBuffer(context.channel.allocator.buffer(bytes: body)))), promise: nil)
        }
        context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { [channel = context.channel] _ in
            channel.close(promise: nil)
        }
    }
}
