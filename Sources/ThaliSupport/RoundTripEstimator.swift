/// A smoothed round-trip time and its variation, and the retransmission timeout they give, as TCP keeps
/// them (RFC 6298 §2): the first sample `R` sets `SRTT = R`, `RTTVAR = R/2`; each later one moves
/// `RTTVAR` by a quarter and `SRTT` by an eighth toward it. Timeouts that wait for a peer's answer are
/// sized from ``retransmissionTimeout`` rather than fixed for loopback, so that a path whose round trip
/// is a second (a Wi-Fi link behind a full upload queue) is slow, not broken.
public struct RoundTripEstimator: Sendable, Hashable {
    /// The smoothed round trip (`SRTT`).
    public private(set) var smoothed: Duration
    /// The round trip's mean deviation (`RTTVAR`).
    public private(set) var variation: Duration
    /// How many samples went in.
    public private(set) var samples: Int

    /// The clock granularity `G` of RFC 6298: the least margin above `SRTT` a timeout keeps.
    public static let granularity: Duration = .milliseconds(1)

    /// An estimate from its first sample.
    public init(firstSample sample: Duration) {
        let sample = max(sample, .zero)
        smoothed = sample
        variation = sample / 2
        samples = 1
    }

    /// Takes in one more measured round trip (a negative one counts as zero).
    public mutating func add(_ sample: Duration) {
        let sample = max(sample, .zero)
        let deviation = smoothed > sample ? smoothed - sample : sample - smoothed
        variation = variation * 0.75 + deviation * 0.25
        smoothed = smoothed * 0.875 + sample * 0.125
        samples += 1
    }

    /// `SRTT + max(G, 4 × RTTVAR)`: how long an answer may take before it is late. Three round trips
    /// after a single sample; about one once the path is steady.
    public var retransmissionTimeout: Duration { Self.retransmissionTimeout(smoothed: smoothed, variation: variation) }

    /// `smoothed + max(G, 4 × variation)`, for a round trip smoothed elsewhere (the kernel's `TCP_INFO`).
    public static func retransmissionTimeout(smoothed: Duration, variation: Duration) -> Duration {
        smoothed + max(granularity, variation * 4)
    }
}

/// Waits widened by a measured round trip.
extension Duration {
    /// This wait widened for a path whose retransmission timeout is `roundTrip` (nil: not measured):
    /// itself plus `factor` × `roundTrip`, at most `cap`, and never below itself. The one rule by which the
    /// suite's waits for a peer's answer grow on a slow path (beacon responses, the port's first byte).
    public func widened(forRoundTrip roundTrip: Duration?, factor: Double, cap: Duration) -> Duration {
        min(self + (roundTrip ?? .zero) * factor, max(self, cap))
    }
}
