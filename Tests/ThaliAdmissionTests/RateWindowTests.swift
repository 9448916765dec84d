import NIOCore
import Testing
import ThaliAdmission

/// The suite's one fixed-window rate counter.
@Suite struct RateWindowTests {
    let t0 = NIODeadline.uptimeNanoseconds(5_000_000_000)

    @Test func allowsTheLimitPerWindowAndStartsTheWindowAtTheFirstEvent() {
        var window = RateWindow(limit: 3, length: .seconds(10))
        #expect(window.start == nil)
        #expect((0..<4).map { _ in window.record(now: t0) } == [true, true, true, false])
        #expect(window.start == t0)
        // Still the same window 9.999 s later: the one that started with the first event, not at boot.
        let lastInWindow = window.record(now: t0 + .milliseconds(9_999))
        #expect(!lastInWindow)
        let firstOfNext = window.record(now: t0 + .seconds(10))
        #expect(firstOfNext)
        #expect(window.start == t0 + .seconds(10))
        #expect(window.count == 1)
    }

    @Test func restartForgetsTheWindowAndEmptyKeepsItsStart() {
        var window = RateWindow(limit: 1, length: .seconds(10))
        let recorded = window.record(now: t0)
        #expect(recorded && window.isFull)
        window.empty()
        #expect(!window.isFull && window.start == t0)
        window.advance(to: t0 + .seconds(1))
        #expect(window.start == t0)
        window.restart()
        #expect(window.start == nil && window.count == 0)
        window.advance(to: t0 + .seconds(2))
        window.add()
        #expect(window.start == t0 + .seconds(2) && window.isFull)
    }
}
