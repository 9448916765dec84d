import ArgumentParser
import Foundation
import NIOConcurrencyHelpers
import ThaliNetLab
import ThaliProcess

#if canImport(Glibc)
import Glibc
#endif

/// `thali-node bench netlab --profile NAME [-- COMMAND...]`: the lab of issue 38 on its own (`scripts/netlab`
/// wraps it). Builds `--hosts` hosts on one segment shaped by the profile (``NetLab``), prints them, then
/// runs COMMAND inside host `--host` and exits with its status, or, without a command, holds the lab open
/// until a signal or `--seconds`. The lab is deleted on every way out (exit, SIGINT, SIGTERM, SIGHUP).
struct BenchNetLab: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "netlab",
        abstract: "Build a lab of hosts on a shaped link and run a command in one, or hold it open (root).",
        discussion: """
            Profiles: \(LinkProfile.named.map(\.name).joined(separator: ", ")). Hosts are network namespaces \
            tlab-<pid>-<n><letter> with eth0 at \(NetLab.subnet).1, .2, ...; run more commands in them with \
            `ip netns exec NAME ...` while the lab is held open. The wire's counters go to standard error at the end.
            """)

    @OptionGroup var link: LinkProfileOptions
    @Option(help: "Hosts on the segment (2...8).") var hosts = 2
    @Option(help: "The host (0-based) COMMAND runs in.") var host = 0
    @Option(help: "The longest the lab stays up (the command is killed then), in seconds.") var seconds = 600.0
    @Option(help: "Seed of the wire's random draws (default: random).") var seed: UInt64?
    @Argument(parsing: .postTerminator, help: "The command to run in the host (after --).") var command: [String] = []

    func validate() throws {
        guard NetLab.hostCounts.contains(hosts) else { throw ValidationError("--hosts must be in \(NetLab.hostCounts)") }
        guard (0..<hosts).contains(host) else { throw ValidationError("--host must be below --hosts") }
        guard seconds > 0, seconds <= 86_400 else { throw ValidationError("--seconds must be in (0, 86400]") }
    }

    func run() async throws {
        let linkProfile = try link.resolved()
        let lab = try NetLab(hostCount: hosts, profile: linkProfile, seed: seed ?? UInt64.random(in: 0...UInt64.max))
        let child = NIOLockedValueBox<ChildProcess?>(nil)
        let guardian = NetLabSignalGuard {
            _ = child.withLockedValue { $0 }?.terminate()
            lab.close()
        }
        defer {
            guardian.cancel()
            lab.close()
        }
        for (index, labHost) in lab.hosts.enumerated() {
            NetLabLog.write("netlab: host \(index) \(labHost.namespace) \(labHost.address) (\(labHost.interface)), profile \(linkProfile.name)\n")
        }
        var status: Int32 = 0
        if command.isEmpty {
            NetLabLog.write("netlab: holding the lab open for \(seconds) s (Ctrl-C ends it)\n")
            let deadline = ContinuousClock.now + .milliseconds(Int64(seconds * 1000))
            while ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(200)) }
        } else {
            // Its output (standard error with it) is copied line by line; it starts with default signal
            // dispositions (ChildProcess), not the ignored ones of our guard.
            let arguments = lab.command(inHost: host, command)
            let process = try ChildProcess(arguments[0], Array(arguments.dropFirst())) { line in print(line) }
            child.withLockedValue { $0 = process }
            process.closeInput()
            do {
                status = try await process.waitForExit(timeout: .milliseconds(Int64(seconds * 1000)))
            } catch {
                NetLabLog.write("netlab: the command ran past --seconds; stopping it\n")
                status = process.terminate()
            }
        }
        let counters = lab.counters
        let drops = LinkDrop.allCases.compactMap { reason in counters.dropped[reason].map { "\(reason.rawValue) \($0)" } }
        NetLabLog.write(("netlab: wire offered \(counters.offered) frames, passed \(counters.passed), dropped "
            + (drops.isEmpty ? "none" : drops.joined(separator: ", ")) + ", outages \(lab.outages)"
            + ", address changes \(lab.addressChanges.count)\n"))
        if status != 0 { throw ExitCode(status) }
    }
}

/// The lab's notices on standard error. A closed or broken standard error (the reader went away) loses
/// the notice instead of ending the process: the lab must still be taken down.
private enum NetLabLog {
    static func write(_ text: String) {
        // Cannot end the process: `write(contentsOf:)` is the throwing form, and `thali-node` ignores SIGPIPE
        // (ThaliNode.main), so a closed standard error is an error thrown here and dropped, not a signal.
        try? FileHandle.standardError.write(contentsOf: Data(text.utf8))
    }
}
