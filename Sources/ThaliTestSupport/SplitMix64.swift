import ThaliSupport

/// The seeded generator tests draw from, under the name they know (it lives in ThaliSupport, which the
/// network lab shares).
public typealias SplitMix64 = ThaliSupport.SplitMix64
