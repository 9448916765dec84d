import NIOCore

extension TimeAmount {
    /// This amount doubled `times` times (none for zero or fewer), at most `cap`: the wait of an
    /// exponential backoff.
    func doubled(_ times: Int, upTo cap: TimeAmount) -> TimeAmount {
        var amount = self
        for _ in 0..<max(0, times) where amount < cap { amount = amount * 2 }
        return Swift.min(amount, cap)
    }
}
