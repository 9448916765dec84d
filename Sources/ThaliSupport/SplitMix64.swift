/// A seeded random number generator (SplitMix64), so that random draws can be replayed: the same seed
/// gives the same sequence on every run and platform (a test's draws, a lab link's losses). Not for
/// cryptography.
public struct SplitMix64: RandomNumberGenerator, Sendable {
    /// The generator's state; the seed before the first draw.
    public var state: UInt64

    /// A generator seeded with `state`.
    public init(state: UInt64) {
        self.state = state
    }

    /// The next 64 random bits.
    public mutating func next() -> UInt64 {
        state &+= 0x9e37_79b9_7f4a_7c15
        var z = state
        z = (z ^ (z >> 30)) &* 0xbf58_476d_1ce4_e5b9
        z = (z ^ (z >> 27)) &* 0x94d0_49bb_1331_11eb
        return z ^ (z >> 31)
    }
}
