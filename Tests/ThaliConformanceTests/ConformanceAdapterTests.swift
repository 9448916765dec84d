import Foundation
import Testing
@testable import ThaliConformance

/// The adapter's verbs that run to completion are bounded by its timeout whatever they do with their
/// pipes, and read both pipes at once.
@Suite("Conformance adapter verbs")
struct ConformanceAdapterTests {
    /// An adapter running `script` under `/bin/sh -c`, the verb's words as its arguments.
    static func adapter(_ script: String, timeout: Duration) -> ConformanceAdapter {
        ConformanceAdapter(command: ["/bin/sh", "-c", script, "sh"], timeout: timeout)
    }

    @Test("a verb that exits but leaves a process holding its output fails at the timeout, not when that process ends")
    func aLeftoverChildDoesNotHoldTheRun() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("thali-adapter-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let pidFile = directory + "/daemon.pid"
        // A `send` that starts a daemon of its own (which inherits standard output), prints its answer and exits.
        let adapter = Self.adapter("sleep 120 & echo $! > \(pidFile); echo '{\"id\":\"\(UUID().uuidString)\"}'", timeout: .seconds(2))
        defer {
            if let text = try? String(contentsOfFile: pidFile, encoding: .utf8), let pid = pid_t(text.trimmingCharacters(in: .whitespacesAndNewlines)) {
                kill(pid, SIGKILL)
            }
        }
        let failure = await #expect(throws: ConformanceAdapter.Failure.self) {
            _ = try await adapter.send(text: "hello", to: "bob")
        }
        #expect(failure?.description.contains("did not end within") == true, "\(failure.map(String.init(describing:)) ?? "none")")
    }

    @Test("a verb that writes much to standard error before its answer succeeds")
    func standardErrorIsReadMeanwhile() async throws {
        let id = UUID()
        // 200 KB of standard error first: more than a pipe holds, so it blocks unless both pipes are read.
        let adapter = Self.adapter("head -c 200000 /dev/zero | tr '\\0' e >&2; echo '{\"id\":\"\(id.uuidString)\"}'", timeout: .seconds(10))
        #expect(try await adapter.send(text: "hello", to: "bob") == id)
    }

    @Test("a failing verb's standard error is quoted, its first bytes only")
    func failureQuotesStandardError() async throws {
        let adapter = Self.adapter("echo 'no such contact' >&2; head -c 10000 /dev/zero | tr '\\0' x >&2; exit 3", timeout: .seconds(10))
        let failure = await #expect(throws: ConformanceAdapter.Failure.self) {
            _ = try await adapter.send(text: "hello", to: "bob")
        }
        let text = failure?.description ?? ""
        #expect(text.contains("exit 3: no such contact"), "\(text.prefix(200))")
        #expect(text.count < VerbOutput.keptErrorBytes + 400)
    }
}
