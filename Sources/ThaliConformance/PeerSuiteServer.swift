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
        /// A PSK-TLS handshake authenticated it.
        case authenticated
        /// A handshake failed (its reason).
        case handshakeFailed(String)
        /// It opened a stream, set up for the delivery protocol.
        case stream(DeliveryChannel.AsyncFrames)
        /// It fetched our beacons.
        case beaconsFetched
        /// A wait scheduled with ``wake(after:id:)`` ended.
        case wake(Int)
    }

    let channel: Channel
    /// Events in the order they happened.
    let events: AsyncStream<Event>
    private let sink: AsyncStream<Event>.Continuation
    private let beacons: NIOLockedValueBox<[UInt8]?>
    private let table: AdvertisedPSKTable
    private let requests: NIOLockedValueBox<[HTTPRequestHead]>

    /// How many beacon request heads are kept for grading; later ones are not recorded.
    static let maxRecordedRequests = 8

    private init(channel: Channel, events: AsyncStream<Event>, sink: AsyncStream<Event>.Continuation,
                 beacons: NIOLockedValueBox<[UInt8]?>, table: AdvertisedPSKTable,
                 requests: NIOLockedValueBox<[HTTPRequestHead]>) {
        self.channel = channel
        self.events = events
        self.sink = sink
        self.beacons = beacons
        self.table = table
        self.requests = requests
    }

    /// The heads of the beacon requests answered so far, oldest first (at most ``maxRecordedRequests``).
    var beaconRequests: [HTTPRequestHead] { requests.withLockedValue { $0 } }

    /// Adds `.wake(id)` to ``events`` after `delay`: a reader of the events waits for one of them or a
    /// deadline, without a second task.
    func wake(after delay: TimeAmount, id: Int) {
        let sink = self.sink
        channel.eventLoop.scheduleTask(in: delay) { sink.yield(.wake(id)) }
    }

    /// The bound port.
    var port: Int { channel.localAddress?.port ?? 0 }

    /// Listens on `host`, port 0, accepting PSK-TLS only from `peer`.
    static func start(host: String, peer: PublicKey, limits: DeliveryLimits, group: EventLoopGroup) async throws -> PeerSuiteServer {
        let (events, sink) = AsyncStream.makeStream(of: Event.self, bufferingPolicy: .bufferingNewest(64))
        let beacons = NIOLockedValueBox<[UInt8]?>(nil)
        let table = AdvertisedPSKTable()
        let requests = NIOLockedValueBox<[HTTPRequestHead]>([])
        let record: @Sendable (HTTPRequestHead) -> Void = { head in
            requests.withLockedValue { if $0.count < maxRecordedRequests { $0.append(head) } }
            sink.yield(.beaconsFetched)
        }
        let context = try PSKTLSContext(role: .server, configuration: PSKTLSConfiguration(dhGroup: .ffdhe2048))
        let channel = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.allowRemoteHalfClosure, value: true)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(ConnectionKindSniffer(http: { channel in
                        try BeaconHTTPServer.configureRequestHandling(on: channel, beacons: { beacons.withLockedValue { $0 } },
                                                                      onRequest: record)
                    }, secure: { channel in
                        AuthenticatedSession.configureServer(on: channel, context: context, lookup: { (identity: String) -> (psk: [UInt8], peer: PublicKey)? in
                            guard let entry = table.lookup(identity: identity), entry.contact == peer else { return nil }
                            return (psk: entry.psk, peer: entry.contact)
                        }, inboundStream: { (stream: Channel, _: PublicKey) in
                            stream.eventLoop.makeCompletedFuture {
                                let frames = try DeliveryChannel.configureSynchronously(stream, limits: limits)
                                sink.yield(.stream(frames))
                            }
                        }).map { server in
                            server.peer.whenComplete { result in
                                switch result {
                                case .success: sink.yield(.authenticated)
                                case .failure(let error): sink.yield(.handshakeFailed("\(error)"))
                                }
                            }
                        }
                    }))
                }
            }
            .bind(host: host, port: 0).get()
        return PeerSuiteServer(channel: channel, events: events, sink: sink, beacons: beacons, table: table,
                               requests: requests)
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
