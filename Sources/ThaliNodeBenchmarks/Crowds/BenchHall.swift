import ArgumentParser
import Foundation
import NIOConcurrencyHelpers
import NIOPosix
import ThaliBeacons
import ThaliNodeCore
import ThaliProcess

/// `thali-node bench hall`: the conference hall of `spec/ssdp.md` 7.2. One process simulates thousands
/// of peers on one segment (``HallSimulator``: each its own address, real beacons, the foreground
/// announcement rate); among them a few real `thali-node run` peers, contacts of each other with an item
/// for each, must find each other and deliver while discovery narrows to a sample of the hall. Measures
/// delivery, each real peer's CPU and peak memory, the peers it tracked, its beacon fetches and the
/// limits it reported. Root: it runs in a network namespace it creates.
struct BenchHall: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "hall",
        abstract: "Simulate a hall of thousands of peers in one process around a few real peers; measure delivery, CPU and memory (root: it creates a network namespace).")

    @Option(help: "Simulated peers in the hall.") var simulated = 10_000
    @Option(help: "Real `thali-node run` peers, contacts of each other, each with an item for every other.") var real = 2
    @Option(help: "Seconds the real peers run (delivery is awaited within it; CPU is measured over all of it).")
    var duration = 120.0
    @Option(help: "Alives per second of each simulated peer (the seed's foreground rate: 2).") var rate = 2.0
    @Option(help: "Seconds the hall announces before the real peers start.") var warmup = 3.0
    @Option(help: ArgumentHelp("The thali-node executable for the real peers (default: this one).", valueName: "path"))
    var node: String?
    @Flag(help: "Print one JSON object (keys simulated_peers, real_peers, items, datagrams_per_s, delivered, all_delivered_s, real_peer_cpu_s_per_min, real_peer_cpu_s_per_min_second_half, real_peer_max_rss_mb, tracked_peers_max, fetches, limits_fired, per_peer).")
    var json = false
    @Flag(name: .customLong(String(BenchNamespace.insideFlag.dropFirst(2))), help: .hidden) var insideNamespace = false

    func validate() throws {
        guard (1...HallSimulator.maxPeers).contains(simulated) else {
            throw ValidationError("--simulated must be in 1...\(HallSimulator.maxPeers)")
        }
        guard (2...8).contains(real) else { throw ValidationError("--real must be in 2...8") }
        guard duration > 0, rate > 0, rate <= 100, warmup >= 0 else {
            throw ValidationError("--duration and --rate must be positive (--rate at most 100), --warmup not negative")
        }
    }

    func run() async throws {
        guard insideNamespace else {
            var arguments = ["bench", "hall", "--simulated", "\(simulated)", "--real", "\(real)", "--duration", "\(duration)",
                             "--rate", "\(rate)", "--warmup", "\(warmup)"]
            if let node { arguments += ["--node", node] }
            if json { arguments.append("--json") }
            let status = try BenchNamespace.run(addressCount: real, arguments: arguments)
            if status != 0 { throw ExitCode(status) }
            return
        }
        BenchNamespace.runningInside()
        BenchNamespace.raiseOpenFileLimit()
        try HallSimulator.addAnyIPRange()
        let root = BenchNamespace.scratchPath("thali-hall-\(getpid())")
        defer { try? FileManager.default.removeItem(atPath: root) }
        let debug = ProcessInfo.processInfo.environment["THALI_HALL_DEBUG"] != nil
        let ssdpPort = Int.random(in: 20000...60000)
        let executable = node ?? CommandLine.arguments[0]

        let generated = ContinuousClock.now
        let hall = try HallSimulator(peers: simulated)
        let httpPort = try await hall.startServer(group: MultiThreadedEventLoopGroup.singleton)
        try hall.startAnnouncing(ssdpPort: ssdpPort, httpPort: httpPort, interval: .nanoseconds(Int64(1e9 / rate)))
        if !json {
            print(String(format: "hall: %d simulated peers (beacons made in %.1f s, %d bytes in all), announcing %.0f alives/s",
                         simulated, (ContinuousClock.now - generated).seconds, hall.beaconBytes, Double(simulated) * rate))
            fflush(nil)
        }

        // The real peers: contacts of each other, an item for each.
        var stores: [NodeStore] = []
        var keys: [PrivateKey] = []
        var homes: [NodeHome] = []
        for index in 0..<real {
            let home = NodeHome(path: "\(root)/r\(index)")
            keys.append(try NodeIdentity.create(in: home))
            stores.append(try NodeStore(home: home))
            homes.append(home)
        }
        let expiry = Date().addingTimeInterval(3600)
        for index in 0..<real {
            for other in 0..<real where other != index {
                try stores[index].addContact(name: "r\(other)", publicKey: keys[other].publicKey.hexString(compressed: true))
                _ = try stores[index].enqueueText("from r\(index) to r\(other)", to: "r\(other)", expiresAt: expiry)
            }
        }
        let items = real * (real - 1)
        try await Task.sleep(for: .milliseconds(Int64(warmup * 1000)))

        let observed = (0..<real).map { _ in NIOLockedValueBox(RealPeerObservation()) }
        let start = ContinuousClock.now
        var peers: [SpawnedPeer] = []
        defer { for peer in peers { peer.terminate() } }
        for index in 0..<real {
            let arguments = ["run", "--home", homes[index].path, "--json", "--address", BenchNamespace.address(index),
                             "--ssdp-port", "\(ssdpPort)", "--status-interval", "2"]
            let observation = observed[index]
            peers.append(try SpawnedPeer(name: "r\(index)", executable: executable, arguments: arguments,
                                         stderrPath: "\(root)/r\(index).log") { line in
                observation.withLockedValue { $0.read(line, at: (ContinuousClock.now - start).seconds) }
                if debug, !line.contains("\"peer_appeared\""), !line.contains("\"peer_left\""), !line.contains("\"status\"") {
                    print("r\(index): \(line)")
                }
            })
        }
        let cpuAtStart = peers.map { BenchFlood.cpuSeconds(of: $0.pid) }
        var cpuAtHalf: [Double]?
        var lastReport = ContinuousClock.now
        while (ContinuousClock.now - start).seconds < duration {
            try await Task.sleep(for: .milliseconds(250))
            let elapsed = (ContinuousClock.now - start).seconds
            if cpuAtHalf == nil, elapsed >= duration / 2 { cpuAtHalf = peers.map { BenchFlood.cpuSeconds(of: $0.pid) } }
            if let exited = peers.first(where: \.hasExited) {
                throw BenchNamespace.Failure(description: "\(exited.name) exited early; see its log")
            }
            if !json, (ContinuousClock.now - lastReport).seconds >= 10 {
                lastReport = ContinuousClock.now
                let states = observed.map { $0.withLockedValue { $0 } }
                print(String(format: "  %5.0f s: %d/%d received; tracked %@; %.0f datagrams/s sent", elapsed,
                             states.reduce(0) { $0 + $1.received.count }, items,
                             states.map { "\($0.trackedNow)" }.joined(separator: "/"), hall.sent.perSecond))
                fflush(nil)
            }
        }
        let elapsed = (ContinuousClock.now - start).seconds
        let cpuAtEnd = peers.map { BenchFlood.cpuSeconds(of: $0.pid) }
        let peakRSS = peers.map { Self.peakRSSMiB(of: $0.pid) }
        for peer in peers { peer.terminate() }
        peers = []
        let sent = hall.sent
        let fetchesByClient = hall.fetchesByClient
        await hall.stop()

        // Exactly once, from the inboxes.
        var delivered = 0
        for index in 0..<real {
            let inbox = try stores[index].inbox().compactMap(\.text)
            for other in 0..<real where other != index && inbox.filter({ $0 == "from r\(other) to r\(index)" }).count == 1 {
                delivered += 1
            }
        }
        let states = observed.map { $0.withLockedValue { $0 } }
        let receivedAt = states.flatMap { $0.received.values }
        let allDelivered = receivedAt.count == items ? receivedAt.max() : nil
        var limitsFired: [String: Int] = [:]
        for state in states { for (kind, count) in state.limitsTriggered { limitsFired[kind, default: 0] += count } }
        let minutes = elapsed / 60
        func rounded(_ value: Double, _ places: Double = 1000) -> Double { (value * places).rounded() / places }
        let perPeer: [[String: Any]] = (0..<real).map { index in
            let cpu = cpuAtEnd[index] - cpuAtStart[index]
            let secondHalf = cpuAtHalf.map { (cpuAtEnd[index] - $0[index]) / (minutes / 2) }
            return [
                "name": "r\(index)", "cpu_s": rounded(cpu), "cpu_s_per_min": rounded(cpu / minutes),
                "cpu_s_per_min_second_half": secondHalf.map { rounded($0) } as Any? ?? NSNull(),
                "max_rss_mb": rounded(peakRSS[index], 100), "tracked_peers_max": states[index].trackedMax,
                "fetches": fetchesByClient[BenchNamespace.address(index)] ?? 0,
                "limits_fired": states[index].limitsTriggered,
                "received_s": states[index].received.values.max().map { rounded($0) } as Any? ?? NSNull(),
            ]
        }
        let cpuPerMinute = (0..<real).map { (cpuAtEnd[$0] - cpuAtStart[$0]) / minutes }
        let secondHalfPerMinute = cpuAtHalf.map { half in (0..<real).map { (cpuAtEnd[$0] - half[$0]) / (minutes / 2) } }
        let trackedMax = states.map(\.trackedMax).max() ?? 0
        let fetches = (0..<real).reduce(0) { $0 + (fetchesByClient[BenchNamespace.address($1)] ?? 0) }
        if json {
            let object: [String: Any] = [
                "simulated_peers": simulated, "real_peers": real, "items": items, "duration_s": rounded(elapsed),
                "datagrams_per_s": rounded(sent.perSecond, 1), "datagrams_sent": sent.datagrams,
                "delivered": delivered,
                "all_delivered_s": allDelivered.map { rounded($0) } as Any? ?? NSNull(),
                "real_peer_cpu_s_per_min": rounded(cpuPerMinute.max() ?? 0),
                "real_peer_cpu_s_per_min_second_half": secondHalfPerMinute.map { rounded($0.max() ?? 0) } as Any? ?? NSNull(),
                "real_peer_max_rss_mb": rounded(peakRSS.max() ?? 0, 100),
                "tracked_peers_max": trackedMax, "fetches": fetches, "limits_fired": limitsFired, "per_peer": perPeer,
            ]
            let data = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
            print(String(decoding: data, as: UTF8.self))
        } else {
            print(String(format: "hall: %d simulated peers, %.0f datagrams/s sent (%d in %.0f s)", simulated, sent.perSecond,
                         sent.datagrams, elapsed))
            print("hall: \(delivered)/\(items) items delivered exactly once"
                  + (allDelivered.map { String(format: ", the last %.1f s after the real peers started", $0) } ?? ""))
            for (index, peer) in perPeer.enumerated() {
                print(String(format: "  r%d: %.2f CPU-s per minute (second half %@), peak RSS %.1f MiB, tracked at most %d, %d beacon fetches, limits %@",
                             index, cpuPerMinute[index],
                             secondHalfPerMinute.map { String(format: "%.2f", $0[index]) } ?? "-",
                             peakRSS[index], states[index].trackedMax, peer["fetches"] as? Int ?? 0,
                             states[index].limitsTriggered.isEmpty ? "none" : "\(states[index].limitsTriggered)"))
            }
        }
        if delivered != items { throw ExitCode(1) }
    }

    /// The peak resident set of process `pid` in MiB (`VmHWM`), 0 if unknown.
    static func peakRSSMiB(of pid: pid_t) -> Double {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") }),
              let kilobytes = line.split(separator: " ").dropFirst().first.flatMap({ Double($0) }) else { return 0 }
        return kilobytes / 1024
    }
}

/// What one real peer's `run --json` lines said.
struct RealPeerObservation {
    /// When each item arrived (seconds since the real peers started), by its text.
    var received: [String: Double] = [:]
    /// Peers tracked now (appeared less left, event by event), and at most.
    var trackedNow = 0
    var trackedMax = 0
    /// Limits fired, by kind, as the last status counted them.
    var limitsTriggered: [String: Int] = [:]

    mutating func read(_ line: String, at seconds: Double) {
        // The hall's arrivals and departures are most lines: counted without parsing.
        if line.contains("\"event\":\"peer_appeared\"") {
            trackedNow += 1
            trackedMax = max(trackedMax, trackedNow)
            return
        }
        if line.contains("\"event\":\"peer_left\"") {
            trackedNow -= 1
            return
        }
        guard let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
              let event = object["event"] as? String else { return }
        switch event {
        case "received":
            if let text = object["text"] as? String, received[text] == nil { received[text] = seconds }
        case "status":
            if let limits = object["limits_triggered"] as? [String: Int] { limitsTriggered = limits }
        default:
            break
        }
    }
}
