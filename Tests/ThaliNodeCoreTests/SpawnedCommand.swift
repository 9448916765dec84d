import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Runs a command to completion with posix_spawn and collects its output (stdout and stderr together).
///
/// Not Foundation's `Process`: on Linux with Swift 6.3.1, `Process.run()` crashes intermittently (SIGSEGV,
/// an over-read of `struct dirent` while it scans /proc/self/fd; swift-corelibs-foundation PR #5472),
/// and this test target opens many sockets concurrently, which makes it likely.
struct SpawnedCommand {
    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    let status: Int32
    let output: String

    /// Runs `executable` with `arguments` and `environment` added to ours; kills it after `timeout` seconds.
    static func run(_ executable: String, _ arguments: [String], environment: [String: String] = [:],
                    timeout: Double = 30) throws -> SpawnedCommand {
        var pipeFDs: [Int32] = [0, 0]
        guard pipe(&pipeFDs) == 0 else { throw Failure(description: "pipe: errno \(errno)") }
        let (readEnd, writeEnd) = (pipeFDs[0], pipeFDs[1])
        defer { close(readEnd) }

        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, writeEnd, 1)
        posix_spawn_file_actions_adddup2(&actions, writeEnd, 2)
        posix_spawn_file_actions_addclose(&actions, readEnd)
        posix_spawn_file_actions_addclose(&actions, writeEnd)

        let merged = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        let envp = merged.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            argv.forEach { free($0) }
            envp.forEach { free($0) }
        }
        // The test runner's threads block signals, and a blocked mask survives exec: start with an empty one.
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var emptyMask = sigset_t()
        sigemptyset(&emptyMask)
        posix_spawnattr_setsigmask(&attributes, &emptyMask)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK))
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, executable, &actions, &attributes, argv, envp)
        close(writeEnd)
        guard spawned == 0 else { throw Failure(description: "posix_spawn \(executable): errno \(spawned)") }

        var output: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            var poller = pollfd(fd: readEnd, events: Int16(POLLIN), revents: 0)
            let remaining = Int32(max(0, deadline.timeIntervalSinceNow) * 1000)
            let ready = poll(&poller, 1, remaining)
            if ready == 0 {
                kill(pid, SIGKILL)
                var ignored: Int32 = 0
                waitpid(pid, &ignored, 0)
                throw Failure(description: "\(executable) did not finish in \(timeout) s; output: \(String(decoding: output, as: UTF8.self))")
            }
            if ready < 0 && errno == EINTR { continue }
            let count = read(readEnd, &buffer, buffer.count)
            if count < 0 && errno == EINTR { continue }
            if count <= 0 { break }
            output += buffer[0..<count]
        }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        // WIFEXITED/WEXITSTATUS are macros: exit status in bits 8-15 when the low 7 bits are 0.
        let exitStatus = (status & 0x7F) == 0 ? (status >> 8) & 0xFF : 128 + (status & 0x7F)
        return SpawnedCommand(status: exitStatus, output: String(decoding: output, as: UTF8.self))
    }
}
