import Testing
import ThaliSupport

/// RFC 6298 §2's arithmetic, and the table's bound on remembered hosts.
@Suite struct RoundTripEstimatorTests {
    @Test func theFirstSampleGivesThreeRoundTripsAndLaterOnesSmoothTowardTheSamples() {
        var estimate = RoundTripEstimator(firstSample: .milliseconds(800))
        #expect(estimate.smoothed == .milliseconds(800) && estimate.variation == .milliseconds(400))
        #expect(estimate.retransmissionTimeout == .milliseconds(2400))
        // RTTVAR = 3/4 × 400 + 1/4 × |800 − 400| = 400; SRTT = 7/8 × 800 + 1/8 × 400 = 750.
        estimate.add(.milliseconds(400))
        #expect(estimate.variation == .milliseconds(400) && estimate.smoothed == .milliseconds(750))
        #expect(estimate.samples == 2)
        // A steady path: the timeout comes down to about one round trip, never below SRTT + G.
        for _ in 0..<200 { estimate.add(.milliseconds(100)) }
        #expect(estimate.smoothed > .milliseconds(99) && estimate.smoothed < .milliseconds(101))
        #expect(estimate.retransmissionTimeout >= estimate.smoothed + RoundTripEstimator.granularity)
        #expect(estimate.retransmissionTimeout < .milliseconds(110))
        // A negative sample (a clock step) counts as zero, not as a negative round trip.
        var stepped = RoundTripEstimator(firstSample: .milliseconds(-5))
        #expect(stepped.smoothed == .zero && stepped.retransmissionTimeout == RoundTripEstimator.granularity)
        stepped.add(.seconds(-1))
        #expect(stepped.smoothed == .zero)
    }

    @Test func theTableRemembersAtMostItsCapacityAndForgetsTheHostHeardFromLongestAgo() {
        let table = RoundTripTable(capacity: 3)
        #expect(table.estimate(for: "10.0.0.1") == nil)
        table.record(.milliseconds(10), for: "10.0.0.1")
        table.record(.milliseconds(20), for: "10.0.0.2")
        table.record(.milliseconds(30), for: "10.0.0.3")
        table.record(.milliseconds(12), for: "10.0.0.1")  // heard from again: now the newest
        table.record(.milliseconds(40), for: "10.0.0.4")  // full: 10.0.0.2 goes
        #expect(table.count == 3)
        #expect(table.estimate(for: "10.0.0.2") == nil)
        #expect(table.estimate(for: "10.0.0.1")?.samples == 2)
        #expect(table.estimate(for: "10.0.0.4")?.smoothed == .milliseconds(40))
        // However many hosts write, the bound holds.
        for host in 0..<1000 { table.record(.milliseconds(1), for: "10.1.\(host / 256).\(host % 256)") }
        #expect(table.count == 3)
        #expect(RoundTripTable(capacity: 0).capacity == 1)
    }

    @Test func aWaitWidensByTheRoundTripUpToItsCapAndNeverBelowItself() {
        let floor = Duration.seconds(2)
        #expect(floor.widened(forRoundTrip: nil, factor: 2, cap: .seconds(8)) == .seconds(2))
        #expect(floor.widened(forRoundTrip: .milliseconds(3), factor: 2, cap: .seconds(8)) == .milliseconds(2006))
        #expect(floor.widened(forRoundTrip: .milliseconds(2500), factor: 2, cap: .seconds(8)) == .seconds(7))
        #expect(floor.widened(forRoundTrip: .seconds(60), factor: 2, cap: .seconds(8)) == .seconds(8))
        #expect(floor.widened(forRoundTrip: .seconds(1), factor: 2, cap: .seconds(1)) == .seconds(2))
    }
}
