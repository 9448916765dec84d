import Foundation
import Testing
import ThaliProcess

/// A file's `fsync` does not make its name durable: after a rename into place, a power loss can take the
/// new name back while the database row committed next points at it. Seen in the system calls of
/// `thali-node bench delivery` (`strace`), the receiver syncs the item's inbox directory and `inbox/`
/// after moving the received file there and before its commit syncs the log; the sender syncs `outbox/`
/// after moving a queued file's copy into place.
@Suite("durable names in the data directory", .serialized)
struct DurableNamesTests {
    /// One traced call: its name, the file its first descriptor names (`-y`), and its text.
    struct Call {
        let name: String
        let file: String
        let line: String
    }

    @Test("the received file's directories are synced between its rename and the commit; the outbox after a queued copy")
    func renamesSyncedBeforeTheRowThatNamesThem() async throws {
        let strace = try #require(ChildProcess.which("strace"), "strace is needed to see the node's system calls")
        let trace = FileManager.default.temporaryDirectory.appendingPathComponent("thali-strace-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: trace) }
        let arguments = ["-f", "-y", "-o", trace, "-e", "trace=fsync,fdatasync,rename,renameat,renameat2", CommandLineTests.executable,
                         "bench", "delivery", "--json", "--texts", "0", "--file-mib", "1", "--tls-mib", "0", "--node-mib", "0"]
        let result = try await Task.detached { try ChildProcess.run(strace, arguments, timeout: .seconds(60)) }.value
        #expect(result.status == 0, "\(result.output)")
        let calls = try String(contentsOfFile: trace, encoding: .utf8).split(separator: "\n").compactMap { line -> Call? in
            guard let match = line.firstMatch(of: /(fsync|fdatasync|rename|renameat2?)\((?:\d+<([^>]*)>)?/) else { return nil }
            return Call(name: String(match.1), file: match.2.map(String.init) ?? "", line: String(line))
        }

        // The receiver: the partial file renamed to inbox/<id>/<name>, then both directories synced, then the log.
        let intoInbox = try #require(calls.firstIndex { $0.name.hasPrefix("rename") && $0.line.contains("/bob/inbox/") },
                                     "no rename into the inbox: \(calls.map(\.line))")
        let itemDirectory = try #require(calls[intoInbox].line.firstMatch(of: /"([^"]*\/bob\/inbox\/[^\/"]+)\/[^\/"]+"\)/)).1
        let inbox = URL(fileURLWithPath: String(itemDirectory)).deletingLastPathComponent().path
        let commit = calls[intoInbox...].firstIndex { $0.file.hasSuffix("/bob/node.sqlite-wal") } ?? calls.endIndex
        let between = calls[intoInbox..<commit]
        #expect(between.contains { $0.name == "fsync" && $0.file == String(itemDirectory) }, "\(calls.map(\.line))")
        #expect(between.contains { $0.name == "fsync" && $0.file == inbox }, "\(calls.map(\.line))")
        #expect(commit < calls.endIndex, "the commit's log sync is missing: \(calls.map(\.line))")

        // The sender: the queued copy renamed into outbox/, then outbox/ synced.
        let intoOutbox = try #require(calls.firstIndex { $0.name.hasPrefix("rename") && $0.line.contains(".copying\", ") },
                                      "no queued copy renamed into place: \(calls.map(\.line))")
        #expect(calls[intoOutbox...].contains { $0.name == "fsync" && $0.file.hasSuffix("/alice/outbox") }, "\(calls.map(\.line))")
    }
}
