import Foundation
import Testing

/// `thali-node bench relay --json` as scripts read it (issue 25): a tiny run through two real relaying
/// nodes; the figures are printed, never asserted, but every byte is checked against the pattern.
@Suite("thali-node bench relay", .serialized)
struct BenchRelayTests {
    @Test("--json prints the relay and direct figures, and every byte of both paths was checked")
    func jsonFigures() async throws {
        let object = try await thaliNodeJSONObject(["bench", "relay", "--json", "--mib", "1", "--parallel", "2",
                                                    "--parallel-mib", "1", "--requests", "5"])
        #expect(Set(object.keys) == ["relay_mb_s", "direct_mb_s", "parallel_ratio", "added_latency_ms", "relay_parallel_mb_s",
                                     "direct_parallel_mb_s", "relay_latency_ms", "direct_latency_ms", "verified_bytes",
                                     "mib", "parallel", "parallel_mib", "requests"])
        for key in ["relay_mb_s", "direct_mb_s", "relay_parallel_mb_s", "direct_parallel_mb_s", "relay_latency_ms", "direct_latency_ms"] {
            #expect((object[key] as? Double ?? 0) > 0, "\(key): \(object[key] ?? "absent")")
        }
        // Per path: one 1 MiB stream, two of 1 MiB, and 5 + 1 (warm-up) responses of 64 bytes.
        let perPath = (1 << 20) + 2 * (1 << 20) + 64 * 6
        #expect(object["verified_bytes"] as? Int == 2 * perPath)
    }
}
