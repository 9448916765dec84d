#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
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
    /// The response head did not end within `maxHeadBytes`; the connection was cut after `received` bytes.
    case tooLarge(received: Int)
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
        let totalLimit = ProbeByteLimitHandler.totalLimit(configuration)
        let headLimit = configuration.maxHeadBytes
        let maxBody = configuration.maxBodyBytes
        do {
            let channel = try await ClientBootstrap(group: group)
                .connectTimeout(TimeAmount(configuration.connectTimeout))
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        let sync = channel.pipeline.syncOperations
                        let limiter = ProbeByteLimitHandler(headLimit: headLimit, totalLimit: totalLimit)
                        try sync.addHandler(limiter)
                        try sync.addHTTPClientHandlers()
                        try sync.addHandler(ProbeExchangeHandler(host: host, maxBodyBytes: maxBody, limiter: limiter))
                    }
                }
                .connect(host: host, port: port).get()
            return .success(ProbeConnection(channel: channel, responseTimeout: TimeAmount(configuration.responseTimeout)))
        } catch ChannelError.connectTimeout {
            return .failure(ProbeOutcomeError(outcome: .connectTimedOut))
        } catch let error as NIOConnectionError {
            // The per-address cause ("Connection refused") says more than the wrapper's description.
            let cause = error.connectionErrors.first.map { failure in
                (failure.error as? IOError).map { String(cString: strerror($0.errnoCode)) } ?? "\(failure.error)"
            } ?? "\(error)"
            return .failure(ProbeOutcomeError(outcome: .connectFailed(cause)))
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
        // On a connection the server already closed the handlers are gone and the write fails at the
        // head of the pipeline: the request never went out, so it was refused, not left unanswered.
        channel.writeAndFlush(ProbeRequest(method: method, path: path, keepAlive: keepAlive, promise: promise))
            .whenFailure { _ in promise.succeed(.closedWithoutResponse) }
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

/// Bounds the raw bytes a connection may deliver, before the HTTP decoder buffers them: while a head is
/// awaited, at most `headLimit` bytes (plus the one read that completes it); over the connection's life,
/// `totalLimit` (a backstop for chunk framing around an endless body). The exchange handler says when a
/// head is awaited and when it arrived.
final class ProbeByteLimitHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    /// Raw bytes allowed per connection: the head bound, the body bound plus one, and as much again for
    /// chunk framing, per request a connection may carry (the probe sends at most two).
    static func totalLimit(_ configuration: ProbeConfiguration) -> Int {
        2 * (configuration.maxHeadBytes + 2 * (configuration.maxBodyBytes + 1))
    }

    /// Raised into the pipeline when a bound is crossed; the connection is then closed.
    struct LimitExceeded: Error {
        /// True when the head bound was crossed, false for the connection's total.
        var inHead: Bool
        /// Raw bytes received on the connection when it was cut.
        var received: Int
    }

    private let headLimit: Int
    private let totalLimit: Int
    private var total = 0
    /// Bytes since a head began to be awaited; nil while none is.
    private var headBytes: Int?

    init(headLimit: Int, totalLimit: Int) {
        self.headLimit = headLimit
        self.totalLimit = totalLimit
    }

    /// A request went out: count bytes against the head bound until `headArrived`.
    func awaitHead() { headBytes = 0 }

    /// The decoder produced the head.
    func headArrived() { headBytes = nil }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let count = unwrapInboundIn(data).readableBytes
        total += count
        guard total <= totalLimit else { return exceeded(context, inHead: false) }
        headBytes = headBytes.map { $0 + count }
        // The decoder parses synchronously: if this read completes the head, `headArrived` runs first.
        context.fireChannelRead(data)
        if let headBytes, headBytes > headLimit { exceeded(context, inHead: true) }
    }

    private func exceeded(_ context: ChannelHandlerContext, inHead: Bool) {
        headBytes = nil
        context.fireErrorCaught(LimitExceeded(inHead: inHead, received: total))
        context.close(promise: nil)
    }
}

/// Writes each `ProbeRequest` and turns the response parts into its `ProbeOutcome`; only moves bytes.
final class ProbeExchangeHandler: ChannelDuplexHandler {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundIn = ProbeRequest
    typealias OutboundOut = HTTPClientRequestPart

    private let host: String
    private let maxBodyBytes: Int
    private let limiter: ProbeByteLimitHandler
    private var pending: EventLoopPromise<ProbeOutcome>?
    private var head: HTTPResponseHead?
    private var body: [UInt8] = []

    init(host: String, maxBodyBytes: Int, limiter: ProbeByteLimitHandler) {
        self.host = host
        self.maxBodyBytes = maxBodyBytes
        self.limiter = limiter
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let request = unwrapOutboundIn(data)
        guard pending == nil, context.channel.isActive else {
            request.promise.succeed(.closedWithoutResponse)
            promise?.succeed(())
            return
        }
        pending = request.promise
        limiter.awaitHead()
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
            limiter.headArrived()
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
        if let limit = error as? ProbeByteLimitHandler.LimitExceeded {
            if limit.inHead || head == nil {
                complete(.tooLarge(received: limit.received))
            } else {
                finish(context, exceeded: true, complete: false)
            }
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
