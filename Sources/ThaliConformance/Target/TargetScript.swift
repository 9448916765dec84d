import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import ThaliBeacons
import ThaliNodeCore
import ThaliSSDP

/// The datagrams target mode sends, written out byte for byte (some deliberately broken).
struct TargetDatagrams {
    /// The `HOST` header: group:port.
    let host: String

    func alive(nt: String = ThaliServiceName.notificationType, usn: String, location: String, maxAge: Int = 30) -> [UInt8] {
        Array(("NOTIFY * HTTP/1.1\r\nHOST: \(host)\r\nCACHE-CONTROL: max-age=\(maxAge)\r\nLOCATION: \(location)\r\nNT: \(nt)\r\n"
               + "NTS: ssdp:alive\r\nUSN: \(usn)\r\n\r\n").utf8)
    }

    func byebye(usn: String) -> [UInt8] {
        Array("NOTIFY * HTTP/1.1\r\nHOST: \(host)\r\nNT: \(ThaliServiceName.notificationType)\r\nNTS: ssdp:byebye\r\nUSN: \(usn)\r\n\r\n".utf8)
    }

    /// What each of ``malformedAlives(locations:)`` breaks, in order: the report names the forms an
    /// implementation acted on.
    static let malformedForms = ["an HTTP/1.0 start line", "LF line endings", "NT twice", "NTS ssdp:update",
                                 "CACHE-CONTROL without max-age", "a folded header line", "bytes after the blank line"]

    /// Alives that break spec/ssdp.md §3 one rule each (``malformedForms``), each naming its own location
    /// of `locations` (so a fetch tells which form was taken), each with a fresh USN; as many as both
    /// lists have.
    func malformedAlives(locations: [String]) -> [[UInt8]] {
        let nt = ThaliServiceName.notificationType
        let good = { (location: String) in
            ["HOST: \(host)", "CACHE-CONTROL: max-age=30", "LOCATION: \(location)", "NT: \(nt)", "NTS: ssdp:alive",
             "USN: \(ThaliServiceName.makeUniqueServiceName())"]
        }
        func datagram(_ start: String, _ lines: [String], ending: String = "\r\n", trailer: String = "") -> [UInt8] {
            Array((([start] + lines).map { $0 + ending }.joined() + ending + trailer).utf8)
        }
        let forms: [(String) -> [UInt8]] = [
            { datagram("NOTIFY * HTTP/1.0", good($0)) },
            { datagram("NOTIFY * HTTP/1.1", good($0), ending: "\n") },
            { datagram("NOTIFY * HTTP/1.1", good($0) + ["NT: \(nt)"]) },
            { datagram("NOTIFY * HTTP/1.1", good($0).map { $0 == "NTS: ssdp:alive" ? "NTS: ssdp:update" : $0 }) },
            { datagram("NOTIFY * HTTP/1.1", good($0).map { $0.hasPrefix("CACHE-CONTROL") ? "CACHE-CONTROL: no-cache" : $0 }) },
            { datagram("NOTIFY * HTTP/1.1", good($0).map { $0.hasPrefix("NT:") ? "NT:\r\n \(nt)" : $0 }) },
            { datagram("NOTIFY * HTTP/1.1", good($0), trailer: "tail") },
        ]
        return zip(forms, locations).map { form, location in form(location) }
    }
}

/// A beacon location of the script: answers `GET /NotificationBeacons` with its body and counts the
/// fetches; any other connection (a TLS ClientHello, anything not HTTP) is counted and closed.
final class ScriptedLocation: Sendable {
    private let channel: Channel
    private let counts: NIOLockedValueBox<(fetches: Int, other: Int)>
    private let replies: NIOLockedValueBox<[TLSReply]>
    private let times: NIOLockedValueBox<[NIODeadline]>
    /// The LOCATION naming it.
    let url: String

    /// How many beacon requests have their time kept (``fetchTimes``).
    static let maxRecordedFetchTimes = 64

    /// The longest request head read before the connection is closed.
    static let maxRequestBytes = 8 * 1024

    private init(channel: Channel, counts: NIOLockedValueBox<(fetches: Int, other: Int)>, replies: NIOLockedValueBox<[TLSReply]>,
                 times: NIOLockedValueBox<[NIODeadline]>, url: String) {
        self.times = times
        self.channel = channel
        self.counts = counts
        self.replies = replies
        self.url = url
    }

    /// With a TLS flight: what each TLS client answered to it, in order.
    var tlsReplies: [TLSReply] { replies.withLockedValue { $0 } }

    /// The port it listens on.
    var port: Int { channel.localAddress?.port ?? 0 }

    /// Beacon requests answered.
    var fetches: Int { counts.withLockedValue { $0.fetches } }
    /// Connections that were not a beacon request.
    var otherConnections: Int { counts.withLockedValue { $0.other } }
    /// When each beacon request came (the first ``maxRecordedFetchTimes``).
    var fetchTimes: [NIODeadline] { times.withLockedValue { $0 } }

    /// Listens on `host`; with `tlsFlight`, a connection that starts with a TLS record gets those bytes
    /// after its first record, and what it answers is recorded (``tlsReplies``). With `busyRetryAfter`, the
    /// first beacon request is answered `503` with that `Retry-After` (seconds), the later ones as usual.
    /// `status` and `contentType` are those of the answer that carries `body` (a client must take only
    /// `200` with `application/octet-stream`).
    static func start(host: String, body: [UInt8], tlsFlight: [UInt8]? = nil, busyRetryAfter: Int? = nil,
                      status: String = "200 OK", contentType: String = "application/octet-stream",
                      group: EventLoopGroup) async throws -> ScriptedLocation {
        let counts = NIOLockedValueBox((fetches: 0, other: 0))
        let replies = NIOLockedValueBox<[TLSReply]>([])
        let times = NIOLockedValueBox<[NIODeadline]>([])
        let channel = try await ServerBootstrap(group: group)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(ScriptedLocationHandler(body: body, counts: counts, tlsFlight: tlsFlight,
                                                                                           replies: replies, times: times,
                                                                                           busyRetryAfter: busyRetryAfter,
                                                                                           status: status, contentType: contentType))
                }
            }
            .bind(host: host, port: 0).get()
        return ScriptedLocation(channel: channel, counts: counts, replies: replies, times: times,
                                url: "http://\(host):\(channel.localAddress?.port ?? 0)/")
    }

    func close() { channel.close(promise: nil) }
}

/// Reads a request head (bounded), answers a beacon GET, counts the rest; only moves bytes.
private final class ScriptedLocationHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    private let body: [UInt8]
    private let counts: NIOLockedValueBox<(fetches: Int, other: Int)>
    private let tlsFlight: [UInt8]?
    private let replies: NIOLockedValueBox<[TLSReply]>
    private let times: NIOLockedValueBox<[NIODeadline]>
    private let busyRetryAfter: Int?
    private let status: String
    private let contentType: String
    private var head: [UInt8] = []
    private var done = false
    private var flightSent = false

    init(body: [UInt8], counts: NIOLockedValueBox<(fetches: Int, other: Int)>, tlsFlight: [UInt8]?, replies: NIOLockedValueBox<[TLSReply]>,
         times: NIOLockedValueBox<[NIODeadline]>, busyRetryAfter: Int?, status: String, contentType: String) {
        self.status = status
        self.contentType = contentType
        self.times = times
        self.busyRetryAfter = busyRetryAfter
        self.body = body
        self.counts = counts
        self.tlsFlight = tlsFlight
        self.replies = replies
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !done else { return }
        head += unwrapInboundIn(data).readableBytesView
        if let tlsFlight, head.first == 0x16 || flightSent {
            scriptTLS(context, flight: tlsFlight)
        } else if head.first != UInt8(ascii: "G") || head.count > ScriptedLocation.maxRequestBytes {
            finish(context, fetch: false)
        } else if head.count >= 4, head.suffix(4) == Array("\r\n\r\n".utf8) {
            let isBeaconRequest = head.starts(with: Array("GET /NotificationBeacons ".utf8))
            if isBeaconRequest {
                let first = times.withLockedValue { times in
                    defer { if times.count < ScriptedLocation.maxRecordedFetchTimes { times.append(.now()) } }
                    return times.isEmpty
                }
                var response: ByteBuffer
                if let busyRetryAfter, first {
                    response = context.channel.allocator.buffer(
                        string: "HTTP/1.1 503 Service Unavailable\r\nRetry-After: \(busyRetryAfter)\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                } else {
                    response = context.channel.allocator.buffer(
                        string: "HTTP/1.1 \(status)\r\nContent-Type: \(contentType)\r\nContent-Length: \(body.count)\r\nConnection: close\r\n\r\n")
                    response.writeBytes(body)
                }
                context.writeAndFlush(wrapOutboundOut(response), promise: nil)
            }
            finish(context, fetch: isBeaconRequest)
        }
    }

    /// Answers the client's first record with `flight`, then records the first record it sends back.
    private func scriptTLS(_ context: ChannelHandlerContext, flight: [UInt8]) {
        guard head.count >= 5, head.count <= ScriptedLocation.maxRequestBytes else {
            if head.count > ScriptedLocation.maxRequestBytes { finish(context, fetch: false) }
            return
        }
        let length = 5 + Int(head[3]) << 8 + Int(head[4])
        guard head.count >= length else { return }
        if !flightSent {
            flightSent = true
            head.removeFirst(length)
            context.writeAndFlush(wrapOutboundOut(context.channel.allocator.buffer(bytes: flight)), promise: nil)
            if head.count >= 5 { scriptTLS(context, flight: flight) }
            return
        }
        let reply: TLSReply = head[0] == 0x15 && length >= 7 ? .alert(head[5], head[6]) : .continued
        replies.withLockedValue { $0.append(reply) }
        finish(context, fetch: false)
    }

    func channelInactive(context: ChannelHandlerContext) {
        if flightSent && !done {
            done = true
            replies.withLockedValue { $0.append(.closed) }
        }
        context.fireChannelInactive()
    }

    private func finish(_ context: ChannelHandlerContext, fetch: Bool) {
        done = true
        counts.withLockedValue { fetch ? ($0.fetches += 1) : ($0.other += 1) }
        context.close(promise: nil)
    }
}

/// A UDP socket that multicasts datagrams to the SSDP group from one address.
final class MulticastSender: Sendable {
    private let channel: Channel
    private let destination: SocketAddress

    private init(channel: Channel, destination: SocketAddress) {
        self.channel = channel
        self.destination = destination
    }

    /// Binds to `address` and multicasts on the interface that has `multicastInterface` (default: `address`).
    static func start(address: String, multicastInterface: String? = nil, group: String, port: Int,
                      on eventLoopGroup: EventLoopGroup) async throws -> MulticastSender {
        guard case .v4(let interface) = try SocketAddress(ipAddress: multicastInterface ?? address, port: 0) else {
            throw SocketAddressError.failedToParseIPString(multicastInterface ?? address)
        }
        let channel = try await DatagramBootstrap(group: eventLoopGroup).bind(host: address, port: 0).get()
        if let options = channel as? SocketOptionProvider {
            try await options.setIPMulticastIF(interface.address.sin_addr).get()
            try await options.setIPMulticastLoop(1).get()
        }
        return MulticastSender(channel: channel, destination: try SocketAddress(ipAddress: group, port: port))
    }

    func send(_ bytes: [UInt8]) async throws {
        try await channel.writeAndFlush(AddressedEnvelope(remoteAddress: destination, data: channel.allocator.buffer(bytes: bytes)))
    }

    /// The address its datagrams come from.
    var localAddress: SocketAddress? { channel.localAddress }

    func close() { channel.close(promise: nil) }
}
