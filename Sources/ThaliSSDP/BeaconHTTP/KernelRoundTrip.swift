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
        smoothed + max(RoundTripEstimator.granularity, variation * 4)
    }
}

extension Channel {
    /// The kernel's round trip of this TCP connection; nil where the platform does not say, on a channel
    /// that is not a socket (an `EmbeddedChannel`), or before the kernel has a sample.
    package func kernelRoundTrip() -> EventLoopFuture<KernelRoundTrip?> {
        #if os(Linux)
        guard let provider = self as? any SocketOptionProvider else { return eventLoop.makeSucceededFuture(nil) }
        return provider.getTCPInfo().map { info -> KernelRoundTrip? in
            guard info.tcpi_rtt > 0 else { return nil }
            return KernelRoundTrip(smoothed: .microseconds(Int64(info.tcpi_rtt)), variation: .microseconds(Int64(info.tcpi_rttvar)))
        }.recover { _ in nil }
        #else
        return eventLoop.makeSucceededFuture(nil)
        #endif
    }
}
