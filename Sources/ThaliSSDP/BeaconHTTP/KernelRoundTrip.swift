import NIOCore
import ThaliSupport

/// What the kernel has measured of one TCP connection's round trip (`TCP_INFO`'s `tcpi_rtt` and
/// `tcpi_rttvar`). Right after a connect (or an accept) it holds the handshake's own sample, with Karn's
/// rule already applied: a retransmitted SYN gives none unless timestamps can tell the copies apart.
package struct KernelRoundTrip: Sendable, Hashable {
    /// The smoothed round trip.
    package var smoothed: Duration
    /// Its mean deviation.
    package var variation: Duration

    /// `SRTT + max(G, 4 × RTTVAR)`, as ThaliSupport's `RoundTripEstimator.retransmissionTimeout`.
    package var retransmissionTimeout: Duration {
        RoundTripEstimator.retransmissionTimeout(smoothed: smoothed, variation: variation)
    }
}

extension Channel {
    /// The kernel's round trip of this TCP connection; nil where the platform does not say, or on a channel
    /// that is not a socket (an `EmbeddedChannel`).
    package func kernelRoundTrip() -> EventLoopFuture<KernelRoundTrip?> {
        #if os(Linux)
        guard let provider = self as? any SocketOptionProvider else { return eventLoop.makeSucceededFuture(nil) }
        // A `tcpi_rtt` of 0 is a sample too: a loopback handshake can take under a microsecond. Without any
        // sample (a retransmitted SYN and no timestamps, which Linux sends by default) it also reads 0, with
        // the initial variation (250 ms): the waits then stay near their fixed floors, as if unmeasured.
        return provider.getTCPInfo().map { info -> KernelRoundTrip? in
            KernelRoundTrip(smoothed: .microseconds(Int64(info.tcpi_rtt)), variation: .microseconds(Int64(info.tcpi_rttvar)))
        }.recover { _ in nil }
        #else
        return eventLoop.makeSucceededFuture(nil)
        #endif
    }
}

/// Reads the kernel's round trip of its channel the moment the channel becomes active, before any
/// request goes out: a peer that answers and closes at once leaves no socket to read afterwards. Completes
/// `promise` with it (nil when there is none), or with nil if it is removed before that.
package final class KernelRoundTripReader: ChannelInboundHandler {
    package typealias InboundIn = ByteBuffer
    package typealias InboundOut = ByteBuffer
    private let promise: EventLoopPromise<KernelRoundTrip?>

    package init(promise: EventLoopPromise<KernelRoundTrip?>) { self.promise = promise }

    package func channelActive(context: ChannelHandlerContext) {
        // On the channel's event loop the option is read at once, so the request below comes after it.
        context.channel.kernelRoundTrip().cascade(to: promise)
        context.fireChannelActive()
    }

    package func handlerRemoved(context: ChannelHandlerContext) {
        promise.succeed(nil)  // does nothing once the reading completed it
    }
}
