import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import TCPMultiplexer
import ThaliBeacons
import ThaliNodeCore
import ThaliPSKTLS
import ThaliSSDP

/// The suite's own one port for the sender role, as a Thali peer's (spec/node.md, "One port"): beacon
/// requests and PSK-TLS on the same port, told apart by the first byte. PSK-TLS accepts only the
/// implementation under test, with the PSKs of the announcement the suite serves for it; each stream it
/// opens is handed to the run as a delivery channel.
final class PeerSuiteServer: Sendable {
    /// What the implementation under test did on our port.
    enum Event: Sendable {
        /// A PSK-TLS handshake authenticated it; `marked`: it agreed on `thali-streams/1`.
        case authenticated(marked: Bool)
        /// On a marked session it opened a stream with this header (or none), and we answered `status`.
        case markedStream(MarkedStreamAcceptor.Header, StreamStatus)
        /// A marked stream we refused was closed by it (it ended within ``markedStreamTimeout``, or we did).
        case refusedStreamEnded
        /// A handshake failed (its reason).
        case handshakeFailed(String)
        /// It opened a stream, set up for the delivery protocol.
        case stream(DeliveryChannel.AsyncFrames)
        /// It fetched our beacons.
        case beaconsFetched
        /// A wait scheduled with ``wake(after:id:)`` ended.
        case wake(Int)
        /// An authenticated session's connection closed, ended as this says [PSK-6.1].
        case sessionEnded(SessionEnd)
    }

    let channel: Channel
    /// Events in the order they happened.
    let events: AsyncStream<Event>
    private let sink: AsyncStream<Event>.Continuation
    private let beacons: NIOLockedValueBox<[UInt8]?>
    private let table: AdvertisedPSKTable
    private let requests: NIOLockedValueBox<[HTTPRequestHead]>
    private let policy: NIOLockedValueBox<MarkingPolicy>
    private let fetches: NIOLockedValueBox<Int>

    /// Whether the suite's server marks streams, and how it answers the header of a marked stream the
    /// implementation opens.
    enum MarkingPolicy: Sendable {
        /// The server knows no ALPN protocol: every session is unmarked, as with a peer from before marking.
        case unmarked
        /// A `delivery` header is accepted (and the stream played as a delivery sender); any other kind,
        /// or a malformed header, is refused as spec/node.md says.
        case acceptDelivery
        /// Every stream is refused with this.
        case refuse(StreamRefusal)
    }

    /// How long a marked stream's header may take, and how long a refused stream is left for the
    /// implementation to close before we do: longer than target mode's observation, so that an end seen
    /// within it is the implementation's.
    static let markedStreamTimeout: TimeAmount = .seconds(10)

    /// How many beacon request heads are kept for grading; later ones are not recorded.
    static let maxRecordedRequests = 8

    private init(channel: Channel, events: AsyncStream<Event>, sink: AsyncStream<Event>.Continuation,
                 beacons: NIOLockedValueBox<[UInt8]?>, table: AdvertisedPSKTable,
                 requests: NIOLockedValueBox<[HTTPRequestHead]>, policy: NIOLockedValueBox<MarkingPolicy>,
                 fetches: NIOLockedValueBox<Int>) {
        self.fetches = fetches
        self.policy = policy
        self.channel = channel
        self.events = events
        self.sink = sink
        self.beacons = beacons
        self.table = table
        self.requests = requests
    }

    /// The heads of the beacon requests answered so far, oldest first (at most ``maxRecordedRequests``).
    var beaconRequests: [HTTPRequestHead] { requests.withLockedValue { $0 } }

    /// How many beacon requests were answered so far (all of them, unlike ``beaconRequests``).
    var fetchCount: Int { fetches.withLockedValue { $0 } }

    /// Adds `.wake(id)` to ``events`` after `delay`: a reader of the events waits for one of them or a
    /// deadline, without a second task.
    func wake(after delay: TimeAmount, id: Int) {
        let sink = self.sink
        channel.eventLoop.scheduleTask(in: delay) { sink.yield(.wake(id)) }
    }

    /// The bound port.
    var port: Int { channel.localAddress?.port ?? 0 }

    /// Listens on `host`, port 0, accepting PSK-TLS only from `peer`. Unless `marking` (see ``mark(_:)``)
    /// is ``MarkingPolicy/unmarked``, the server selects ALPN `thali-streams/1` when offered and answers each
    /// marked stream's header by the policy; an unmarked session's streams are delivery streams.
    static func start(host: String, peer: PublicKey, limits: DeliveryLimits, marking: MarkingPolicy = .unmarked,
                      group: EventLoopGroup) async throws -> PeerSuiteServer {
        let (events, sink) = AsyncStream.makeStream(of: Event.self, bufferingPolicy: .bufferingNewest(64))
        let beacons = NIOLockedValueBox<[UInt8]?>(nil)
        let table = AdvertisedPSKTable()
        let requests = NIOLockedValueBox<[HTTPRequestHead]>([])
        let fetches = NIOLockedValueBox(0)
        let record: @Sendable (HTTPRequestHead) -> Void = { head in
            requests.withLockedValue { if $0.count < maxRecordedRequests { $0.append(head) } }
            fetches.withLockedValue { $0 += 1 }
            sink.yield(.beaconsFetched)
        }
        let policy = NIOLockedValueBox(marking)
        var tls = PSKTLSConfiguration(dhGroup: .ffdhe2048)
        let plain = try PSKTLSContext(role: .server, configuration: tls)
        tls.applicationProtocols = [StreamHeader.alpnProtocol]
        let marks = try PSKTLSContext(role: .server, configuration: tls)
        let channel = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.allowRemoteHalfClosure, value: true)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(ConnectionKindSniffer(http: { channel in
                        try BeaconHTTPServer.configureRequestHandling(on: channel, beacons: { beacons.withLockedValue { $0 } },
                                                                      onRequest: record)
                    }, secure: { channel in
                        let unmarked = policy.withLockedValue { if case .unmarked = $0 { true } else { false } }
                        return AuthenticatedSession.configureServer(on: channel, context: unmarked ? plain : marks, lookup: {
                            (identity: String) -> (psk: [UInt8], peer: PublicKey)? in
                            guard let entry = table.lookup(identity: identity), entry.contact == peer else { return nil }
                            return (psk: entry.psk, peer: entry.contact)
                        }, inboundStream: { (stream: Channel, _: PublicKey, parameters: PSKTLSNegotiatedParameters) in
                            stream.eventLoop.makeCompletedFuture {
                                guard parameters.applicationProtocol == StreamHeader.alpnProtocol else {
                                    sink.yield(.stream(try DeliveryChannel.configureSynchronously(stream, limits: limits, dataDelivery: .wholeFrames)))
                                    return
                                }
                                try acceptMarked(stream, policy: policy, limits: limits, sink: sink)
                            }
                        }).flatMapThrowing { server in
                            // Last, behind the multiplexer, which hands on every event and error it is given.
                            try channel.pipeline.syncOperations.addHandler(SessionEndRecorder { sink.yield(.sessionEnded($0)) })
                            server.peer.and(server.handshake).whenComplete { result in
                                switch result {
                                case .success(let (_, parameters)):
                                    sink.yield(.authenticated(marked: parameters.applicationProtocol == StreamHeader.alpnProtocol))
                                case .failure(let error): sink.yield(.handshakeFailed("\(error)"))
                                }
                            }
                        }
                    }))
                }
            }
            .bind(host: host, port: 0).get()
        return PeerSuiteServer(channel: channel, events: events, sink: sink, beacons: beacons, table: table,
                               requests: requests, policy: policy, fetches: fetches)
    }

    /// Reads a marked stream's header and answers it by `policy`: an accepted `delivery` stream becomes
    /// a delivery channel (``Event/stream(_:)``); a refused one is watched until it closes.
    private static func acceptMarked(_ stream: Channel, policy: NIOLockedValueBox<MarkingPolicy>, limits: DeliveryLimits,
                                     sink: AsyncStream<Event>.Continuation) throws {
        try stream.syncOptions?.setOption(.allowRemoteHalfClosure, value: true)
        try stream.pipeline.syncOperations.addHandler(MarkedStreamAcceptor(timeout: markedStreamTimeout, decide: { header in
            switch (policy.withLockedValue { $0 }, header) {
            case (.refuse(let refusal), _): .refused(refusal)
            // Marked when it connected, and no longer: the header is still answered as the spec says.
            case (.unmarked, .kind(.delivery)): .accepted
            case (.acceptDelivery, .kind(.delivery)): .accepted
            case (_, .kind(let kind)):
                .refused(StreamRefusal(kind.appProtocol == nil ? .unknownKind : .notServed, reason: "the conformance suite serves delivery only"))
            case (_, .malformed(let error, _)), (_, .missing(let error)):
                .refused(StreamRefusal(.badHeader, reason: error.description))
            }
        }, accepted: { stream in
            sink.yield(.stream(try DeliveryChannel.configureSynchronously(stream, limits: limits, dataDelivery: .wholeFrames)))
        }, seen: { header, status in
            sink.yield(.markedStream(header, status))
            if case .refused = status { stream.closeFuture.whenComplete { _ in sink.yield(.refusedStreamEnded) } }
        }))
    }

    /// From now on, marks the sessions that offer it and answers their streams by `policy` (or, with
    /// ``MarkingPolicy/unmarked``, selects no ALPN protocol for new sessions).
    func mark(_ policy: MarkingPolicy) {
        self.policy.withLockedValue { $0 = policy }
    }

    /// Serves `announcement` (nil: nothing, `204`) and accepts its PSKs.
    func serve(_ announcement: BeaconAnnouncement?) {
        if let announcement { table.register(announcement) } else { table.removeAll() }
        beacons.withLockedValue { $0 = announcement?.stream }
    }

    /// Stops listening; connections already accepted end with their sessions.
    func close() async {
        sink.finish()
        try? await channel.close()
    }
}

/// How the implementation under test ended an authenticated session on the suite's port [PSK-6.1].
enum SessionEnd: Sendable, Equatable, CustomStringConvertible {
    /// Its close_notify came before the connection closed.
    case closeNotify
    /// TCP closed without its close_notify (`uncleanShutdown`).
    case bareClose
    /// Neither came: we closed first, so how it would have closed is unknown.
    case closedBySuite
    /// The connection failed on something else (the error).
    case failed(String)

    var description: String {
        switch self {
        case .closeNotify: "close_notify, then the connection closed"
        case .bareClose: "TCP closed without close_notify (uncleanShutdown)"
        case .closedBySuite: "neither its close_notify nor a bare close: the suite closed first"
        case .failed(let error): "failed: \(error)"
        }
    }
}

/// Sits at the end of a session's pipeline on the suite's port and notes the first sign of the session's
/// end: the peer's close_notify (`ChannelEvent.inputClosed`, which PSK-TLS fires only for it, half-closure
/// being allowed on the port, and the multiplexer hands on) or TLS's `uncleanShutdown` (TCP closed
/// without it). Once an authenticated session's connection has gone away, hands that sign to `ended`;
/// none means we closed first. Reads nothing itself.
final class SessionEndRecorder: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    private let ended: @Sendable (SessionEnd) -> Void
    private var authenticated = false
    private var end: SessionEnd?

    init(ended: @escaping @Sendable (SessionEnd) -> Void) { self.ended = ended }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case PSKTLSEvent.handshakeCompleted = event { authenticated = true }
        if case ChannelEvent.inputClosed = event { note(.closeNotify) }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if let error = error as? PSKTLSError {
            note(error.reason == .uncleanShutdown ? .bareClose : .failed("\(error)"))
        }
        context.fireErrorCaught(error)
    }

    func channelInactive(context: ChannelHandlerContext) {
        // The multiplexer closes the channel on the close_notify's inputClosed before handing the event on,
        // so the channel goes inactive first: judge once the event that closed it has come too.
        if authenticated {
            context.eventLoop.assumeIsolated().execute { [self] in ended(end ?? .closedBySuite) }
        }
        context.fireChannelInactive()
    }

    private func note(_ sign: SessionEnd) {
        if end == nil { end = sign }
    }
}
