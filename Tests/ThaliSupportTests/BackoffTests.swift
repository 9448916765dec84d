import Testing
import ThaliSupport
import ThaliTestSupport

/// A generator that returns the same word every time: 0 draws the bottom of every range.
private struct ConstantGenerator: RandomNumberGenerator {
    let word: UInt64
    mutating func next() -> UInt64 { word }
}

/// The suite's one backoff: growth, cap and jitter, with the randomness pinned by the test.
@Suite struct BackoffTests {
    @Test func growsByTheFactorFromTheFirstRetryUpToTheCap() {
        let backoff = Backoff(base: .milliseconds(250), cap: .seconds(5))
        let delays = (0...8).map { backoff.nominalDelay(beforeRetry: $0) }
        #expect(delays == [.milliseconds(250), .milliseconds(250), .milliseconds(500), .seconds(1), .seconds(2),
                           .seconds(4), .seconds(5), .seconds(5), .seconds(5)])
        #expect(Backoff(base: .seconds(1), factor: 3, cap: .seconds(100)).nominalDelay(beforeRetry: 4) == .seconds(27))
        // A retry count far past the cap neither overflows nor loops for long.
        #expect(backoff.nominalDelay(beforeRetry: Int.max) == .seconds(5))
    }

    @Test func withoutJitterTheDelayIsTheNominalOneAndDrawsNothing() {
        let backoff = Backoff(base: .milliseconds(100), cap: .seconds(2))
        var generator = ConstantGenerator(word: .max)
        let delay = backoff.delay(beforeRetry: 3, using: &generator)
        #expect(delay == .milliseconds(400))
    }

    @Test func jitterSpreadsEitherWayByTheFractionWithTheGivenGenerator() {
        let backoff = Backoff(base: .seconds(2), cap: .seconds(32), jitter: 0.5)
        // Each delay is the nominal one times one uniform draw from 0.5 ... 1.5 of the caller's generator.
        var drawn = SplitMix64(state: 7), replayed = SplitMix64(state: 7)
        for retry in 1...8 {
            let spread = Double.random(in: 0.5...1.5, using: &replayed)
            let delay = backoff.delay(beforeRetry: retry, using: &drawn)
            #expect(delay == backoff.nominalDelay(beforeRetry: retry) * spread)
        }

        // The same seed gives the same delays; every one within ±50 % of the nominal delay.
        var first = SplitMix64(state: 42), second = SplitMix64(state: 42)
        let run = (1...20).map { backoff.delay(beforeRetry: $0, using: &first) }
        #expect(run == (1...20).map { backoff.delay(beforeRetry: $0, using: &second) })
        for (index, delay) in run.enumerated() {
            let nominal = backoff.nominalDelay(beforeRetry: index + 1)
            #expect(delay >= nominal * 0.5 && delay <= nominal * 1.5)
        }
        #expect(Set(run.enumerated().map { $0.element / backoff.nominalDelay(beforeRetry: $0.offset + 1) }).count > 1)
    }
}
