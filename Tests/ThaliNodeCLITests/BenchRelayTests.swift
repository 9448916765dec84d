import Foundation
import Testing
import ThaliProcess
import ThaliTestSupport

#if canImport(Glibc)
import Glibc
#endif

/// `thali-node bench relay --json` as scripts read it (issue 25): a tiny run through two real relaying
/// nodes; the figures are printed, never asserted, but every byte is checked against the pattern.
@Suite("thali-node bench relay", .serialized)
struct BenchRelayTests {
    @Test("--json prints the relay and direct figures, and every byte of both paths was checked")
    func jsonFigures() async throws {
        let object = try await thaliNodeJSONObject(["bench", "relay", "--json", "--mib", "1", "--parallel", "2",
                                                    "--parallel-mib", "1", "--requests", "5"])
        #expect(Set(object.keys) == ["relay_mb_s", "direct_mb_s", "parallel_ratio", "added_latency_ms", "relay_parallel_mb_s",
                                     "direct_parallel_mb_s", "relay_latency_ms", "direct_latency_ms", "verified_bytes",
                                     "mib", "parallel", "parallel_mib", "requests"])
        for key in ["relay_mb_s", "direct_mb_s", "relay_parallel_mb_s", "direct_parallel_mb_s", "relay_latency_ms", "direct_latency_ms"] {
            #expect((object[key] as? Double ?? 0) > 0, "\(key): \(object[key] ?? "absent")")
        }
        // Per path: one 1 MiB stream, two of 1 MiB, and 5 + 1 (warm-up) responses of 64 bytes.
        let perPath = (1 << 20) + 2 * (1 << 20) + 64 * 6
        #expect(object["verified_bytes"] as? Int == 2 * perPath)
    }

    /// The files and processes `--peers` makes: its private directories are named after these.
    static let peerScratchPrefixes = ["thali-bench-stunnel-", "thali-bench-ssh-"]

    @Test("--peers --json measures direct, stunnel, ssh -L and the relay alike: every byte checked, figures consistent, nothing left behind")
    func peersFigures() async throws {
        let temporary = FileManager.default.temporaryDirectory.path
        func leftovers() -> Set<String> {
            let files = (try? FileManager.default.contentsOfDirectory(atPath: temporary)) ?? []
            let processes = ((try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []).compactMap { pid -> String? in
                guard Int(pid) != nil, let data = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline") else { return nil }
                return "process \(pid): " + String(decoding: data.map { $0 == 0 ? 32 : $0 }, as: UTF8.self)
            }
            return Set((files + processes).filter { entry in Self.peerScratchPrefixes.contains { entry.contains($0) } })
        }
        let before = leftovers()
        let gets = 20
        let object = try await thaliNodeJSONObject(["bench", "relay", "--peers", "--json", "--mib", "1", "--parallel", "2",
                                                    "--parallel-mib", "1", "--requests", "20", "--gets", String(gets)])
        #expect(leftovers().subtracting(before).isEmpty, "\(leftovers().subtracting(before))")
        #expect(object["gets"] as? Int == gets)
        let paths = try #require(object["paths"] as? [String: [String: Any]])
        #expect(Set(paths.keys) == ["direct", "stunnel", "ssh", "relay"])
        let direct = try #require(paths["direct"])
        let ratios = try #require(object["ratios"] as? [String: Any])
        #expect(Set(ratios.keys) == ["relay_vs_stunnel", "relay_vs_ssh"])
        // Per path: one 1 MiB stream, two of 1 MiB, 20 + 2 (warm-up) responses of 64 bytes, and the documents.
        let patternBytes = 3 * (1 << 20) + 64 * 22
        for (name, path) in paths {
            guard path["present"] as? Bool == true else {
                #expect(["stunnel", "ssh"].contains(name) && !TestEnvironment.peersRequired,
                        "\(name) is absent: \(path["absent_reason"] ?? "no reason")")
                #expect(path["absent_reason"] is String)
                #expect(ratios["relay_vs_\(name)"] is NSNull)
                continue
            }
            for key in ["single_mb_s", "parallel_mb_s", "round_trip_median_ms", "round_trip_p99_ms", "gets_s"] {
                #expect((path[key] as? Double ?? 0) > 0, "\(name) \(key): \(path[key] ?? "absent")")
            }
            let median = try #require(path["round_trip_median_ms"] as? Double)
            let p99 = try #require(path["round_trip_p99_ms"] as? Double)
            #expect(p99 >= median, "\(name)")
            for (key, figure) in [("added_round_trip_median_ms", median), ("added_round_trip_p99_ms", p99)] {
                let base = direct[key == "added_round_trip_median_ms" ? "round_trip_median_ms" : "round_trip_p99_ms"] as? Double ?? .nan
                let added = path[key] as? Double ?? .nan
                #expect(abs(added - (figure - base)) <= 0.00021, "\(name) \(key): \(added) against \(figure) - \(base)")
            }
            let verified = path["verified_bytes"] as? Int ?? 0
            #expect(verified > patternBytes + gets * 60, "\(name): \(verified)")
            #expect(verified == direct["verified_bytes"] as? Int, "\(name): every path carries the same bytes")
            let cpuKeys = ["cpu_s_per_gb", "cpu_ms_per_1000_round_trips", "cpu_ms_per_1000_gets"]
            if name == "direct" {
                #expect(path["processes"] as? Int == 0)
                for key in cpuKeys { #expect(path[key] is NSNull, "direct \(key)") }
            } else {
                #expect(path["processes"] as? Int == 2, "\(name): two forwarding processes")
                for key in cpuKeys { #expect((path[key] as? Double ?? -1) >= 0, "\(name) \(key): \(path[key] ?? "absent")") }
            }
        }
        let relay = try #require(paths["relay"])
        #expect(relay["present"] as? Bool == true)
        for peer in ["stunnel", "ssh"] {
            guard let other = paths[peer], other["present"] as? Bool == true else { continue }
            let ratio = try #require(ratios["relay_vs_\(peer)"] as? [String: Any])
            #expect(ratio.count == 10)
            for (key, value) in ratio {
                let mine = try #require(relay[key] as? Double, "\(key)")
                let theirs = try #require(other[key] as? Double, "\(key)")
                if theirs > 0 {
                    let reported = try #require(value as? Double, "relay_vs_\(peer) \(key)")
                    #expect(abs(reported - mine / theirs) <= 0.00051, "relay_vs_\(peer) \(key): \(reported) against \(mine) / \(theirs)")
                } else {
                    #expect(value is NSNull, "relay_vs_\(peer) \(key)")
                }
            }
        }
    }

    /// Whether the programs `--peers` runs are installed (stunnel, ssh, sshd, ssh-keygen).
    static var peersInstalled: Bool {
        (ChildProcess.which("stunnel4") ?? ChildProcess.which("stunnel")) != nil && ChildProcess.which("ssh") != nil
            && ChildProcess.which("ssh-keygen") != nil && (ChildProcess.which("sshd") ?? ChildProcess.which("/usr/sbin/sshd")) != nil
    }

    /// A signal sent to `bench relay --peers` while one of its forwarders runs.
    struct Interruption: Sendable, CustomTestStringConvertible {
        /// The forwarder running when the signal is sent: `stunnel`, `ssh` (with sshd's session processes) or `relay`.
        var stage: String
        var signal: Int32
        var testDescription: String { "\(stage), signal \(signal)" }
    }

    @Test("a signal while a forwarder runs ends every process --peers started, removes its directories, and exits with 128 + the signal",
          .enabled(if: TestEnvironment.available(peersInstalled)),
          arguments: [Interruption(stage: "stunnel", signal: SIGINT), Interruption(stage: "ssh", signal: SIGTERM),
                      Interruption(stage: "relay", signal: SIGHUP)])
    func signalEndsEverything(_ interruption: Interruption) async throws {
        // The bench's temporary directory is the test's own: what is left in it afterwards is the bench's.
        var template = Array((FileManager.default.temporaryDirectory.path + "/thali-bench-signal-XXXXXX").utf8CString)
        let made = try #require(template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) })
        let temporary = String(cString: made)
        defer { try? FileManager.default.removeItem(atPath: temporary) }
        // Enough bytes that each path lasts seconds (a debug build moves tens to hundreds of MB/s), far beyond
        // the 20 ms between looks; the signal ends the run long before its end.
        let bench = try ChildProcess(CommandLineTests.executable, ["bench", "relay", "--peers", "--json", "--mib", "128",
                                                                   "--parallel", "2", "--parallel-mib", "64", "--requests", "2000",
                                                                   "--gets", "200"],
                                     environment: ["TMPDIR": temporary])
        defer { bench.terminate(signal: SIGKILL) }
        // Every process the bench started (its descendants), recorded whenever the test looks.
        var started: [pid_t: ProcessRecord] = [:]
        // What a failing run left behind is the test's to end.
        defer { for (pid, record) in started where record.isRunning(pid: pid) { kill(pid, SIGKILL) } }
        func look() -> [pid_t: ProcessRecord] {
            let tree = ProcessRecord.descendants(of: bench.pid)
            started.merge(tree) { old, _ in old }
            return tree
        }
        let reached = try await waitUntil(timeout: .seconds(120)) {
            let tree = look()
            let names = tree.values.map(\.name)
            switch interruption.stage {
            case "stunnel": return names.filter { $0.hasPrefix("stunnel") }.count == 2
            case "ssh":
                // ssh -L connected: sshd has a session process of its own.
                return names.contains("ssh") && tree.values.contains { $0.name.hasPrefix("sshd") && tree[$0.parent]?.name.hasPrefix("sshd") == true }
            default: return names.filter { $0 == "thali-node" }.count == 2
            }
        }
        try #require(reached, "the bench did not reach \(interruption.stage): \(started.values.map(\.name)) \(bench.output)")
        kill(bench.pid, interruption.signal)
        let exited = try await waitUntil(timeout: .seconds(30)) {
            _ = look()
            return bench.exitStatus != nil
        }
        try #require(exited, "the bench did not exit after signal \(interruption.signal)")
        #expect(bench.exitStatus == 128 + interruption.signal, "\(bench.output)")
        // Ended before the bench exited: none is still running (a zombie of another parent is reaped by it or by init).
        let running = started.filter { $0.value.isRunning(pid: $0.key) }
        #expect(running.isEmpty, "still running after the bench exited: \(running.values.map(\.command))")
        #expect(try await waitUntil(timeout: .seconds(10)) { !started.contains { $0.value.exists(pid: $0.key) } },
                "not reaped: \(started.filter { $0.value.exists(pid: $0.key) }.values.map(\.command))")
        // The forwarders' directories were the bench's, under its temporary directory, and are gone with it.
        let directories = Set(started.values.compactMap(\.directory))
        #expect(!directories.isEmpty, "\(started.values.map(\.command))")
        for directory in directories { #expect(directory.hasPrefix(temporary + "/"), "\(directory)") }
        let left = try FileManager.default.contentsOfDirectory(atPath: temporary)
        #expect(left.isEmpty, "left in the bench's temporary directory: \(left)")
    }
}

/// A process as the signal test records it from `/proc`: its parent, name, command line and start time
/// (which, with its id, names it even if the id is used again).
struct ProcessRecord {
    var parent: pid_t
    var name: String
    var command: [String]
    var start: UInt64

    /// The directory of the files a forwarder was started with: stunnel's configuration, sshd's `-f`, a node's `--home`.
    var directory: String? {
        let file: String?
        if name.hasPrefix("stunnel") {
            file = command.dropFirst().first
        } else if let flag = command.firstIndex(where: { $0 == "-f" || $0 == "--home" }), flag + 1 < command.count {
            file = command[flag + 1]
        } else {
            file = nil
        }
        return file.map { ($0 as NSString).deletingLastPathComponent }
    }

    /// Process `pid` as `/proc` shows it now: its record (with the command line) and its state.
    static func read(_ pid: pid_t) -> (record: ProcessRecord, state: Character)? {
        guard let stat = ProcessStat.read(pid) else { return nil }
        return (record(pid, stat), stat.state)
    }

    private static func record(_ pid: pid_t, _ stat: ProcessStat) -> ProcessRecord {
        let arguments = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline") ?? Data()
        let command = arguments.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
        return ProcessRecord(parent: stat.parent, name: stat.name, command: command, start: stat.startTime)
    }

    /// The live descendants of `root`, by id.
    static func descendants(of root: pid_t) -> [pid_t: ProcessRecord] {
        let table = ProcessTable()
        var found: [pid_t: ProcessRecord] = [:]
        for pid in table.descendants(of: root) {
            if let stat = table.processes[pid] { found[pid] = record(pid, stat) }
        }
        return found
    }

    /// Whether this process (`pid` with this start time) exists, even as a zombie.
    func exists(pid: pid_t) -> Bool { Self.read(pid)?.record.start == start }

    /// Whether this process is still running (exists and is no zombie).
    func isRunning(pid: pid_t) -> Bool {
        guard let now = Self.read(pid), now.record.start == start else { return false }
        return now.state != "Z"
    }
}
