import NIOCore
import Testing
@testable import ThaliConformance

@Suite("Adapter event follower")
struct AdapterEventFollowerTests {
    /// An adapter whose `events` verb prints `count` events, `e1` … `eN`, one JSON object per line, and a
    /// line that is no event in between.
    static func adapter(printing count: Int) -> ConformanceAdapter {
        let script = #"for i in $(seq 1 "$COUNT"); do printf '{"event":"e%d","contact":"bob"}\nnot json\n' "$i"; done"#
        return ConformanceAdapter(command: ["/usr/bin/env", "COUNT=\(count)", "/bin/sh", "-c", script, "sh"])
    }

    @Test("past maxEvents the oldest events are forgotten, counted, and marks still address the kept ones")
    func keepsTheNewestEvents() async throws {
        let total = AdapterEventFollower.maxEvents + 904
        let follower = try AdapterEventFollower(adapter: Self.adapter(printing: total))
        defer { follower.stop() }
        let last = await follower.first(after: 0, timeout: .seconds(30)) { $0.event == "e\(total)" }
        #expect(last?.contact == "bob")
        #expect(follower.count == total)
        let kept = follower.events(after: 0)
        #expect(kept.count == AdapterEventFollower.maxEvents)
        #expect(kept.first?.event == "e905" && kept.last?.event == "e\(total)")
        #expect(follower.events(after: total - 3).map(\.event) == ["e\(total - 2)", "e\(total - 1)", "e\(total)"])
        // A forgotten event is not found again.
        #expect(await follower.first(after: 0, timeout: .milliseconds(100)) { $0.event == "e1" } == nil)
    }
}
