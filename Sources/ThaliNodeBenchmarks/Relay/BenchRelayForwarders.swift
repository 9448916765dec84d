import ArgumentParser
import Foundation
import ThaliProcess

#if canImport(Glibc)
import Glibc
#endif

/// A forwarder of `bench relay --peers`: the processes that carry an app's TCP from a local loopback port
/// to the app's port, as a user would run them instead of the relay.
protocol RelayBenchForwarder: AnyObject {
    /// The path's name in the figures (`stunnel`, `ssh`, `relay`).
    var name: String { get }
    /// The loopback port an app connects to.
    var port: Int { get }
    /// The forwarding processes whose CPU is counted, each with its descendants.
    var pids: [pid_t] { get }
    /// Ends every process and removes every file the forwarder made.
    func stop()
}

/// Why a peer forwarder cannot run on this machine: its program is not installed.
struct RelayBenchPeerAbsent: Error, CustomStringConvertible {
    let description: String
}

/// The user and system CPU seconds of processes and their descendants, from `/proc/<pid>/stat`
/// (`utime`, `stime`, and `cutime`, `cstime` for the children they reaped).
enum ProcessCPU {
    /// The CPU seconds used so far by `roots` and all their live descendants.
    static func seconds(of roots: [pid_t]) -> Double {
        let table = ProcessTable()
        let ticks = table.tree(of: roots).reduce(UInt64(0)) { total, pid in
            guard let stat = table.processes[pid] else { return total }
            return total &+ stat.ownTicks &+ stat.reapedChildrenTicks
        }
        return Double(ticks) / ProcessStat.ticksPerSecond
    }

    /// `roots` and their live descendants.
    static func tree(of roots: [pid_t]) -> [pid_t] { ProcessTable().tree(of: roots) }
}

/// A private directory (mode 0700) under the temporary directory for a forwarder's generated files.
final class RelayBenchScratch {
    let path: String

    init(label: String) throws {
        var template = Array((FileManager.default.temporaryDirectory.path + "/thali-bench-\(label)-XXXXXX").utf8CString)
        path = try BenchInterruption.starting {
            guard let made = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
                throw ValidationError("mkdtemp failed: \(String(cString: strerror(errno)))")
            }
            let path = String(cString: made)
            BenchInterruption.keep(directory: path)
            return path
        }
    }

    /// Writes `text` to `name` in the directory, readable by the owner only.
    @discardableResult
    func write(_ name: String, _ text: String) throws -> String {
        let file = "\(path)/\(name)"
        guard FileManager.default.createFile(atPath: file, contents: Data(text.utf8), attributes: [.posixPermissions: 0o600]) else {
            throw ValidationError("could not write \(file)")
        }
        return file
    }

    /// The last lines of a log in the directory, for an error message.
    func tail(_ name: String) -> String {
        let text = (try? String(contentsOfFile: "\(path)/\(name)", encoding: .utf8)) ?? ""
        return text.split(separator: "\n").suffix(5).joined(separator: " | ")
    }

    func remove() {
        try? FileManager.default.removeItem(atPath: path)
        BenchInterruption.forget(directory: path)
    }
}

extension RelayBenchApp {
    /// A loopback port free now (bound and released), for a forwarder to listen on.
    static func freePort() throws -> Int {
        let probe = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard probe >= 0 else { throw failure("socket") }
        defer { Glibc.close(probe) }
        var address = loopback(port: 0)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(probe, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0 else { throw failure("bind") }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(probe, $0, &length) }
        }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    /// Waits until `port` accepts a connection (closed at once), every 20 ms for up to `timeout` seconds;
    /// throws when `process` exits first or the time runs out, with `log()` in the message.
    static func waitForListening(port: Int, process: ChildProcess, what: String, timeout: Double,
                                 log: () -> String) throws {
        let deadline = ContinuousClock.now + .milliseconds(Int64(timeout * 1000))
        while true {
            if let connection = try? connect(port: port) {
                Glibc.close(connection)
                return
            }
            if let status = process.exitStatus {
                throw ValidationError("\(what) exited with status \(status) before listening on 127.0.0.1:\(port): \(log())")
            }
            guard ContinuousClock.now < deadline else {
                throw ValidationError("\(what) did not listen on 127.0.0.1:\(port) within \(timeout) s: \(log())")
            }
            usleep(20_000)
        }
    }
}

/// stunnel (Debian's stunnel4) in the relay's shape: a client stunnel on a loopback port, TLS 1.2 with a
/// pre-shared key (``cipher``, the relay's suite) to a server stunnel, which connects to the app. Two
/// processes with generated configurations and a generated PSK file in a private directory.
final class StunnelForwarder: RelayBenchForwarder {
    /// The one cipher suite both stunnels allow.
    static let cipher = "DHE-PSK-AES256-GCM-SHA384"
    /// The programs looked for, in order.
    static let programs = ["stunnel4", "stunnel"]

    let name = "stunnel"
    let port: Int
    private let scratch: RelayBenchScratch
    private var processes: [ChildProcess]

    var pids: [pid_t] { processes.map(\.pid) }

    init(appPort: Int, timeout: Double) throws {
        guard let program = Self.programs.lazy.compactMap(ChildProcess.which).first else {
            throw RelayBenchPeerAbsent(description: "stunnel is not installed (Debian package stunnel4)")
        }
        let scratch = try RelayBenchScratch(label: "stunnel")
        var processes: [ChildProcess] = []
        do {
            var secret = [UInt8](repeating: 0, count: 32)
            guard getentropy(&secret, secret.count) == 0 else { throw ValidationError("getentropy failed") }
            let psk = try scratch.write("psk.txt", "thali-bench:" + secret.map { String(format: "%02x", $0) }.joined() + "\n")
            let serverPort = try RelayBenchApp.freePort()
            let port = try RelayBenchApp.freePort()
            func configuration(client: Bool, accept: Int, connect: Int) -> String {
                """
                foreground = yes
                pid =
                syslog = no
                debug = 3
                [relay]
                \(client ? "client = yes\n" : "")accept = 127.0.0.1:\(accept)
                connect = 127.0.0.1:\(connect)
                ciphers = \(Self.cipher)
                sslVersionMin = TLSv1.2
                sslVersionMax = TLSv1.2
                PSKsecrets = \(psk)

                """
            }
            for (role, accept, connect) in [("server", serverPort, appPort), ("client", port, serverPort)] {
                let file = try scratch.write("\(role).conf", configuration(client: role == "client", accept: accept, connect: connect))
                let process = try BenchInterruption.starting {
                    try ChildProcess(program, [file], standardErrorPath: "\(scratch.path)/\(role).log")
                }
                processes.append(process)
                try RelayBenchApp.waitForListening(port: accept, process: process, what: "stunnel \(role)", timeout: timeout) {
                    scratch.tail("\(role).log")
                }
            }
            (self.scratch, self.processes, self.port) = (scratch, processes, port)
        } catch {
            for process in processes.reversed() { process.terminate() }
            scratch.remove()
            throw error
        }
    }

    func stop() {
        for process in processes.reversed() { process.terminate() }
        processes = []
        scratch.remove()
    }
}

/// `ssh -L` to a private `sshd` on loopback: host and user keys generated in a private directory, an
/// `authorized_keys` there for the current user, the host key pinned (`StrictHostKeyChecking yes`), one
/// connection with ``cipher`` carrying every forwarded connection as a channel.
final class SSHForwarder: RelayBenchForwarder {
    /// The one cipher both ends allow.
    static let cipher = "aes256-gcm@openssh.com"
    /// Where Debian's sshd is, when `PATH` lacks `/usr/sbin`.
    static let sshdPaths = ["sshd", "/usr/sbin/sshd"]
    /// The directory sshd running as root needs for privilege separation (Debian's service makes it).
    static let privilegeSeparationDirectory = "/run/sshd"

    let name = "ssh"
    let port: Int
    private let scratch: RelayBenchScratch
    private var sshd: ChildProcess?
    private var ssh: ChildProcess?
    private var sessionPids: [pid_t]

    var pids: [pid_t] { [ssh?.pid, sshd?.pid].compactMap { $0 } }

    init(appPort: Int, timeout: Double) throws {
        guard let sshdPath = Self.sshdPaths.lazy.compactMap(ChildProcess.which).first else {
            throw RelayBenchPeerAbsent(description: "sshd is not installed (Debian package openssh-server)")
        }
        guard ChildProcess.which("ssh") != nil, ChildProcess.which("ssh-keygen") != nil else {
            throw RelayBenchPeerAbsent(description: "ssh is not installed (Debian package openssh-client)")
        }
        guard let user = getpwuid(geteuid()).map({ String(cString: $0.pointee.pw_name) }) else {
            throw ValidationError("the current user has no name")
        }
        let scratch = try RelayBenchScratch(label: "ssh")
        var started: [ChildProcess] = []
        do {
            let directory = scratch.path
            for key in ["host", "user"] {
                let made = try BenchInterruption.starting {
                    try ChildProcess.run("ssh-keygen", ["-q", "-t", "ed25519", "-N", "", "-C", "thali-bench-\(key)",
                                                        "-f", "\(directory)/\(key)"])
                }
                guard made.status == 0 else { throw ValidationError("ssh-keygen failed: \(made.output)") }
            }
            let userKey = try String(contentsOfFile: "\(directory)/user.pub", encoding: .utf8)
            let hostKey = try String(contentsOfFile: "\(directory)/host.pub", encoding: .utf8)
            try scratch.write("authorized_keys", userKey)
            let sshdPort = try RelayBenchApp.freePort()
            try scratch.write("known_hosts", "[127.0.0.1]:\(sshdPort) \(hostKey)")
            let configuration = try scratch.write("sshd_config", """
                Port \(sshdPort)
                ListenAddress 127.0.0.1
                HostKey \(directory)/host
                AuthorizedKeysFile \(directory)/authorized_keys
                PidFile none
                StrictModes no
                UsePAM no
                PasswordAuthentication no
                KbdInteractiveAuthentication no
                PubkeyAuthentication yes
                PermitRootLogin prohibit-password
                AllowTcpForwarding local
                Ciphers \(Self.cipher)
                LogLevel ERROR

                """)
            if geteuid() == 0, !FileManager.default.fileExists(atPath: Self.privilegeSeparationDirectory) {
                try FileManager.default.createDirectory(atPath: Self.privilegeSeparationDirectory, withIntermediateDirectories: true,
                                                        attributes: [.posixPermissions: 0o755])
            }
            let sshd = try BenchInterruption.starting {
                try ChildProcess(sshdPath, ["-D", "-e", "-f", configuration], standardErrorPath: "\(directory)/sshd.log")
            }
            started.append(sshd)
            try RelayBenchApp.waitForListening(port: sshdPort, process: sshd, what: "sshd", timeout: timeout) { scratch.tail("sshd.log") }
            let port = try RelayBenchApp.freePort()
            let ssh = try BenchInterruption.starting { try ChildProcess("ssh", [
                "-F", "/dev/null", "-N", "-i", "\(directory)/user", "-p", String(sshdPort),
                "-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=\(directory)/known_hosts",
                "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "ExitOnForwardFailure=yes",
                "-o", "Compression=no", "-o", "ControlMaster=no", "-o", "ControlPath=none",
                "-c", Self.cipher, "-L", "127.0.0.1:\(port):127.0.0.1:\(appPort)", "\(user)@127.0.0.1",
            ], standardErrorPath: "\(directory)/ssh.log") }
            started.append(ssh)
            try RelayBenchApp.waitForListening(port: port, process: ssh, what: "ssh -L", timeout: timeout) {
                scratch.tail("ssh.log") + " " + scratch.tail("sshd.log")
            }
            // The connection's own sshd processes, to end them even if they outlive their parent.
            let sessionPids = ProcessCPU.tree(of: [sshd.pid]).filter { $0 != sshd.pid }
            (self.scratch, self.sshd, self.ssh, self.sessionPids, self.port) = (scratch, sshd, ssh, sessionPids, port)
        } catch {
            for process in started.reversed() { process.terminate() }
            scratch.remove()
            throw error
        }
    }

    func stop() {
        ssh?.terminate()
        sshd?.terminate()
        for pid in sessionPids where Self.isSSHD(pid) { kill(pid, SIGKILL) }
        (ssh, sshd, sessionPids) = (nil, nil, [])
        scratch.remove()
    }

    private static func isSSHD(_ pid: pid_t) -> Bool {
        guard let data = FileManager.default.contents(atPath: "/proc/\(pid)/comm") else { return false }
        return String(decoding: data, as: UTF8.self).hasPrefix("sshd")
    }
}
