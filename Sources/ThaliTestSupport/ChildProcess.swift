import Foundation

/// An independent peer process started by a test (`openssl s_server`, `gssdp-discover`, a Go program,
/// a Python mock). Its standard output and error are collected; it is killed and reaped when the test
/// calls `terminate()` or drops the last reference, so no test leaves a process behind.
public final class ChildProcess: @unchecked Sendable {
    /// Raised when a child does not produce what a test waits for in time.
    public struct Timeout: Error, CustomStringConvertible {
        public let waitingFor: String
        public let output: String
        public var description: String { "timed out waiting for \(waitingFor); output so far:\n\(output)" }
    }

    private let process = Process()
    private let stdinPipe = Pipe()
    private let outputPipe = Pipe()
    private let lock = NSLock()
    private var collected = Data()

    /// Starts `executable` (a path, or a name looked up in `PATH`) with `arguments`.
    public init(_ executable: String, _ arguments: [String], environment: [String: String]? = nil,
                currentDirectory: String? = nil) throws {
        guard let path = ChildProcess.which(executable) else {
            throw CocoaError(.fileNoSuchFile, userInfo: [NSFilePathErrorKey: executable])
        }
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = arguments
        if let environment {
            process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        }
        if let currentDirectory { process.currentDirectoryURL = URL(fileURLWithPath: currentDirectory) }
        process.standardInput = stdinPipe
        process.standardOutput = outputPipe
        process.standardError = outputPipe
        outputPipe.fileHandleForReading.readabilityHandler = { [weak self] handle in
            let data = handle.availableData
            guard let self, !data.isEmpty else { return }
            self.lock.withLock { self.collected.append(data) }
        }
        // A blocked signal mask survives exec, and the threads tests run on block SIGTERM among
        // others: spawn with nothing blocked so the child can be stopped like any process.
        var unblocked = sigset_t()
        var previous = sigset_t()
        sigemptyset(&unblocked)
        pthread_sigmask(SIG_SETMASK, &unblocked, &previous)
        defer { pthread_sigmask(SIG_SETMASK, &previous, nil) }
        try process.run()
    }

    deinit { terminate() }

    /// Everything the child wrote to stdout and stderr so far.
    public var output: String { lock.withLock { String(decoding: collected, as: UTF8.self) } }

    /// The child's process id.
    public var pid: Int32 { process.processIdentifier }

    /// Whether the child is still running.
    public var isRunning: Bool { process.isRunning }

    /// Writes to the child's standard input.
    public func write(_ text: String) { write(Data(text.utf8)) }

    /// Writes bytes to the child's standard input.
    public func write(_ data: Data) { try? stdinPipe.fileHandleForWriting.write(contentsOf: data) }

    /// Closes the child's standard input (some tools, like `openssl s_server`, end on that).
    public func closeInput() { try? stdinPipe.fileHandleForWriting.close() }

    /// Waits until the output contains `text`.
    public func waitForOutput(containing text: String, timeout: Duration = .seconds(10)) async throws {
        let deadline = ContinuousClock.now + timeout
        while !output.contains(text) {
            guard ContinuousClock.now < deadline else { throw Timeout(waitingFor: "\"\(text)\"", output: output) }
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    /// Waits for the child to exit by itself and returns its exit status.
    @discardableResult
    public func waitForExit(timeout: Duration = .seconds(10)) async throws -> Int32 {
        let deadline = ContinuousClock.now + timeout
        while process.isRunning {
            guard ContinuousClock.now < deadline else { throw Timeout(waitingFor: "exit", output: output) }
            try await Task.sleep(for: .milliseconds(20))
        }
        return process.terminationStatus
    }

    /// Sends `signal` (SIGTERM by default), then SIGKILL if the child has not gone after a grace period,
    /// and reaps it.
    public func terminate(signal: Int32 = SIGTERM, grace: Duration = .seconds(2)) {
        guard process.isRunning else { return finish() }
        kill(process.processIdentifier, signal)
        let deadline = ContinuousClock.now + grace
        while process.isRunning && ContinuousClock.now < deadline { usleep(10_000) }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
        finish()
    }

    private func finish() {
        outputPipe.fileHandleForReading.readabilityHandler = nil
        try? stdinPipe.fileHandleForWriting.close()
    }

    /// The full path of `name`, looked up in `PATH` unless it already contains a slash.
    public static func which(_ name: String) -> String? {
        if name.contains("/") { return FileManager.default.isExecutableFile(atPath: name) ? name : nil }
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        for dir in path.split(separator: ":") {
            let candidate = "\(dir)/\(name)"
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
        }
        return nil
    }

    /// The Python interpreter of the test venv prepared by `scripts/bootstrap.sh --test`
    /// (`THALI_TEST_VENV`, else `.venv-test` in the package root), if it exists.
    public static func testVenvPython(packageRoot: String) -> String? {
        let venv = ProcessInfo.processInfo.environment["THALI_TEST_VENV"] ?? "\(packageRoot)/.venv-test"
        let python = "\(venv)/bin/python"
        return FileManager.default.isExecutableFile(atPath: python) ? python : nil
    }
}
