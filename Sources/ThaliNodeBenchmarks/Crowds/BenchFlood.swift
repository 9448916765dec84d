import ArgumentParser
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import ThaliBeacons
import ThaliNodeCore
import ThaliProcess
import ThaliPSKTLS
import ThaliSSDP
#if canImport(Glibc)
import Glibc
#endif

/// `thali-node bench flood`: a victim peer and an honest contact (two `thali-node run` processes, each on
/// its own address) deliver an item each way while one attacker on the same segment attacks the victim.
/// Per attack: how long the honest delivery took, the victim's CPU, and how long its discovery was off.
struct BenchFlood: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "flood",
        abstract: "Attack a peer from one host and measure whether an honest contact still delivers (root: it creates a network namespace).")

    static let attacks = ["datagram_flood", "usn_flood", "closed_ports", "connection_flood", "tls_handshakes"]

    @Option(help: ArgumentHelp("Attacks to run, comma-separated (default: all): \(attacks.joined(separator: ", ")).", valueName: "list"))
    var attacks: String = BenchFlood.attacks.joined(separator: ",")
    @Option(help: "Seconds each attack lasts at least (the victim's CPU is measured over it); the honest items are queued 3 s into it and may take up to 60 s.")
    var seconds = 15.0
    @Option(help: ArgumentHelp("thali-node executable for the victim and the honest peer (default: this one); an older build gives the before figures.", valueName: "path"))
    var node: String?
    @Flag(help: "Print one JSON object: one key per attack, each {honest_delivery_s, victim_cpu_s, discovery_off_s, attacker_actions}.")
    var json = false
    @Flag(name: .customLong(String(BenchNamespace.insideFlag.dropFirst(2))), help: .hidden) var insideNamespace = false

    func validate() throws {
        let unknown = attacks.split(separator: ",").map(String.init).filter { !Self.attacks.contains($0) }
        guard unknown.isEmpty else { throw ValidationError("unknown attack(s): \(unknown.joined(separator: ", "))") }
        guard seconds > 0 else { throw ValidationError("--seconds must be positive") }
    }

    /// Seconds the attack runs before the honest items are queued.
    static let attackLead = 3.0
    static let victimAddress = BenchNamespace.address(1)
    static let honestAddress = BenchNamespace.address(2)
    static let attackerAddresses = (10..<14).map(BenchNamespace.address)

    func run() async throws {
        guard insideNamespace else {
            var arguments = ["bench", "flood", "--attacks", attacks, "--seconds", "\(seconds)"]
            if let node { arguments += ["--node", node] }
            if json { arguments.append("--json") }
            let status = try BenchNamespace.run(addressCount: 16, arguments: arguments)
            if status != 0 { throw ExitCode(status) }
            return
        }
        BenchNamespace.runningInside()
        var results: [String: Any] = [:]
        for attack in attacks.split(separator: ",").map(String.init) {
            let result = try await measure(attack)
            results[attack] = [
                "honest_delivery_s": result.delivery.map { ($0 * 100).rounded() / 100 } as Any? ?? NSNull(),
                "victim_cpu_s": (result.victimCPU * 100).rounded() / 100,
                "discovery_off_s": result.discoveryOff,
                "attacker_actions": result.attackerActions,
            ]
            if !json {
                print(String(format: "%-17@ honest delivery %@, victim CPU %.2f s, discovery off %.0f s", attack as NSString,
                             (result.delivery.map { String(format: "%.2f s", $0) } ?? "none within 60 s") as NSString,
                             result.victimCPU, result.discoveryOff))
            }
        }
        if json {
            let data = try JSONSerialization.data(withJSONObject: results, options: [.sortedKeys])
            print(String(decoding: data, as: UTF8.self))
        }
    }

    struct Measurement {
        var delivery: Double?
        var victimCPU: Double
        var discoveryOff: Double
        /// Datagrams sent, connections made or handshakes attempted by the attacker.
        var attackerActions: Int
    }

    /// Runs one attack against a fresh victim and honest peer.
    private func measure(_ attack: String) async throws -> Measurement {
        let root = BenchNamespace.scratchPath("thali-flood-\(getpid())-\(attack)")
        defer { try? FileManager.default.removeItem(atPath: root) }
        let victimHome = NodeHome(path: root + "/victim")
        let honestHome = NodeHome(path: root + "/honest")
        let victimKey = try NodeIdentity.create(in: victimHome)
        let honestKey = try NodeIdentity.create(in: honestHome)
        let victimStore = try NodeStore(home: victimHome)
        let honestStore = try NodeStore(home: honestHome)
        try victimStore.addContact(name: "honest", publicKey: honestKey.publicKey.hexString(compressed: true))
        try honestStore.addContact(name: "victim", publicKey: victimKey.publicKey.hexString(compressed: true))
        let ssdpPort = Int.random(in: 20000...60000)
        let executable = node ?? CommandLine.arguments[0]

        // The attack starts first: the peers meet it from their first second.
        let attacker = Attacker(kind: attack, ssdpPort: ssdpPort)
        let victimPort = NIOLockedValueBox<Int?>(nil)
        let received = NIOLockedValueBox<Set<String>>([])
        let discoveryOff = NIOLockedValueBox(0.0)
        let debug = ProcessInfo.processInfo.environment["THALI_FLOOD_DEBUG"] != nil
        let onLine: @Sendable (String, String) -> Void = { who, line in
            if debug { print("\(who): \(line)") }
            guard let data = line.data(using: .utf8),
                  let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any],
                  let event = object["event"] as? String else { return }
            switch event {
            case "started" where who == "victim":
                if let location = object["location"] as? String, let parsed = BeaconLocation(parsing: location) {
                    victimPort.withLockedValue { $0 = parsed.port }
                }
            case "received":
                received.withLockedValue { _ = $0.insert(who) }
            case "limit_triggered" where who == "victim":
                if object["effect"] as? String == "discovery-off", let period = object["period_s"] as? Double {
                    discoveryOff.withLockedValue { $0 += period }
                }
            default:
                break
            }
        }
        attacker.startSSDP()
        try await Task.sleep(for: .milliseconds(500))
        let common = ["run", "--json", "--ssdp-port", "\(ssdpPort)"]
        let victim = try SpawnedPeer(name: "victim", executable: executable,
                                     arguments: common + ["--home", victimHome.path, "--address", Self.victimAddress],
                                     stderrPath: root + "/victim.log") { onLine("victim", $0) }
        defer { victim.terminate() }
        let honest = try SpawnedPeer(name: "honest", executable: executable,
                                     arguments: common + ["--home", honestHome.path, "--address", Self.honestAddress],
                                     stderrPath: root + "/honest.log") { onLine("honest", $0) }
        defer { honest.terminate() }
        let start = ContinuousClock.now
        // Attacks on the victim's port need the port.
        while victimPort.withLockedValue({ $0 }) == nil, (ContinuousClock.now - start).seconds < 10 {
            try await Task.sleep(for: .milliseconds(20))
        }
        if let port = victimPort.withLockedValue({ $0 }) { attacker.startTCP(victimPort: port) }

        // The items are queued once the attack has had time to take effect (the peers read their stores
        // every second, as when `send` runs beside them).
        try await Task.sleep(for: .seconds(Self.attackLead))
        let expiry = Date().addingTimeInterval(600)
        _ = try victimStore.enqueueText("from the victim", to: "honest", expiresAt: expiry)
        _ = try honestStore.enqueueText("from the honest peer", to: "victim", expiresAt: expiry)
        let queued = ContinuousClock.now
        var delivery: Double?
        while (ContinuousClock.now - queued).seconds < 60 {
            if delivery == nil, received.withLockedValue({ $0.count == 2 }) {
                delivery = (ContinuousClock.now - queued).seconds
            }
            if delivery != nil, (ContinuousClock.now - start).seconds >= seconds { break }
            try await Task.sleep(for: .milliseconds(50))
        }
        let cpu = Self.cpuSeconds(of: victim.pid)
        let window = (ContinuousClock.now - start).seconds
        attacker.stop()
        if !json {
            print(String(format: "  %@: %d attacker actions in %.1f s (%.0f/s)", attack, attacker.actions.withLockedValue { $0 },
                         window, Double(attacker.actions.withLockedValue { $0 }) / window))
        }
        // An older victim reports discovery switched off only in its log.
        var off = discoveryOff.withLockedValue { $0 }
        if off == 0, let log = try? String(contentsOfFile: root + "/victim.log", encoding: .utf8) {
            off = Double(log.components(separatedBy: "SSDP discovery off").count - 1) * 60
        }
        return Measurement(delivery: delivery, victimCPU: cpu, discoveryOff: off,
                           attackerActions: attacker.actions.withLockedValue { $0 })
    }

    /// User + system CPU seconds of process `pid` so far (from /proc).
    static func cpuSeconds(of pid: pid_t) -> Double {
        guard let stat = ProcessStat.read(pid) else { return 0 }
        return Double(stat.ownTicks) / ProcessStat.ticksPerSecond
    }
}

/// The attacker: one host (or, for handshakes, a few) on the segment, in this process.
final class Attacker: @unchecked Sendable {
    let kind: String
    let ssdpPort: Int
    private let stopped = NIOLockedValueBox(false)
    /// Datagrams sent, connections made or handshakes attempted.
    let actions = NIOLockedValueBox(0)
    private var threads: [Thread] = []
    private var handshakeTask: Task<Void, Never>?

    init(kind: String, ssdpPort: Int) {
        self.kind = kind
        self.ssdpPort = ssdpPort
    }

    private var isStopped: Bool { stopped.withLockedValue { $0 } }

    /// Multicast attacks: start sending at once.
    func startSSDP() {
        let source = BenchFlood.attackerAddresses[0]
        switch kind {
        case "datagram_flood":
            // 2000 datagrams per second, each a new USN from a new port.
            spawn { [self] in
                guard let socket = Self.multicastSocket(from: source) else { return }
                defer { Glibc.close(socket) }
                var index = 0
                while !isStopped {
                    for _ in 0..<20 {
                        index += 1
                        Self.send(socket, alive(location: "http://\(source):\(1024 + index % 60000)/NotificationBeacons", usn: index), port: ssdpPort)
                        actions.withLockedValue { $0 += 1 }
                    }
                    usleep(10_000)
                }
            }
        case "usn_flood", "closed_ports":
            // 150 locations (different ports) on the attacker's own address, or 20 on closed ports, each
            // announced every 500 ms like an honest peer.
            let count = kind == "usn_flood" ? 150 : 20
            spawn { [self] in
                guard let socket = Self.multicastSocket(from: source) else { return }
                defer { Glibc.close(socket) }
                var round = 0
                while !isStopped {
                    round += 1
                    for index in 0..<count {
                        Self.send(socket, alive(location: "http://\(source):\(40000 + index)/NotificationBeacons", usn: index + round * (kind == "usn_flood" ? 1000 : 0)), port: ssdpPort)
                        actions.withLockedValue { $0 += 1 }
                    }
                    usleep(500_000)
                }
            }
        default:
            break
        }
    }

    /// Attacks on the victim's single port.
    func startTCP(victimPort: Int) {
        switch kind {
        case "connection_flood":
            // Connect and close, as fast as one host can (hundreds per second). A connect the victim's
            // kernel does not answer (it drops a refused source's SYNs) is given up after
            // `Self.connectPatience` and the next one sent, so the attacker never stops trying.
            let source = BenchFlood.attackerAddresses[0]
            spawn { [self] in
                while !isStopped {
                    let socket = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
                    guard socket >= 0 else { continue }
                    if Self.bind(socket, to: source), Self.connect(socket, to: BenchFlood.victimAddress, port: victimPort) {
                        actions.withLockedValue { $0 += 1 }
                    }
                    Glibc.close(socket)
                }
            }
        case "tls_handshakes":
            // Full PSK-TLS handshakes with identities the victim never issued, 8 at a time from each of
            // three addresses: every one makes the victim generate a DH key before it can refuse.
            handshakeTask = Task { [self] in
                guard let context = try? PSKTLSContext(role: .client) else { return }
                await withTaskGroup(of: Void.self) { group in
                    for source in BenchFlood.attackerAddresses.suffix(3) {
                        for _ in 0..<8 {
                            group.addTask {
                                while !self.isStopped {
                                    await Self.failedHandshake(context: context, from: source, port: victimPort)
                                    self.actions.withLockedValue { $0 += 1 }
                                }
                            }
                        }
                    }
                }
            }
        default:
            break
        }
    }

    func stop() {
        stopped.withLockedValue { $0 = true }
        handshakeTask?.cancel()
        for thread in threads { while !thread.isFinished { usleep(1000) } }
    }

    private func spawn(_ body: @escaping @Sendable () -> Void) {
        let thread = Thread(block: body)
        threads.append(thread)
        thread.start()
    }

    private func alive(location: String, usn: Int) -> String {
        "NOTIFY * HTTP/1.1\r\nHOST: 239.255.255.250:\(ssdpPort)\r\nCACHE-CONTROL: max-age=60\r\nLOCATION: \(location)\r\n"
            + "NT: http://www.thaliproject.org/ssdp\r\nNTS: ssdp:alive\r\n"
            + "USN: uuid:\(String(format: "%08x", usn))-0000-4000-8000-000000000000:http://www.thaliproject.org/ssdp\r\n\r\n"
    }

    private static func failedHandshake(context: PSKTLSContext, from source: String, port: Int) async {
        let identity = "attacker-\(UInt64.random(in: 0...UInt64.max))"
        let handshake = MultiThreadedEventLoopGroup.singleton.next().makePromise(of: PSKTLSNegotiatedParameters.self)
        do {
            let channel = try await ClientBootstrap(group: handshake.futureResult.eventLoop)
                .bind(to: try SocketAddress(ipAddress: source, port: 0))
                .connectTimeout(.seconds(2))
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(
                            PSKTLSHandler(clientContext: context, identity: identity, psk: Array(repeating: 7, count: 16),
                                          handshakePromise: handshake))
                    }
                }
                .connect(host: BenchFlood.victimAddress, port: port).get()
            _ = try? await handshake.futureResult.get()
            try? await channel.close()
        } catch {
            handshake.fail(error)
            try? await Task.sleep(for: .milliseconds(10))
        }
    }

    private static func multicastSocket(from source: String) -> Int32? {
        let socket = Glibc.socket(AF_INET, Int32(SOCK_DGRAM.rawValue), 0)
        guard socket >= 0, bind(socket, to: source) else { return nil }
        var interface = in_addr()
        inet_pton(AF_INET, source, &interface)
        _ = setsockopt(socket, Int32(IPPROTO_IP), IP_MULTICAST_IF, &interface, socklen_t(MemoryLayout<in_addr>.size))
        return socket
    }

    private static func send(_ socket: Int32, _ text: String, port: Int) {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        inet_pton(AF_INET, "239.255.255.250", &address.sin_addr)
        let bytes = Array(text.utf8)
        _ = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                sendto(socket, bytes, bytes.count, 0, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
    }

    private static func bind(_ socket: Int32, to source: String) -> Bool {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        inet_pton(AF_INET, source, &address.sin_addr)
        return withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.bind(socket, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
    }

    /// How long the connection flood waits for an answer to one connect (on this segment an answered
    /// connect takes well under a millisecond).
    static let connectPatience: Int32 = 20

    /// Connects the non-blocking `socket`, waiting at most ``connectPatience`` ms; whether it connected.
    private static func connect(_ socket: Int32, to host: String, port: Int) -> Bool {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        inet_pton(AF_INET, host, &address.sin_addr)
        let started = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.connect(socket, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 || errno == EINPROGRESS
            }
        }
        guard started else { return false }
        var descriptor = pollfd(fd: socket, events: Int16(POLLOUT), revents: 0)
        guard poll(&descriptor, 1, connectPatience) == 1 else { return false }
        var error: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        return getsockopt(socket, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0
    }
}
