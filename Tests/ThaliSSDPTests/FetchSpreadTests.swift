import NIOCore
import Testing
import ThaliSSDP
import ThaliTestSupport

/// Every listener hears a peer's new USN in the same instant. Unspread, a crowd fetches it at once, and past
/// the beacon server's global rate the honest crowd closes the peer's port (issue 24: at 300 peers the
/// last-started peers stayed closed for the rest of the run). `SSDPDiscoveryLimits.fetchDelay` spreads them.
@Suite("Fetches of a new USN are spread over the crowd")
struct FetchSpreadTests {
    /// The most fetches in any one-second window when each of `crowd` listeners draws its delay once.
    private func busiestSecond(crowd: Int, limits: SSDPDiscoveryLimits, seed: UInt64) -> Int {
        var generator = SplitMix64(state: seed)
        let delays = (0..<crowd).map { _ in TimeAmount(limits.fetchDelay(trackedPeers: crowd, using: &generator)).nanoseconds }.sorted()
        var busiest = 0
        var first = 0
        for (last, delay) in delays.enumerated() {
            while delay - delays[first] >= 1_000_000_000 { first += 1 }
            busiest = max(busiest, last - first + 1)
        }
        return busiest
    }

    @Test("a crowd of 300, 500 or 1,000 stays under the beacon server's global rate; unspread it does not")
    func crowdStaysUnderTheServersRate() {
        let serverRate = BeaconHTTPServerLimits().maxRequestsGlobal
        for crowd in [300, 500, 1000] {
            for seed in UInt64(1)...5 {
                let busiest = busiestSecond(crowd: crowd, limits: SSDPDiscoveryLimits(), seed: seed)
                #expect(busiest < serverRate, "crowd \(crowd), seed \(seed): \(busiest) fetches in one second")
            }
        }
        var unspread = SSDPDiscoveryLimits()
        unspread.fetchSpreadPerPeer = .zero
        #expect(busiestSecond(crowd: 300, limits: unspread, seed: 1) == 300)
    }

    @Test("the wait is below tracked peers × the per-peer spread, capped, and zero when switched off")
    func delayBounds() {
        var generator = SplitMix64(state: 7)
        var limits = SSDPDiscoveryLimits()
        limits.fetchSpreadPerPeer = .milliseconds(10)
        limits.maxFetchSpread = .seconds(5)  // below the default, so that a large crowd reaches it
        #expect(limits.fetchDelay(trackedPeers: 0, using: &generator) == .zero)
        var longest = Duration.zero
        for _ in 0..<2000 {
            let delay = limits.fetchDelay(trackedPeers: 3, using: &generator)
            #expect(delay >= .zero && delay < .milliseconds(30))
            longest = max(longest, limits.fetchDelay(trackedPeers: 100_000, using: &generator))
        }
        #expect(longest < .seconds(5) && longest > .seconds(4), "capped at maxFetchSpread, and reaching near it")
        #expect(limits.fetchDelay(trackedPeers: Int.max, using: &generator) < .seconds(5), "no overflow")
        limits.fetchSpreadPerPeer = .zero
        #expect(limits.fetchDelay(trackedPeers: 300, using: &generator) == .zero)
    }
}
