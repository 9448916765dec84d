import Foundation
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// A long-running `thali-node run` (or any command) started with posix_spawn — not Foundation's
/// `Process`, see ``SpawnedCommand`` — whose standard output is collected as JSON lines. Killed and reaped
/// on `stop`/`kill` and on deinit.
final class RunningPeer: @unchecked Sendable {
    struct Timeout: Error, CustomStringConvertible {
        let description: String
    }

    let label: String
    let pid: pid_t
    private let lock = NSLock()
    private var raw = ""
    private var reaped: Int32?

    init(_ label: String, _ executable: String, _ arguments: [String]) throws {
        self.label = label
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw SpawnedCommand.Failure(description: "pipe: errno \(errno)") }
        let (readEnd, writeEnd) = (fds[0], fds[1])
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, writeEnd, 1)
        posix_spawn_file_actions_adddup2(&actions, writeEnd, 2)
        posix_spawn_file_actions_addclose(&actions, readEnd)
        posix_spawn_file_actions_addclose(&actions, writeEnd)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var emptyMask = sigset_t()
        sigemptyset(&emptyMask)
        posix_spawnattr_setsigmask(&attributes, &emptyMask)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK))
        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, executable, &actions, &attributes, argv, environ)
        close(writeEnd)
        guard spawned == 0 else {
            close(readEnd)
            throw SpawnedCommand.Failure(description: "posix_spawn \(executable): errno \(spawned)")
        }
        self.pid = pid
        Thread { [weak self] in
            var buffer = [UInt8](repeating: 0, count: 16384)
            while true {
                let count = read(readEnd, &buffer, buffer.count)
                if count < 0 && errno == EINTR { continue }
                if count <= 0 { break }
                guard let self else { break }
                let text = String(decoding: buffer[0..<count], as: UTF8.self)
                self.lock.withLock { self.raw += text }
            }
            close(readEnd)
        }.start()
    }

    deinit { kill(signal: SIGKILL) }

    /// Everything printed so far.
    var output: String { lock.withLock { raw } }

    /// The JSON lines printed so far.
    var events: [[String: Any]] {
        output.split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
    }

    /// Waits for a JSON line that satisfies `predicate`.
    @discardableResult
    func waitFor(_ what: String, timeout: Duration = .seconds(20),
                 _ predicate: ([String: Any]) -> Bool) async throws -> [String: Any] {
        let clock = ContinuousClock()
        let end = clock.now + timeout
        while clock.now < end {
            if let line = events.first(where: predicate) { return line }
            if hasExited { break }
            try await Task.sleep(for: .milliseconds(50))
        }
        throw Timeout(description: "\(label): no \(what) within \(timeout); output:\n\(output)")
    }

    /// Whether the process has exited (reaps it).
    var hasExited: Bool {
        lock.withLock {
            if reaped != nil { return true }
            var status: Int32 = 0
            if waitpid(pid, &status, WNOHANG) == pid { reaped = status }
            return reaped != nil
        }
    }

    /// Sends `signal`, waits up to `grace` for the exit (SIGKILL after), reaps; returns the exit code.
    @discardableResult
    func kill(signal: Int32 = SIGTERM, grace: Duration = .seconds(10)) -> Int32 {
        if !hasExited {
            Glibc.kill(pid, signal)
            let clock = ContinuousClock()
            let end = clock.now + grace
            while !hasExited && clock.now < end { usleep(20_000) }
            if !hasExited {
                Glibc.kill(pid, SIGKILL)
                lock.withLock {
                    var status: Int32 = 0
                    while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
                    reaped = status
                }
            }
        }
        let status = lock.withLock { reaped ?? 0 }
        return (status & 0x7F) == 0 ? (status >> 8) & 0xFF : 128 + (status & 0x7F)
    }
}

/// `line["event"] == name` and every `fields` value equal (as text).
func isEvent(_ line: [String: Any], _ name: String, _ fields: [String: String] = [:]) -> Bool {
    guard line["event"] as? String == name else { return false }
    return fields.allSatisfy { key, value in line[key].map { "\($0)" } == value }
}
