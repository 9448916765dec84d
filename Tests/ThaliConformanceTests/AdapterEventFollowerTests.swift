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

    @Test("a line over the limit ends the reading at that line, whether its newline came in the same read or not")
    func lineLimitDoesNotDependOnReads() {
        let output = Array("{\"event\":\"a\"}\n".utf8) + [UInt8](repeating: UInt8(ascii: "x"), count: 40)
            + Array("\n{\"event\":\"b\"}\n".utf8)
        for size in [output.count, 20, 1] {
            var log = AdapterEventLog(maxEvents: 8, maxLineBytes: 32)
            for start in stride(from: 0, to: output.count, by: size) {
                log.read(output[start..<min(start + size, output.count)], readAt: .now())
            }
            log.endOfOutput()
            #expect(log.events.map(\.event) == ["a"], "reads of \(size) bytes")
            #expect(log.ended == "a line longer than 32 bytes", "reads of \(size) bytes")
        }
    }
}

