import NIOCore
import NIOHTTP1
import NIOPosix

/// A response as the probe saw it, with the body cut at the configured bound.
struct ProbeResponse: Sendable {
    /// The status line and headers.
    var head: HTTPResponseHead
    /// The body bytes read: at most `maxBodyBytes + 1` (one more proves the bound was exceeded).
    var body: [UInt8]
    /// True when the body (read or declared by Content-Length) exceeded `maxBodyBytes`; reading stopped.
    var exceededBodyLimit: Bool
    /// False when the connection ended before the response did.
    var complete: Bool
}

/// What one request got back.
enum ProbeOutcome: Sendable {
    /// A response head arrived (the body may be cut or incomplete; see `ProbeResponse`).
    case response(ProbeResponse)
    /// No TCP connection: refused, reset or unreachable.
    case connectFailed(String)
    /// No TCP connection within `connectTimeout`.
    case connectTimedOut
    /// Connected, but the response did not end within `responseTimeout`.
    case timedOut
    /// The server closed (or reset) the connection before any response head.
    case closedWithoutResponse
    /// More raw bytes than the head and body bounds allow arrived; the connection was cut.
    case tooLarge
    /// The bytes were not an HTTP/1.x response.
    case malformed(String)
}

/// One request sent down a probe connection; the handler completes `promise` exactly once.
struct ProbeRequest: Sendable {
    var method: HTTPMethod
    var path: String
    var keepAlive: Bool
    var promise: EventLoopPromise<ProbeOutcome>
}

/// One TCP connection of the probe: requests go one at a time, each bounded by `responseTimeout`.
struct ProbeConnection: Sendable {
    let channel: Channel
    let responseTimeout: TimeAmount

    /// Connects to `host:port`; a failure is returned as the outcome the request would have had.
    static func open(host: String, port: Int, configuration: ProbeConfiguration,
                     group: EventLoopGroup) async -> Result<ProbeConnection, ProbeOutcomeError> {
        let rawLimit = ProbeByteLimitHandler.rawLimit(configuration)
        let maxBody = configuration.maxBodyBytes
        do {
            let channel = try await ClientBootstrap(group: group)
                .connectTimeout(configuration.connectTimeout)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        let sync = channel.pipeline.syncOperations
                        try sync.addHandler(ProbeByteLimitHandler(limit: rawLimit))
                        try sync.addHTTPClientHandlers()
                        try sync.addHandler(ProbeExchangeHandler(host: host, maxBodyBytes: maxBody))
                    }
                }
                .connect(host: host, port: port).get()
            return .success(ProbeConnection(channel: channel, responseTimeout: configuration.responseTimeout))
        } catch ChannelError.connectTimeout {
            return .failure(ProbeOutcomeError(outcome: .connectTimedOut))
        } catch {
            return .failure(ProbeOutcomeError(outcome: .connectFailed("\(error)")))
        }
    }

    /// Sends one request and waits for its outcome (at most `responseTimeout`).
    func exchange(_ method: HTTPMethod, _ path: String, keepAlive: Bool) async -> ProbeOutcome {
        let promise = channel.eventLoop.makePromise(of: ProbeOutcome.self)
        let timeout = channel.eventLoop.scheduleTask(in: responseTimeout) { [channel] in
            promise.succeed(.timedOut)  // no-op if the response came first
            channel.close(promise: nil)
        }
        promise.futureResult.whenComplete { _ in timeout.cancel() }
        channel.writeAndFlush(ProbeRequest(method: method, path: path, keepAlive: keepAlive, promise: promise),
                              promise: nil)
        return (try? await promise.futureResult.get()) ?? .closedWithoutResponse
    }

    /// Whether the server has not closed the connection (yet).
    var isActive: Bool { channel.isActive }

    /// Waits up to `timeout` for the server to close the connection; true if it did.
    func waitForClose(within timeout: TimeAmount) async -> Bool {
        let promise = channel.eventLoop.makePromise(of: Bool.self)
        let task = channel.eventLoop.scheduleTask(in: timeout) { promise.succeed(false) }
        channel.closeFuture.whenComplete { _ in
            task.cancel()
            promise.succeed(true)
        }
        return (try? await promise.futureResult.get()) ?? false
    }

    /// Closes the connection.
    func close() async { try? await channel.close() }
}

/// A failed connect, carried as the outcome it stands for.
struct ProbeOutcomeError: Error {
    var outcome: ProbeOutcome
}

extension ProbeConnection {
    /// Connects, sends one request with `Connection: close`, closes: the probe's usual exchange.
    static func oneShot(_ method: HTTPMethod, _ path: String, host: String, port: Int,
                        configuration: ProbeConfiguration, group: EventLoopGroup) async -> ProbeOutcome {
        switch await open(host: host, port: port, configuration: configuration, group: group) {
        case .failure(let error):
            return error.outcome
        case .success(let connection):
            let outcome = await connection.exchange(method, path, keepAlive: false)
            await connection.close()
            return outcome
        }
    }
}

/// Cuts the connection once more raw bytes arrive than a bounded response can need, before the HTTP
/// decoder buffers them (a head without end, or chunk framing around an endless body).
final class ProbeByteLimitHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    /// Raw bytes allowed per connection: the head bound, the body bound plus one, and as much again for
    /// chunk framing, per request a connection may carry (the probe sends at most two).
    static func rawLimit(_ configuration: ProbeConfiguration) -> Int {
        2 * (configuration.maxHeadBytes + 2 * (configuration.maxBodyBytes + 1))
    }

    struct LimitExceeded: Error {}

    private let limit: Int
    private var received = 0

    init(limit: Int) { self.limit = limit }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        received += unwrapInboundIn(data).readableBytes
        guard received <= limit else {
            context.fireErrorCaught(LimitExceeded())
            context.close(promise: nil)
            return
        }
        context.fireChannelRead(data)
    }
}

/// Writes each `ProbeRequest` and turns the response parts into its `ProbeOutcome`; only moves bytes.
final class ProbeExchangeHandler: ChannelDuplexHandler {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundIn = ProbeRequest
    typealias OutboundOut = HTTPClientRequestPart

    private let host: String
    private let maxBodyBytes: Int
    private var pending: EventLoopPromise<ProbeOutcome>?
    private var head: HTTPResponseHead?
    private var body: [UInt8] = []

    init(host: String, maxBodyBytes: Int) {
        self.host = host
        self.maxBodyBytes = maxBodyBytes
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let request = unwrapOutboundIn(data)
        guard pending == nil, context.channel.isActive else {
            request.promise.succeed(.closedWithoutResponse)
            promise?.succeed(())
            return
        }
        pending = request.promise
        head = nil
        body = []
        var headers = HTTPHeaders([("Host", host), ("Connection", request.keepAlive ? "keep-alive" : "close"),
                                   ("User-Agent", "thali-node-conformance-probe")])
        if request.method == .POST { headers.add(name: "Content-Length", value: "0") }
        let requestHead = HTTPRequestHead(version: .http1_1, method: request.method, uri: request.path, headers: headers)
        context.write(wrapOutboundOut(.head(requestHead)), promise: nil)
        context.write(wrapOutboundOut(.end(nil)), promise: promise)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard pending != nil else { return }  // bytes nobody asked for are dropped
        switch unwrapInboundIn(data) {
        case .head(let responseHead):
            // Informational heads (100 Continue) precede the real one.
            if (100..<200).contains(responseHead.status.code), responseHead.status != .switchingProtocols { return }
            head = responseHead
            if let declared = responseHead.headers.first(name: "Content-Length").flatMap({ Int($0) }),
                declared > maxBodyBytes
            {
                finish(context, exceeded: true, complete: false)
            }
        case .body(var buffer):
            guard head != nil else { return }
            let room = maxBodyBytes + 1 - body.count
            if buffer.readableBytes >= room {
                body += buffer.readBytes(length: room) ?? []
                finish(context, exceeded: true, complete: false)
            } else {
                body += buffer.readBytes(length: buffer.readableBytes) ?? []
            }
        case .end:
            finish(context, exceeded: false, complete: true)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        if error is ProbeByteLimitHandler.LimitExceeded {
            complete(.tooLarge)
        } else if head != nil || error is IOError || error is ChannelError {
            // After the head, a parse error is an end of file inside the body (or broken framing):
            // the response is incomplete rather than not HTTP at all.
            connectionEnded()
        } else {
            complete(.malformed("\(error)"))
        }
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        connectionEnded()
        context.fireChannelInactive()
    }

    private func connectionEnded() {
        if let head {
            complete(.response(ProbeResponse(head: head, body: body, exceededBodyLimit: false, complete: false)))
        } else {
            complete(.closedWithoutResponse)
        }
    }

    private func finish(_ context: ChannelHandlerContext, exceeded: Bool, complete isComplete: Bool) {
        guard let head else { return }
        complete(.response(ProbeResponse(head: head, body: body, exceededBodyLimit: exceeded, complete: isComplete)))
        if exceeded { context.close(promise: nil) }
    }

    private func complete(_ outcome: ProbeOutcome) {
        guard let promise = pending else { return }
        pending = nil
        head = nil
        body = []
        promise.succeed(outcome)
    }
}
