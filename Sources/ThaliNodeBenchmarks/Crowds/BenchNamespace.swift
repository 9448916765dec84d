import Foundation

/// Runs a benchmark inside a network namespace of its own, so that it can give every simulated host an
/// address of its own (127.0.1.x on the namespace's loopback) without touching the machine's network:
/// per-source limits then see distinct sources, as on a real segment. Needs root and `ip` (iproute2).
enum BenchNamespace {
    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    /// The hidden flag a re-executed benchmark gets, telling it that it already runs inside.
    static let insideFlag = "--inside-namespace"
    /// The environment variable naming the directory the benchmark inside keeps its files in. The
    /// process outside makes it and removes it after the child ends, however the child ends: a child
    /// stopped by a signal runs none of its own clean-up.
    static let scratchVariable = "THALI_BENCH_SCRATCH"

    /// Where a benchmark keeps its nodes' files: `label` inside the scratch directory of the process
    /// that made the namespace, or in the temporary directory when run outside one.
    static func scratchPath(_ label: String) -> String {
        if let scratch = ProcessInfo.processInfo.environment[scratchVariable], !scratch.isEmpty { return scratch + "/" + label }
        return FileManager.default.temporaryDirectory.appendingPathComponent(label).path
    }

    /// The `index`-th host address (0-based): 127.0.1.1 ... 127.0.1.250, then 127.0.2.1 ...
    static func address(_ index: Int) -> String {
        "127.0.\(1 + index / 250).\(1 + index % 250)"
    }

    /// Creates a namespace with loopback up and `addressCount` host addresses, re-runs this executable
    /// there with `arguments` plus ``insideFlag`` (its output goes to ours), deletes the namespace, and
    /// returns the child's exit status.
    static func run(addressCount: Int, arguments: [String]) throws -> Int32 {
        guard geteuid() == 0 else { throw Failure(description: "this benchmark needs root (it creates a network namespace)") }
        guard let ip = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"].first(where: FileManager.default.isExecutableFile)
        else { throw Failure(description: "this benchmark needs ip (iproute2)") }
        let name = "thali-bench-\(getpid())"
        _ = try? tool(ip, ["netns", "del", name])  // a leftover of a crashed run with the same pid
        try tool(ip, ["netns", "add", name])
        defer { _ = try? tool(ip, ["netns", "del", name]) }
        let batch = FileManager.default.temporaryDirectory.appendingPathComponent("\(name).ip").path
        defer { try? FileManager.default.removeItem(atPath: batch) }
        let commands = ["link set lo up"] + (0..<addressCount).map { "addr add \(address($0))/8 dev lo" }
        try (commands.joined(separator: "\n") + "\n").write(toFile: batch, atomically: true, encoding: .utf8)
        try tool(ip, ["-n", name, "-batch", batch])
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("\(name).files").path
        try FileManager.default.createDirectory(atPath: scratch, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let child = Process()
        child.executableURL = URL(fileURLWithPath: ip)
        child.arguments = ["netns", "exec", name, CommandLine.arguments[0]] + arguments + [insideFlag]
        child.environment = ProcessInfo.processInfo.environment.merging([scratchVariable: scratch]) { $1 }
        // The child's standard input is a pipe only we write to: it reads end of file when we end,
        // however we end (see ``runningInside()``).
        let lifeline = Pipe()
        child.standardInput = lifeline
        try child.run()
        // A signal to us (a test's timeout, Ctrl-C) ends the child first, so that the namespace is
        // deleted below and nothing is left running in it. Ignored only now: the child would inherit it.
        let forwarded = [SIGTERM, SIGINT].map { number -> DispatchSourceSignal in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { kill(child.processIdentifier, SIGTERM) }
            source.resume()
            return source
        }
        defer { forwarded.forEach { $0.cancel() } }
        child.waitUntilExit()
        try? lifeline.fileHandleForWriting.close()
        return child.terminationStatus
    }

    /// Called first inside the namespace: we end when the process that made us ends, however it ends
    /// (killed outright, it cannot stop us itself): its end closes our standard input.
    static func runningInside() {
        let watcher = Thread {
            var byte: UInt8 = 0
            while true {
                let count = read(STDIN_FILENO, &byte, 1)
                if count == 0 || (count < 0 && errno != EINTR) { exit(1) }
            }
        }
        watcher.name = "bench: end with the parent"
        watcher.start()
    }

    @discardableResult
    private static func tool(_ path: String, _ arguments: [String]) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = arguments
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        let text = String(decoding: data, as: UTF8.self)
        guard process.terminationStatus == 0 else {
            throw Failure(description: "\(path) \(arguments.joined(separator: " ")) failed: \(text)")
        }
        return text
    }

    /// Raises the open-file limit to its hard maximum (a crowd in one process holds thousands of sockets
    /// and database files).
    static func raiseOpenFileLimit() {
        var limit = rlimit()
        guard getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return }
        limit.rlim_cur = limit.rlim_max
        _ = setrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
    }

    /// User + system CPU seconds of this process so far, and its peak resident set in MiB.
    static func usage() -> (cpuSeconds: Double, peakRSSMiB: Double) {
        var usage = rusage()
        getrusage(__rusage_who_t(RUSAGE_SELF.rawValue), &usage)
        let cpu = Double(usage.ru_utime.tv_sec) + Double(usage.ru_utime.tv_usec) / 1e6
            + Double(usage.ru_stime.tv_sec) + Double(usage.ru_stime.tv_usec) / 1e6
        return (cpu, Double(usage.ru_maxrss) / 1024)
    }
}
