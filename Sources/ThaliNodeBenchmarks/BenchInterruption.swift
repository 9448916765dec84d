import Foundation
import Synchronization
import ThaliProcess

#if canImport(Glibc)
import Glibc
#endif

/// How a benchmark ends on SIGINT, SIGTERM or SIGHUP (Ctrl-C, `kill`, a closed terminal) once it has
/// called ``install()``: every process it started, and every process those started (sshd's sessions),
/// is sent SIGTERM, then SIGKILL after ``grace``, and its own children are reaped; every directory
/// registered with ``keep(directory:)`` is removed; then the process exits with 128 + the signal
/// (130, 143, 129). Without it the default action ends the benchmark alone and leaves its stunnels, ssh,
/// sshd and `thali-node run` children running and its temporary directories behind.
///
/// One mechanism, by process id rather than by owner: the processes are found in `/proc` as the
/// benchmark's descendants, so a child started anywhere (a forwarder, a node, `ssh-keygen`) is covered
/// without being registered. The signal handler only records the signal and wakes a thread, which does
/// the work; the benchmark's own code calls ``finishIfInterrupted()`` where it would otherwise exit, so
/// that a child the signal already ended (Ctrl-C reaches the whole process group) makes the benchmark
/// finish the same way instead of failing with that child's error. Whoever finishes first holds the
/// gate that every start (a spawn, a directory made) takes, and never gives it back: nothing starts
/// after the clean-up has begun, and nothing started before it escapes it.
enum BenchInterruption {
    /// The signals that end a benchmark this way.
    static let signals: [Int32] = [SIGINT, SIGTERM, SIGHUP]
    /// How long the processes have between SIGTERM and SIGKILL (a node shuts down gracefully in less).
    static let grace: Duration = .seconds(2)
    /// How long after SIGKILL the clean-up waits for the processes to go before it exits anyway (a
    /// process in uninterruptible sleep can outlast any signal).
    static let killGrace: Duration = .seconds(2)
    /// How often the clean-up looks in `/proc` while it waits, in microseconds.
    static let pollMicroseconds: useconds_t = 10_000

    /// The first signal received (0 before): written by the signal handler.
    private static let received = Atomic<Int32>(0)
    /// The pipe the signal handler writes one byte to, waking the clean-up thread: (read, write).
    private static let wakeup: (read: Int32, write: Int32) = {
        var fds: [Int32] = [-1, -1]
        guard pipe(&fds) == 0 else { return (-1, -1) }
        for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        return (fds[0], fds[1])
    }()
    /// Held while a benchmark starts a process or makes a directory, and forever once the clean-up began.
    private static let gate = NSLock()
    /// The directories to remove, and whether ``install()`` ran.
    private static let state = Mutex<(directories: Set<String>, installed: Bool)>(([], false))

    /// Installs the handler for ``signals`` (once per process; later calls do nothing).
    static func install() {
        let first = state.withLock { state -> Bool in
            defer { state.installed = true }
            return !state.installed
        }
        guard first else { return }
        // Initialized before the handler can read them.
        _ = received.load(ordering: .relaxed)
        let wakeup = Self.wakeup
        guard wakeup.read >= 0 else { return }
        let thread = Thread {
            var byte: UInt8 = 0
            while read(wakeup.read, &byte, 1) < 0 && errno == EINTR {}
            finish(received.load(ordering: .acquiring))
        }
        thread.name = "bench interruption"
        thread.start()
        for number in signals {
            // Only async-signal-safe work here: an atomic exchange and a write to a pipe.
            signal(number) { number in
                _ = BenchInterruption.received.compareExchange(expected: 0, desired: number, ordering: .acquiringAndReleasing)
                var byte: UInt8 = 1
                _ = write(BenchInterruption.wakeup.write, &byte, 1)
            }
        }
    }

    /// Runs `body`, which starts a process or makes something to clean up, where the clean-up cannot
    /// interleave with it: a process spawned in `body` is visible in `/proc` before the clean-up looks.
    static func starting<Result>(_ body: () throws -> Result) rethrows -> Result {
        gate.lock()
        defer { gate.unlock() }
        return try body()
    }

    /// Registers `directory`, just made (in ``starting(_:)``), for removal on a signal; ``forget(directory:)``
    /// once it has been removed the ordinary way.
    static func keep(directory: String) {
        state.withLock { _ = $0.directories.insert(directory) }
    }

    /// `directory` has been removed, or is no longer this benchmark's to remove.
    static func forget(directory: String) {
        state.withLock { _ = $0.directories.remove(directory) }
    }

    /// Finishes the benchmark as a signal would (``finish(_:)``) if one has been received; returns otherwise.
    /// Called where the benchmark would exit, with its figures or with an error.
    static func finishIfInterrupted() {
        let number = received.load(ordering: .acquiring)
        if number != 0 { finish(number) }
    }

    /// Ends every descendant, removes the registered directories and exits with 128 + `number`. A second
    /// caller waits at the gate until the first exits the process.
    private static func finish(_ number: Int32) -> Never {
        gate.lock()
        endDescendants()
        for directory in state.withLock({ $0.directories }) { try? FileManager.default.removeItem(atPath: directory) }
        exit(128 + number)
    }

    /// Sends SIGTERM to every descendant (those found later too: a process that forks while it ends),
    /// SIGKILL to those left after ``grace``, reaps this process's children, and returns when none is left
    /// but zombies of other parents, or ``killGrace`` after SIGKILL.
    private static func endDescendants() {
        let me = getpid()
        let clock = ContinuousClock()
        let killAt = clock.now + grace
        let giveUpAt = killAt + killGrace
        // Every descendant ever seen, by id and start time: a process whose parent ended is no longer
        // found as a descendant, but is still ours to end.
        var known: [pid_t: UInt64] = [:]
        var terminated = Set<pid_t>()
        while true {
            var status: Int32 = 0
            while waitpid(-1, &status, WNOHANG) > 0 {}
            let table = ProcessTable()
            for pid in table.descendants(of: me) where known[pid] == nil {
                known[pid] = table.processes[pid]?.startTime
            }
            let alive = known.filter { pid, start in
                guard let entry = table.processes[pid], entry.startTime == start else { return false }
                // A zombie is ended; this process reaps its own (above), others' are their parents' or init's.
                return entry.state != "Z" || entry.parent == me
            }.map(\.key)
            if alive.isEmpty || clock.now >= giveUpAt { return }
            let killing = clock.now >= killAt
            for pid in alive where killing || !terminated.contains(pid) {
                kill(pid, killing ? SIGKILL : SIGTERM)
                terminated.insert(pid)
            }
            usleep(pollMicroseconds)
        }
    }

}
