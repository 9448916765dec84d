import Foundation
import Testing

/// `thali-node bench send --json` as scripts read it (issue 40): a small run through a real peer; the
/// figures are printed, never asserted.
@Suite("thali-node bench send", .serialized)
struct BenchSendTests {
    @Test("--json prints the send and pool figures of every send made")
    func jsonFigures() async throws {
        let object = try await thaliNodeJSONObject(["bench", "send", "--json", "--contacts", "20", "--rounds", "2"])
        #expect(Set(object.keys) == ["contacts", "sends", "send_ms_median", "send_ms_max", "pool_stall_ms_max"])
        #expect(object["contacts"] as? Int == 20)
        #expect((object["sends"] as? Int ?? 0) >= 2, "\(object)")
        #expect((object["send_ms_median"] as? Double ?? 0) > 0, "\(object)")
    }
}
