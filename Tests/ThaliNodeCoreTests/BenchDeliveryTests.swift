import Foundation
import Testing
import ThaliProcess
@testable import ThaliNodeCore

/// `thali-node bench delivery --json` as scripts read it (issue 25): one JSON object, snake_case keys,
/// `texts_per_s` and `file_mb_s` among them. A tiny run: the figures are printed, never asserted.
@Suite("thali-node bench delivery", .serialized)
struct BenchDeliveryTests {
    @Test("--json prints one object with every figure the lines print, and nothing else")
    func jsonFigures() async throws {
        let object = try await thaliNodeJSONObject(["bench", "delivery", "--json", "--texts", "5", "--file-mib", "1", "--tls-mib", "4"])
        #expect(Set(object.keys) == ["texts", "texts_s", "texts_per_s", "ms_per_text", "file_mib", "file_queue_s",
                                     "file_queue_mb_s", "file_s", "file_mb_s", "chunk_bytes", "tls_bulk_mb_s", "file_tls_ratio"])
        #expect((object["tls_bulk_mb_s"] as? Double ?? 0) > 0 && (object["file_tls_ratio"] as? Double ?? 0) > 0)
        #expect(object["texts"] as? Int == 5 && object["file_mib"] as? Int == 1)
        #expect((object["texts_per_s"] as? Double ?? 0) > 0 && (object["file_mb_s"] as? Double ?? 0) > 0)

        // Without texts, the text keys are absent, not zero.
        let fileObject = try await thaliNodeJSONObject(["bench", "delivery", "--json", "--texts", "0", "--file-mib", "1", "--tls-mib", "0"])
        #expect(fileObject["texts_per_s"] == nil && fileObject["file_mb_s"] is Double)
        #expect(fileObject["tls_bulk_mb_s"] == nil && fileObject["file_tls_ratio"] == nil)
    }
}

/// Runs `thali-node` with `arguments`, expects exit 0 and exactly one line, and returns that line's JSON object.
func thaliNodeJSONObject(_ arguments: [String], sourceLocation: SourceLocation = #_sourceLocation) async throws -> [String: Any] {
    let executable = CommandLineTests.executable
    let result = try await Task.detached { try ChildProcess.run(executable, arguments, timeout: .seconds(60)) }.value
    #expect(result.status == 0, "\(result.output)", sourceLocation: sourceLocation)
    let lines = result.output.split(separator: "\n")
    #expect(lines.count == 1, "\(result.output)", sourceLocation: sourceLocation)
    let line = try #require(lines.first, sourceLocation: sourceLocation)
    return try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any], sourceLocation: sourceLocation)
}
