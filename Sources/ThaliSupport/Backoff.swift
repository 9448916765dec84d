/// A capped exponential backoff with jitter: the suite's one way to space out retries (beacon fetches,
/// SSDP refetches, contact links, Bluetooth reconnects). The delay before retry n is
/// `base × factor^(n−1)`, at most `cap`, then spread uniformly over `±jitter` of itself so that peers
/// that failed together do not retry in step. The randomness comes from the caller's generator, so a
/// test pins it with a seeded one.
public struct Backoff: Sendable, Hashable {
    /// The delay before the first retry.
    public var base: Duration
    /// How much each further retry's delay grows (2: doubling).
    public var factor: Double
    /// The longest delay before jitter.
    public var cap: Duration
    /// The fraction of the delay by which it is spread either way (0: none; 0.5: 50 % … 150 %).
    public var jitter: Double

    /// A backoff from `base`, growing by `factor` up to `cap`, spread by `jitter` (a fraction in 0 … 1).
    public init(base: Duration, factor: Double = 2, cap: Duration, jitter: Double = 0) {
        self.base = base
        self.factor = factor
        self.cap = cap
        self.jitter = jitter
    }

    /// The delay before retry `retry` (1 is the first; less counts as 1) without jitter:
    /// `base × factor^(retry−1)`, at most `cap`.
    public func nominalDelay(beforeRetry retry: Int) -> Duration {
        var delay = base
        for _ in 1..<max(1, retry) {
            if delay >= cap { break }
            delay = delay * factor
        }
        return min(delay, cap)
    }

    /// The delay before retry `retry`, jittered with a draw from `generator`.
    public func delay(beforeRetry retry: Int, using generator: inout some RandomNumberGenerator) -> Duration {
        let delay = nominalDelay(beforeRetry: retry)
        guard jitter > 0 else { return delay }
        return delay * Double.random(in: (1 - jitter)...(1 + jitter), using: &generator)
    }

    /// The delay before retry `retry`, jittered with the system's generator.
    public func delay(beforeRetry retry: Int) -> Duration {
        var generator = SystemRandomNumberGenerator()
        return delay(beforeRetry: retry, using: &generator)
    }
}
