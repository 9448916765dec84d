import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A child process: an independent peer started by a test (`openssl s_server`, `gssdp-discover`, a Go
/// program, a Python mock), or a `thali-node run` started by the demo and the benchmarks. Its standard
/// output and error are collected (or its output handed over line by line, and its errors written to a
/// file); it is killed and reaped when the owner calls `terminate()` or drops the last reference, so no
/// exit path leaves a process behind.
///
/// Started with `posix_spawn`, not Foundation's `Process`: on Linux with Swift 6.3.1, `Process.run()`
/// crashes intermittently when the process has many descriptors open (it over-reads `struct dirent`
/// while scanning /proc/self/fd), and every test target shares one process. The child starts with an
/// empty signal mask: the test runner's threads block SIGTERM, and a blocked mask survives exec.
public final class ChildProcess: @unchecked Sendable {
    /// glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34 and later), which Swift's Glibc module
    /// does not import (it is declared for `_GNU_SOURCE` only); nil on an older C library.
    private static let addCloseFrom: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32)? = {
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") else { return nil }
        return unsafeBitCast(symbol, to: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32).self)
    }()

    /// Raised when a child does not produce what its owner waits for in time.
    public struct Timeout: Error, CustomStringConvertible {
        public let waitingFor: String
        public let output: String
        public var description: String { "timed out waiting for \(waitingFor); output so far:\n\(output)" }
    }

    /// Raised when a child cannot be started.
    public struct SpawnFailure: Error, CustomStringConvertible {
        public let description: String
    }

    /// The longest line handed to `onOutputLine` at once; a longer one comes in pieces of this size.
    public static let maxLineBytes = 1 << 20

    /// The child's process id.
    public let pid: pid_t
    private let inputFD: Int32
    private let lock = NSLock()
    private var collected = Data()
    private var reapedStatus: Int32?
    private var inputClosed = false
    private var outputEnded = false

    /// Starts `executable` (a path, or a name looked up in `PATH`) with `arguments`; `environment` is
    /// added to this process's environment. Standard error goes with standard output unless
    /// `standardErrorPath` names a file for it (created or truncated). With `onOutputLine`, each line of
    /// output (without its newline) goes there as it arrives instead of being collected in ``output``, so
    /// a long-running child holds no growing buffer.
    public init(_ executable: String, _ arguments: [String], environment: [String: String]? = nil,
                standardErrorPath: String? = nil, onOutputLine: (@Sendable (String) -> Void)? = nil) throws {
        guard let path = ChildProcess.which(executable) else {
            throw SpawnFailure(description: "\(executable): not found in PATH")
        }
        var inputPipe: [Int32] = [0, 0]
        var outputPipe: [Int32] = [0, 0]
        guard pipe(&inputPipe) == 0 else { throw SpawnFailure(description: "pipe: errno \(errno)") }
        guard pipe(&outputPipe) == 0 else {
            close(inputPipe[0]); close(inputPipe[1])
            throw SpawnFailure(description: "pipe: errno \(errno)")
        }

        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, inputPipe[0], 0)
        posix_spawn_file_actions_adddup2(&actions, outputPipe[1], 1)
        if let standardErrorPath {
            posix_spawn_file_actions_addopen(&actions, 2, standardErrorPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        } else {
            posix_spawn_file_actions_adddup2(&actions, outputPipe[1], 2)
        }
        for fd in inputPipe + outputPipe { posix_spawn_file_actions_addclose(&actions, fd) }
        // Nothing else of ours: NIO opens sockets without close-on-exec, and a daemon started here (dbus-daemon,
        // dbusmock) would otherwise keep a test's listening port, or another child's output pipe, open after
        // its owner closed it (the port still accepting, the pipe never ending).
        _ = Self.addCloseFrom?(&actions, 3)

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var emptyMask = sigset_t()
        sigemptyset(&emptyMask)
        posix_spawnattr_setsigmask(&attributes, &emptyMask)
        // SIGPIPE is ignored in the test process (NIO) and ignored dispositions survive exec too.
        var defaults = sigset_t()
        sigemptyset(&defaults)
        sigaddset(&defaults, SIGPIPE)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))

        let merged = ProcessInfo.processInfo.environment.merging(environment ?? [:]) { $1 }
        let argv = ([path] + arguments).map { strdup($0) } + [nil]
        let envp = merged.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            argv.forEach { free($0) }
            envp.forEach { free($0) }
        }
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, path, &actions, &attributes, argv, envp)
        close(inputPipe[0])
        close(outputPipe[1])
        guard spawned == 0 else {
            close(inputPipe[1]); close(outputPipe[0])
            throw SpawnFailure(description: "posix_spawn \(path): \(String(cString: strerror(spawned)))")
        }
        self.pid = pid
        self.inputFD = inputPipe[1]

        let outputFD = outputPipe[0]
        let reader = Thread { [weak self] in
            var buffer = [UInt8](repeating: 0, count: 16_384)
            var line: [UInt8] = []
            while true {
                let count = read(outputFD, &buffer, buffer.count)
                if count < 0 && errno == EINTR { continue }
                guard count > 0 else { break }
                if let onOutputLine {
                    for byte in buffer[0..<count] {
                        // A line longer than `maxLineBytes` is handed over in pieces: the buffer stays bounded.
                        if byte == UInt8(ascii: "\n") || line.count >= ChildProcess.maxLineBytes {
                            onOutputLine(String(decoding: line, as: UTF8.self))
                            line.removeAll(keepingCapacity: true)
                            if byte != UInt8(ascii: "\n") { line.append(byte) }
                        } else {
                            line.append(byte)
                        }
                    }
                    continue
                }
                guard let self else { break }
                self.lock.withLock { self.collected.append(contentsOf: buffer[0..<count]) }
            }
            close(outputFD)
            if let self { self.lock.withLock { self.outputEnded = true } }
        }
        reader.name = "ChildProcess \(pid) output"
        reader.start()
    }

    deinit {
        terminate()
        closeInput()
    }

    /// Everything the child wrote to stdout and stderr so far.
    public var output: String { lock.withLock { String(decoding: collected, as: UTF8.self) } }

    /// Whether the child is still running (reaps it if it has exited).
    public var isRunning: Bool { reap(blocking: false) == nil }

    /// Writes to the child's standard input.
    public func write(_ text: String) { write(Data(text.utf8)) }

    /// Writes bytes to the child's standard input (ignored once the input is closed or the child gone).
    public func write(_ data: Data) {
        lock.withLock {
            guard !inputClosed else { return }
            data.withUnsafeBytes { bytes in
                guard let base = bytes.baseAddress else { return }
                var offset = 0
                while offset < bytes.count {
                    let written = Glibc.write(inputFD, base + offset, bytes.count - offset)
                    if written < 0 && errno == EINTR { continue }
                    guard written > 0 else { return }
                    offset += written
                }
            }
        }
    }

    /// Closes the child's standard input (some tools, like `openssl s_server`, end on that).
    public func closeInput() {
        lock.withLock {
            guard !inputClosed else { return }
            inputClosed = true
            close(inputFD)
        }
    }

    /// Waits until the output contains `text`.
    public func waitForOutput(containing text: String, timeout: Duration = .seconds(10)) async throws {
        let deadline = ContinuousClock.now + timeout
        while !output.contains(text) {
            guard ContinuousClock.now < deadline else { throw Timeout(waitingFor: "\"\(text)\"", output: output) }
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    /// Waits for the child to exit by itself and for its output to be read to the end, and returns its
    /// exit status (128 + signal if killed). A child's last write may still sit in the pipe when it is
    /// reaped, so `output` is complete only once the pipe reports its end; a grandchild that keeps the
    /// pipe open holds that end back, so after the exit it is awaited for at most `outputGrace`.
    @discardableResult
    public func waitForExit(timeout: Duration = .seconds(10), outputGrace: Duration = .seconds(2)) async throws -> Int32 {
        let deadline = ContinuousClock.now + timeout
        var exitStatus: Int32?
        var outputDeadline = deadline
        while true {
            if exitStatus == nil, let status = reap(blocking: false) {
                exitStatus = status
                outputDeadline = min(deadline, ContinuousClock.now + outputGrace)
            }
            if let exitStatus {
                if lock.withLock({ outputEnded }) || ContinuousClock.now >= outputDeadline { return exitStatus }
            } else if ContinuousClock.now >= deadline {
                throw Timeout(waitingFor: "exit", output: output)
            }
            try await Task.sleep(for: .milliseconds(exitStatus == nil ? 20 : 5))
        }
    }

    /// Blocks until the child exits and its output has been read to the end; on timeout kills it and
    /// throws. For synchronous callers (command-line tools run to completion).
    @discardableResult
    public func waitUntilExit(timeout: Duration = .seconds(30)) throws -> Int32 {
        let deadline = ContinuousClock.now + timeout
        while true {
            if let status = reap(blocking: false), lock.withLock({ outputEnded }) { return status }
            guard ContinuousClock.now < deadline else {
                terminate(signal: SIGKILL)
                throw Timeout(waitingFor: "exit", output: output)
            }
            usleep(5_000)
        }
    }

    /// Sends `signal` (SIGTERM by default), then SIGKILL if the child has not gone after a grace period,
    /// reaps it and returns its exit status (128 + signal if a signal ended it).
    @discardableResult
    public func terminate(signal: Int32 = SIGTERM, grace: Duration = .seconds(2)) -> Int32 {
        if let status = reap(blocking: false) { return status }
        kill(pid, signal)
        let deadline = ContinuousClock.now + grace
        while true {
            if let status = reap(blocking: false) { return status }
            guard ContinuousClock.now < deadline else {
                kill(pid, SIGKILL)
                return reap(blocking: true) ?? 128 + SIGKILL
            }
            usleep(10_000)
        }
    }

    /// The exit status once the child has exited (reaping it); nil while it runs.
    public var exitStatus: Int32? { reap(blocking: false) }

    /// Runs a command to completion with no input and returns its exit status and output
    /// (stdout and stderr together); kills it and throws ``Timeout`` after `timeout`.
    public static func run(_ executable: String, _ arguments: [String], environment: [String: String]? = nil,
                           timeout: Duration = .seconds(30)) throws -> (status: Int32, output: String) {
        let child = try ChildProcess(executable, arguments, environment: environment)
        child.closeInput()
        let status = try child.waitUntilExit(timeout: timeout)
        return (status, child.output)
    }

    /// The exit status once the child has exited, reaping it; nil while it runs.
    private func reap(blocking: Bool) -> Int32? {
        lock.withLock {
            if let reapedStatus { return reapedStatus }
            var status: Int32 = 0
            var result: pid_t
            repeat { result = waitpid(pid, &status, blocking ? 0 : WNOHANG) } while result < 0 && errno == EINTR
            guard result == pid else { return nil }
            // WIFEXITED/WEXITSTATUS are macros: the exit code is in bits 8-15 when the low 7 bits are 0.
            let decoded = (status & 0x7F) == 0 ? (status >> 8) & 0xFF : 128 + (status & 0x7F)
            reapedStatus = decoded
            return decoded
        }
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
}
