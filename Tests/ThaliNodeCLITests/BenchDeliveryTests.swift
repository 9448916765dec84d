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
        let object = try await thaliNodeJSONObject(["bench", "delivery", "--json", "--texts", "5", "--file-mib", "1", "--tls-mib", "4",
                                                    "--node-mib", "1"])
        #expect(Set(object.keys) == ["texts", "texts_s", "texts_per_s", "ms_per_text", "file_mib", "file_queue_s",
                                     "file_queue_mb_s", "file_s", "file_mb_s", "file_cpu_s", "chunk_bytes", "tls_bulk_mb_s", "file_tls_ratio",
                                     "disk_mb_s", "file_disk_ratio", "node_file_mib", "node_file_s", "node_file_mb_s",
                                     "node_file_cpu_s", "node_file_tls_ratio"])
        // The file between two nodes went through two real `run` processes, which found each other.
        #expect(object["node_file_mib"] as? Int == 1 && (object["node_file_mb_s"] as? Double ?? 0) > 0)
        #expect((object["node_file_tls_ratio"] as? Double ?? 0) > 0 && (object["node_file_cpu_s"] as? Double ?? -1) >= 0)
        #expect((object["tls_bulk_mb_s"] as? Double ?? 0) > 0 && (object["file_tls_ratio"] as? Double ?? 0) > 0)
        #expect(object["texts"] as? Int == 5 && object["file_mib"] as? Int == 1)
        #expect((object["texts_per_s"] as? Double ?? 0) > 0 && (object["file_mb_s"] as? Double ?? 0) > 0)
        #expect((object["disk_mb_s"] as? Double ?? 0) > 0 && (object["file_disk_ratio"] as? Double ?? 0) > 0)

        // Without texts, TLS or nodes, their keys are absent, not zero.
        let fileObject = try await thaliNodeJSONObject(["bench", "delivery", "--json", "--texts", "0", "--file-mib", "1", "--tls-mib", "0",
                                                        "--node-mib", "0"])
        #expect(fileObject["texts_per_s"] == nil && fileObject["file_mb_s"] is Double)
        #expect(fileObject["tls_bulk_mb_s"] == nil && fileObject["file_tls_ratio"] == nil && fileObject["node_file_mb_s"] == nil)
    }

    /// The receiver's durable write, seen in its system calls (`strace`). Through the page cache
    /// (`--buffered-writes`), a 32 MiB file goes to its partial file with its writeback started every
    /// `writebackBytes` (8 MiB; so the disk works while the rest arrives, in a few requests, not one per
    /// 1 MiB block, each of which could hold the next block back while the device's queue was full). With
    /// direct I/O (the default) the partial file is opened `O_DIRECT` and no writeback is asked for: its
    /// content is on the disk already. Either way the file is synced once, after everything. Before any of
    /// it the bench synced its own payload and its disk reference: nothing of its setup is left for the
    /// kernel to write back while the delivery is timed.
    @Test("the receiver syncs once; through the page cache it starts writeback every writebackBytes, with direct I/O never; the bench syncs its setup first",
          arguments: [false, true])
    func receiverStartsWritebackAndSyncsOnce(direct: Bool) async throws {
        let strace = try #require(ChildProcess.which("strace"), "strace is needed to see the receiver's system calls")
        let trace = FileManager.default.temporaryDirectory.appendingPathComponent("thali-strace-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: trace) }
        let mib = 32, writeback = DeliveryLimits.default.writebackBytes
        let arguments = ["-f", "-y", "-o", trace, "-e", "trace=openat,fsync,fdatasync,sync_file_range", CommandLineTests.executable,
                         "bench", "delivery", "--json", "--texts", "0", "--file-mib", "\(mib)", "--tls-mib", "0", "--node-mib", "0"]
            + (direct ? [] : ["--buffered-writes"])
        let result = try await Task.detached { try ChildProcess.run(strace, arguments, timeout: .seconds(60)) }.value
        #expect(result.status == 0, "\(result.output)")
        let lines = try String(contentsOfFile: trace, encoding: .utf8).split(separator: "\n")
        // The partial file opened for direct writes, or not at all.
        let directOpens = lines.filter { $0.contains("openat(") && $0.contains(".part\"") && $0.contains("O_DIRECT") }
        #expect(directOpens.count == (direct ? 1 : 0), "\(lines.filter { $0.contains(".part\"") })")
        // Every call in the order made, with its file (`-y` names each descriptor's file) and its arguments.
        let calls = lines.compactMap { line -> (String, String, [Substring])? in
            guard let match = line.firstMatch(of: /(sync_file_range|fsync|fdatasync)\(\d+<([^>]*)>,? ?(.*)/) else { return nil }
            return (String(match.1), String(match.2), match.3.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces)[...] })
        }
        let partial = calls.enumerated().filter { $0.element.1.hasSuffix(".part") }
        let syncs = partial.filter { $0.element.0 != "sync_file_range" }
        #expect(syncs.count == 1, "\(partial)")
        let writebacks = partial.filter { $0.element.0 == "sync_file_range" }
        // Contiguous ranges from 0, each at least writebackBytes, all before the sync.
        var covered = 0
        for (index, call) in writebacks {
            #expect(call.2.count >= 2 && Int(call.2[0]) == covered, "\(call)")
            let length = call.2.count >= 2 ? Int(call.2[1]) ?? 0 : 0
            #expect(length >= writeback, "\(call)")
            covered += length
            #expect(index < (syncs.first?.offset ?? 0), "writeback started after the sync: \(partial)")
        }
        if direct {
            #expect(writebacks.isEmpty, "\(partial)")
        } else {
            #expect(covered <= mib << 20 && (1...(mib << 20) / writeback).contains(writebacks.count), "\(partial)")
        }
        // The bench's payload and disk reference, each synced before the receiver's first call.
        let firstPartial = partial.first?.offset ?? 0
        for name in ["payload.bin", "disk-reference.bin"] {
            let synced = calls.firstIndex { call in
                let file = URL(fileURLWithPath: call.1)
                return call.0 == "fsync" && file.lastPathComponent == name
                    && file.deletingLastPathComponent().lastPathComponent.hasPrefix("thali-bench-")
            }
            #expect(synced.map { $0 < firstPartial } == true, "\(name) not synced before the delivery: \(calls)")
        }
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
