#if canImport(Glibc)
import Glibc
#endif

/// A child `thali-node run` of the demo and the benchmarks, named for what it prints: a ``ChildProcess``
/// whose output lines go to `onLine` and whose standard error goes to `stderrPath`, with no input.
/// `terminate()` stops it (SIGTERM, then SIGKILL after a grace period) and reaps it; so does dropping
/// it, so no exit path leaves it running. Package-wide: the CLI's demo and ThaliNodeBenchmarks spawn peers.
package final class SpawnedPeer: Sendable {
    package let name: String
    private let process: ChildProcess

    package init(name: String, executable: String, arguments: [String], stderrPath: String,
                 onLine: @escaping @Sendable (String) -> Void) throws {
        self.name = name
        process = try ChildProcess(executable, arguments, standardErrorPath: stderrPath, onOutputLine: onLine)
        process.closeInput()
    }

    /// The child's process id.
    package var pid: pid_t { process.pid }

    /// Whether the child has exited (reaps it if so).
    package var hasExited: Bool { !process.isRunning }

    /// SIGTERM, up to `grace` seconds for a clean exit, then SIGKILL; reaps. Returns the exit code
    /// (128 + signal when killed by one).
    @discardableResult
    package func terminate(grace: Double = 5) -> Int32 {
        process.terminate(grace: .milliseconds(Int64(grace * 1000)))
    }
}
