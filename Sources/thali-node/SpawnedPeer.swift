import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A child `thali-node run`, started with posix_spawn (Foundation's `Process.run()` can crash on this
/// Swift/Linux when many descriptors are open). Standard output is read line by line on a thread and
/// handed to `onLine`; standard error goes to `stderrPath`. `terminate()` stops it (SIGTERM, then SIGKILL
/// after a grace period) and reaps it; deinit does the same, so no exit path leaves it running.
final class SpawnedPeer: @unchecked Sendable {
    struct SpawnError: Error, CustomStringConvertible {
        let description: String
    }

    let name: String
    let pid: pid_t
    private let lock = NSLock()
    private var reaped = false
    private var exitStatus: Int32?

    init(name: String, executable: String, arguments: [String], stderrPath: String,
         onLine: @escaping @Sendable (String) -> Void) throws {
        self.name = name
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw SpawnError(description: "pipe: errno \(errno)") }
        let (readEnd, writeEnd) = (fds[0], fds[1])
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, writeEnd, 1)
        posix_spawn_file_actions_addopen(&actions, 2, stderrPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
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
            throw SpawnError(description: "cannot start \(executable): errno \(spawned)")
        }
        self.pid = pid
        let reader = Thread {
            let handle = FileHandle(fileDescriptor: readEnd, closeOnDealloc: true)
            var pending = Data()
            while true {
                let chunk = handle.availableData
                if chunk.isEmpty { break }
                pending.append(chunk)
                while let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
                    onLine(String(decoding: pending[pending.startIndex..<newline], as: UTF8.self))
                    pending.removeSubrange(pending.startIndex...newline)
                }
            }
        }
        reader.start()
    }

    deinit { terminate(grace: 0) }

    /// Whether the child has exited (reaps it if so).
    var hasExited: Bool {
        lock.withLock {
            if reaped { return true }
            var status: Int32 = 0
            if waitpid(pid, &status, WNOHANG) == pid {
                reaped = true
                exitStatus = status
            }
            return reaped
        }
    }

    /// SIGTERM, up to `grace` seconds for a clean exit, then SIGKILL; reaps. Returns the exit code
    /// (128 + signal when killed by one).
    @discardableResult
    func terminate(grace: Double = 5) -> Int32 {
        if !hasExited {
            kill(pid, SIGTERM)
            let deadline = Date().addingTimeInterval(grace)
            while !hasExited && Date() < deadline { usleep(20_000) }
            if !hasExited {
                kill(pid, SIGKILL)
                lock.withLock {
                    var status: Int32 = 0
                    while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
                    reaped = true
                    exitStatus = status
                }
            }
        }
        let status = lock.withLock { exitStatus ?? 0 }
        return (status & 0x7F) == 0 ? (status >> 8) & 0xFF : 128 + (status & 0x7F)
    }
}
