import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import ThaliPSKTLS

/// A PSK-TLS session that ends with our close_notify while TCP stays open, as a client that waits for
/// the answer does: how the other side ends it [PSK-6.4]. A side that does not answer keeps the
/// connection (and whatever it counts against its limits) until some timeout of its own.
enum CloseNotifyProbe {
    /// How the other side ended the session after our close_notify.
    enum Outcome: Sendable, Hashable, CustomStringConvertible {
        /// Its close_notify came and the connection ended, after this many milliseconds.
        case answered(milliseconds: Int64)
        /// TCP closed without its close_notify, after this many milliseconds.
        case closedWithoutAnswer(milliseconds: Int64)
        /// Still open when the wait ended.
        case stillOpen(milliseconds: Int64)
        /// No authenticated session to close.
        case noSession(String)

        var description: String {
            switch self {
            case .answered(let milliseconds): "close_notify answered and connection closed after \(milliseconds) ms"
            case .closedWithoutAnswer(let milliseconds): "TCP closed without close_notify after \(milliseconds) ms"
            case .stillOpen(let milliseconds): "no answer and still open after \(milliseconds) ms"
            case .noSession(let detail): "no PSK-TLS session: \(detail)"
            }
        }
    }

    /// Connects to `host:port` with `identity` and `psk`, sends close_notify once the handshake is done
    /// without closing TCP, and waits up to `timeout` for the other side to end the connection.
    static func run(host: String, port: Int, identity: String, psk: [UInt8], timeout: TimeAmount,
                    group: EventLoopGroup) async -> Outcome {
        let errors = ErrorLog()
        let channel: Channel
        do {
            channel = try await ProbeSession.connect(host: host, port: port, identity: identity, psk: psk, timeout: timeout,
                                                     on: group.next(), below: [TCPOutputKeptOpen()], above: [errors])
        } catch {
            return .noSession("\(error)")
        }
        defer { channel.close(promise: nil) }
        let started = NIODeadline.now()
        // Our close_notify; the TCP output stays open (TCPOutputKeptOpen), so only the answer ends it.
        try? await channel.close(mode: .output).get()
        // The other side's answer closes our channel; one that does not answer is cut off at the timeout.
        let cutOff = NIOLockedValueBox(false)
        let deadline = channel.eventLoop.scheduleTask(in: timeout) {
            cutOff.withLockedValue { $0 = true }
            channel.close(promise: nil)
        }
        try? await channel.closeFuture.get()
        deadline.cancel()
        let milliseconds = (NIODeadline.now() - started).nanoseconds / 1_000_000
        if cutOff.withLockedValue({ $0 }) { return .stillOpen(milliseconds: milliseconds) }
        let unclean = errors.errors.contains { ($0 as? PSKTLSError)?.reason == .uncleanShutdown }
        return unclean ? .closedWithoutAnswer(milliseconds: milliseconds) : .answered(milliseconds: milliseconds)
    }

    /// Swallows the shutdown of the TCP output that follows our close_notify, so the connection stays
    /// open in both directions until the other side acts.
    private final class TCPOutputKeptOpen: ChannelOutboundHandler, Sendable {
        typealias OutboundIn = ByteBuffer
        func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
            guard mode == .output else { return context.close(mode: mode, promise: promise) }
            promise?.succeed(())
        }
    }

    /// The errors the session ended with.
    private final class ErrorLog: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        private let recorded = NIOLockedValueBox<[any Error]>([])
        var errors: [any Error] { recorded.withLockedValue { $0 } }
        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            recorded.withLockedValue { $0.append(error) }
        }
    }
}
