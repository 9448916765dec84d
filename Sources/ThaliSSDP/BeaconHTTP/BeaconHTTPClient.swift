import NIOCore
import NIOHTTP1
import NIOPosix
import ThaliMutants
import ThaliSupport

/// Bounds and retry policy of beacon fetches (the seed: clients "MUST put in place protections to ensure
/// that the response is not excessively long").
public struct BeaconHTTPClientConfiguration: Sendable {
    /// The shortest wait for the TCP connection, the first attempt's to a host whose round trip is not
    /// known yet. Each further attempt waits twice as long as the one before, and a host whose measured
    /// round trip needs more gets `roundTripFactor` retransmission timeouts (``connectTimeout(forAttempt:roundTrip:)``).
    public var connectTimeout: Duration = .seconds(1)
    /// The longest wait for the TCP connection, however slow the path.
    public var maxConnectTimeout: Duration = .seconds(8)
    /// Time from connected to the end of the response, beyond `roundTripFactor` of the connection's
    /// retransmission timeout as the kernel measured it; a slow peer is cut here.
    public var responseTimeout: Duration = .seconds(2)
    /// The longest time from connected to the end of the response, however slow the path.
    public var maxResponseTimeout: Duration = .seconds(10)
    /// How many retransmission timeouts (`SRTT + 4 × RTTVAR`, ThaliSupport's `RoundTripEstimator`) a
    /// wait allows on top of its floor: 2 leaves room for one lost segment and its retransmission.
    public var roundTripFactor: Double = 2
    /// Largest body accepted; a longer (declared or sent) body is cut. A Thali beacon stream for 1,000
    /// contacts is about 48 KiB.
    public var maxBodyBytes: Int = 64 * 1024
    /// Largest response head (status line and headers).
    public var maxHeadBytes: Int = 8 * 1024
    /// Attempts per fetch, the first included.
    public var maxAttempts: Int = 3
    /// Delay before the second attempt; doubles per attempt.
    public var initialBackoff: Duration = .milliseconds(100)
    /// The largest delay between attempts.
    public var maxBackoff: Duration = .seconds(2)
    /// Random spread of each delay, as a fraction: 0.5 draws from 50%...150% of it.
    public var jitter: Double = 0.5
    /// The wait assumed when a busy server (`503`) names none, or one this client cannot read (an
    /// HTTP date, garbage): `spec/ssdp.md` 6.1.
    public var defaultBusyRetryAfter: Duration = .seconds(5)
    /// The longest wait a busy server's `Retry-After` is believed: a larger one is cut to this, so a
    /// peer cannot make itself unread for long by naming a day.
    public var maxBusyRetryAfter: Duration = .seconds(60)
    /// The local IPv4 address fetches leave from (nil: the kernel picks). Discovery sets its pinned
    /// interface's address, so a peer's fetches come from the address it announces: on a host with
    /// several addresses, the peer's own is the source that other peers' per-source limits see.
    public var sourceAddress: String?

    /// The retry delays: `initialBackoff` doubling up to `maxBackoff`, spread by `jitter`.
    public var backoff: Backoff {
        Backoff(base: initialBackoff, cap: maxBackoff, jitter: jitter)
    }

    /// The defaults above.
    public init() {}
}

/// Why a beacon fetch failed.
public struct BeaconFetchError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The kinds of failure.
    public enum Reason: Hashable, Sendable {
        /// No TCP connection: refused or unreachable.
        case connectFailed(String)
        /// No TCP connection within `connectTimeout`: nothing answered the connect.
        case connectTimedOut
        /// The response did not complete within `responseTimeout`.
        case timedOut
        /// The body (or head) exceeded its bound; the connection was cut.
        case responseTooLarge(limit: Int)
        /// A status other than 200 or 204.
        case unexpectedStatus(Int)
        /// A 200 whose Content-Type is not `application/octet-stream`.
        case unexpectedContentType(String?)
        /// The connection closed before the response ended.
        case connectionClosed
        /// The response was not valid HTTP/1.1.
        case malformedResponse(String)
        /// The server is busy: it answered `503` and asks to be fetched again after `retryAfter` (its
        /// `Retry-After`, bounded by `maxBusyRetryAfter`, or `defaultBusyRetryAfter`). Not a failure
        /// of the peer: it is not retried at once and counts toward no failure limit.
        case busy(retryAfter: Duration)
    }

    /// What went wrong.
    public let reason: Reason
    /// The location that was fetched.
    public let location: BeaconLocation
    /// Attempts made.
    public let attempts: Int

    /// Whether another attempt may succeed.
    var isTransient: Bool {
        switch reason {
        case .connectFailed, .connectTimedOut, .timedOut, .connectionClosed: return true
        case .unexpectedStatus(let status): return status >= 500
        case .responseTooLarge, .unexpectedContentType, .malformedResponse, .busy: return false
        }
    }

    public var description: String { "beacon fetch from \(location) failed after \(attempts) attempt(s): \(reason)" }

    /// The failure as discovery counts it; nil for a busy answer, which is no failure.
    public var failure: BeaconFetchFailure? {
        let kind: BeaconFetchFailure.Kind
        switch reason {
        case .connectFailed: kind = .noConnection
        case .connectTimedOut: kind = .connectTimedOut
        case .timedOut: kind = .responseTimedOut
        case .connectionClosed: kind = .closedEarly
        case .responseTooLarge, .unexpectedStatus, .unexpectedContentType, .malformedResponse: kind = .badResponse
        case .busy: return nil
        }
        return BeaconFetchFailure(kind, "\(reason)")
    }
}

/// Fetches `GET /NotificationBeacons` from a peer, with bounded time and size and retries.
public struct BeaconHTTPClient: Sendable {
    /// Limits and retry policy.
    public let configuration: BeaconHTTPClientConfiguration
    /// The round trips measured to the hosts fetched from, which size the next fetches' waits.
    public let roundTrips: RoundTripTable
    private let group: EventLoopGroup

    /// A client whose connections run on `group`, learning round trips into `roundTrips` (pass the old
    /// client's to keep what it learnt).
    public init(configuration: BeaconHTTPClientConfiguration = .init(), group: EventLoopGroup,
                roundTrips: RoundTripTable = RoundTripTable()) {
        self.configuration = configuration
        self.group = group
        self.roundTrips = roundTrips
    }

    /// The advertised stream (empty for 204), retrying transient failures with backoff and jitter.
    public func fetch(_ location: BeaconLocation) async throws(BeaconFetchError) -> [UInt8] {
        var attempt = 1
        while true {
            do {
                return try await fetchOnce(location, attempt: attempt)
            } catch let reason {
                let failure = BeaconFetchError(reason: reason, location: location, attempts: attempt)
                guard failure.isTransient, attempt < configuration.maxAttempts else { throw failure }
                do { try await Task.sleep(for: backoff(beforeAttempt: attempt + 1)) } catch { throw failure }
                attempt += 1
            }
        }
    }

    /// The delay before attempt `n` (n >= 2, the retry n − 1): initial × 2^(n-2), capped, spread by `jitter`.
    func backoff(beforeAttempt attempt: Int) -> Duration {
        configuration.backoff.delay(beforeRetry: attempt - 1)
    }

    private func fetchOnce(_ location: BeaconLocation, attempt: Int) async throws(BeaconFetchError.Reason) -> [UInt8] {
        let promise = group.next().makePromise(of: [UInt8].self)
        let roundTrip = group.next().makePromise(of: KernelRoundTrip?.self)
        let configuration = self.configuration
        let connectTimeout = configuration.connectTimeout(forAttempt: attempt,
                                                          roundTrip: roundTrips.estimate(for: location.host)?.retransmissionTimeout)
        let channel: Channel
        do {
            var bootstrap = ClientBootstrap(group: group)
            if let source = configuration.sourceAddress {
                bootstrap = bootstrap.bind(to: try SocketAddress(ipAddress: source, port: 0))
            }
            bootstrap = bootstrap
                .connectTimeout(TimeAmount(connectTimeout))
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        let sync = channel.pipeline.syncOperations
                        try sync.addHandler(KernelRoundTripReader(promise: roundTrip))
                        try sync.addHandler(InboundByteLimitHandler(
                            limit: configuration.maxHeadBytes + configuration.maxBodyBytes))
                        try sync.addHTTPClientHandlers()
                        try sync.addHandler(BeaconResponseHandler(
                            host: location.hostHeader, maxBodyBytes: configuration.maxBodyBytes,
                            busyWait: configuration.busyWait, promise: promise))
                    }
                }
            // An address (what SSDP locations hold) is connected to directly: by name, NIO would resolve it
            // through getaddrinfo and race it Happy-Eyeballs style, a fifth of a crowd's CPU.
            if let address = try? SocketAddress(ipAddress: location.host, port: location.port) {
                channel = try await bootstrap.connect(to: address).get()
            } else {
                channel = try await bootstrap.connect(host: location.host, port: location.port).get()
            }
        } catch {
            let reason: BeaconFetchError.Reason
            if case ChannelError.connectTimeout = error { reason = .connectTimedOut } else { reason = .connectFailed("\(error)") }
            promise.fail(reason)
            roundTrip.succeed(nil)
            throw reason
        }
        // The handshake's round trip, as the kernel measured it, sizes this response's wait and the next
        // fetches' connect waits to this host.
        let measured = try? await roundTrip.futureResult.get()
        if let measured { roundTrips.record(measured.smoothed, for: location.host) }
        let timeout = channel.eventLoop.scheduleTask(in: TimeAmount(configuration.responseTimeout(roundTrip: measured?.retransmissionTimeout))) {
            promise.fail(BeaconFetchError.Reason.timedOut)
        }
        promise.futureResult.whenComplete { _ in
            timeout.cancel()
            channel.close(promise: nil)
        }
        do {
            return try await promise.futureResult.get()
        } catch let reason as BeaconFetchError.Reason {
            throw reason
        } catch {
            throw .malformedResponse("\(error)")
        }
    }
}

extension BeaconFetchError.Reason: Error {}

extension BeaconHTTPClientConfiguration {
    /// The connect wait of attempt `attempt` (1 is the first) to a host whose retransmission timeout is
    /// `roundTrip` (nil: not measured yet): the larger of `connectTimeout` and `roundTripFactor` ×
    /// `roundTrip`, doubled for each attempt after the first, at most `maxConnectTimeout`. The doubling
    /// is what lets a first contact over a path slower than `connectTimeout` succeed at all, as TCP's own
    /// SYN retransmissions back off; the measured round trip lets the next fetch succeed at once.
    public func connectTimeout(forAttempt attempt: Int, roundTrip: Duration?) -> Duration {
        var wait = max(connectTimeout, (roundTrip ?? .zero) * roundTripFactor)
        for _ in 1..<max(1, attempt) where wait < maxConnectTimeout { wait = wait * 2 }
        return min(wait, max(connectTimeout, maxConnectTimeout))
    }

    /// The wait from connected to the end of the response over a connection whose retransmission timeout
    /// is `roundTrip` (nil: unknown): `responseTimeout` plus `roundTripFactor` × `roundTrip`, at most
    /// `maxResponseTimeout`.
    public func responseTimeout(roundTrip: Duration?) -> Duration {
        responseTimeout.widened(forRoundTrip: roundTrip, factor: roundTripFactor, cap: maxResponseTimeout)
    }

    /// How long a busy server's answer asks us to wait: its `Retry-After` in whole seconds (RFC 9110
    /// §10.2.3 delta-seconds), at most `maxBusyRetryAfter`; `defaultBusyRetryAfter` when it names none
    /// or a form we do not read.
    package var busyWait: @Sendable (String?) -> Duration {
        { [defaultBusyRetryAfter, maxBusyRetryAfter] value in
            if Mutant.httpIgnoresRetryAfter.isActive { return .zero }
            guard let value, let seconds = Int64(Substring(value).trimmingWhitespace()), seconds >= 0 else { return defaultBusyRetryAfter }
            return min(.seconds(min(seconds, Int64(Int32.max))), maxBusyRetryAfter)
        }
    }
}

extension BeaconLocation {
    /// The `Host` header of a request to this location: `host:port`, the port left out only when it is
    /// http's default, 80 (RFC 9110 §7.2) [SSDP-6.8].
    public var hostHeader: String { port == 80 ? host : "\(host):\(port)" }
}

/// Cuts the connection once more than `limit` bytes have arrived, before any parser buffers them.
package final class InboundByteLimitHandler: ChannelInboundHandler {
    package typealias InboundIn = ByteBuffer
    package typealias InboundOut = ByteBuffer
    private let limit: Int
    private var received = 0

    package init(limit: Int) { self.limit = limit }

    package func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        received += unwrapInboundIn(data).readableBytes
        guard received <= limit else {
            context.fireErrorCaught(BeaconFetchError.Reason.responseTooLarge(limit: limit))
            context.close(promise: nil)
            return
        }
        context.fireChannelRead(data)
    }
}

/// Sends the GET and turns the response into the stream bytes or a `BeaconFetchError.Reason`.
package final class BeaconResponseHandler: ChannelInboundHandler {
    package typealias InboundIn = HTTPClientResponsePart
    package typealias OutboundOut = HTTPClientRequestPart

    /// The `Host` header's value, `host[:port]`.
    private let host: String
    private let maxBodyBytes: Int
    /// The wait a busy answer's `Retry-After` header asks for.
    private let busyWait: @Sendable (String?) -> Duration
    private let promise: EventLoopPromise<[UInt8]>
    private var status: HTTPResponseStatus?
    private var body: [UInt8] = []

    package init(host: String, maxBodyBytes: Int,
                 busyWait: @escaping @Sendable (String?) -> Duration = BeaconHTTPClientConfiguration().busyWait,
                 promise: EventLoopPromise<[UInt8]>) {
        self.host = host
        self.maxBodyBytes = maxBodyBytes
        self.busyWait = busyWait
        self.promise = promise
    }

    package func channelActive(context: ChannelHandlerContext) {
        let head = HTTPRequestHead(version: .http1_1, method: .GET, uri: BeaconLocation.notificationBeaconsPath,
                                   headers: HTTPHeaders([("Host", Mutant.httpHostWithoutPort.isActive ? String(host.prefix { $0 != ":" }) : host), ("Connection", "close"),
                                                         ("Accept", "application/octet-stream")]))
        context.write(wrapOutboundOut(.head(head)), promise: nil)
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
        context.fireChannelActive()
    }

    package func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            if Mutant.httpIgnoresStatus.isActive, head.status != .serviceUnavailable {
                status = .ok
                return
            }
            switch head.status {
            case .ok:
                let type = head.headers.first(name: "Content-Type")
                guard let type, type.split(separator: ";").first?.trimmingWhitespace().lowercased() == "application/octet-stream" else {
                    return fail(context, .unexpectedContentType(type.map { String($0.prefix(64)) }))
                }
                if let length = head.headers.first(name: "Content-Length").flatMap({ Int($0) }), length > maxBodyBytes {
                    return fail(context, .responseTooLarge(limit: maxBodyBytes))
                }
                status = head.status
            case .noContent:
                status = head.status
            case .serviceUnavailable where Mutant.httpBusyAsNoContent.isActive:
                status = .noContent
            case .serviceUnavailable:
                fail(context, .busy(retryAfter: busyWait(head.headers.first(name: "Retry-After"))))
            default:
                fail(context, .unexpectedStatus(Int(head.status.code)))
            }
        case .body(let buffer):
            guard status == .ok else { return }
            guard body.count + buffer.readableBytes <= maxBodyBytes else {
                return fail(context, .responseTooLarge(limit: maxBodyBytes))
            }
            body.append(contentsOf: buffer.readableBytesView)
        case .end:
            guard status != nil else { return }
            promise.succeed(status == .ok ? body : [])
        }
    }

    package func errorCaught(context: ChannelHandlerContext, error: Error) {
        if let reason = error as? BeaconFetchError.Reason { return fail(context, reason) }
        if error is IOError { return fail(context, .connectionClosed) }  // reset by the peer: transient
        fail(context, .malformedResponse("\(error)"))
    }

    package func channelInactive(context: ChannelHandlerContext) {
        promise.fail(BeaconFetchError.Reason.connectionClosed)  // no-op if already completed
        context.fireChannelInactive()
    }

    private func fail(_ context: ChannelHandlerContext, _ reason: BeaconFetchError.Reason) {
        status = nil
        promise.fail(reason)
        context.close(promise: nil)
    }
}
