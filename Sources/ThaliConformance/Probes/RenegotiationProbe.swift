import NIOCore
import NIOPosix
import ThaliPSKTLS

/// A PSK-TLS session in which the suite, as the client, asks for a second handshake once the first is
/// done: how the server answers [PSK-1.5]. Our client sends the new ClientHello through
/// `PSKTLSRenegotiation`, the one place this profile's code renegotiates.
enum RenegotiationProbe {
    /// How the server answered the ClientHello sent inside the session.
    enum Outcome: Sendable, Hashable, CustomStringConvertible {
        /// A second handshake ran to its Finished.
        case renegotiated
        /// A warning alert, the session kept (our client then ends it, as OpenSSL's does).
        case warned(TLSAlert)
        /// A fatal alert.
        case fatalAlert(TLSAlert)
        /// TCP closed without an alert.
        case closedWithoutAlert
        /// Nothing came within the wait: the request was ignored and the session kept.
        case ignored(milliseconds: Int64)
        /// No authenticated session to ask in.
        case noSession(String)

        var description: String {
            switch self {
            case .renegotiated: "a second handshake ran (ServerHello to Finished)"
            case .warned(let alert): "a warning \(alert) alert"
            case .fatalAlert(let alert): "a fatal \(alert) alert"
            case .closedWithoutAlert: "TCP closed without an alert"
            case .ignored(let milliseconds): "no answer within \(milliseconds) ms, the session kept"
            case .noSession(let detail): "no PSK-TLS session: \(detail)"
            }
        }

        /// PASS for `no_renegotiation` (a warning, RFC 5246 §7.2.2, or fatal); WARN for a refusal in
        /// other words (another alert, a bare close, silence); FAIL for a second handshake.
        var verdict: ConformanceVerdict {
            switch self {
            case .warned(let alert), .fatalAlert(let alert): alert == .noRenegotiation ? .pass : .warn
            case .closedWithoutAlert, .ignored: .warn
            case .renegotiated: .fail
            case .noSession: .inconclusive
            }
        }
    }

    /// Connects to `host:port` with `identity` and `psk`, asks for renegotiation once the handshake is
    /// done, and waits up to `timeout` for the answer.
    static func run(host: String, port: Int, identity: String, psk: [UInt8], timeout: TimeAmount,
                    group: EventLoopGroup) async -> Outcome {
        let eventLoop = group.next()
        let answer = eventLoop.makePromise(of: Outcome.self)
        let channel: Channel
        do {
            channel = try await ProbeSession.connect(host: host, port: port, identity: identity, psk: psk, timeout: timeout,
                                                     on: eventLoop, above: [AnswerRecorder(answer)])
        } catch {
            answer.fail(error)
            return .noSession("\(error)")
        }
        defer { channel.close(promise: nil) }
        let started = NIODeadline.now()
        let deadline = eventLoop.scheduleTask(in: timeout) {
            answer.succeed(.ignored(milliseconds: (NIODeadline.now() - started).nanoseconds / 1_000_000))
        }
        defer { deadline.cancel() }
        do {
            try await channel.triggerUserOutboundEvent(PSKTLSRenegotiation.Request()).get()
        } catch {
            answer.fail(error)
            return .noSession("the request for renegotiation failed: \(error)")
        }
        return (try? await answer.futureResult.get()) ?? .noSession("the answer was lost")
    }

    /// Completes the answer with the first thing that tells it: the handler's renegotiation outcome, a
    /// fatal alert, or the end of the connection. Only watches; every event passes on.
    private final class AnswerRecorder: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        private let answer: EventLoopPromise<Outcome>

        init(_ answer: EventLoopPromise<Outcome>) { self.answer = answer }

        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            switch event as? PSKTLSRenegotiation.Outcome {
            case .renegotiated?: answer.succeed(.renegotiated)
            case .warned(let alert)?: answer.succeed(.warned(alert))
            case nil: break
            }
            context.fireUserInboundEventTriggered(event)
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            if case .alertReceived(let alert)? = (error as? PSKTLSError)?.reason { answer.succeed(.fatalAlert(alert)) }
            context.fireErrorCaught(error)
        }

        func channelInactive(context: ChannelHandlerContext) {
            answer.succeed(.closedWithoutAlert)
            context.fireChannelInactive()
        }
    }
}
