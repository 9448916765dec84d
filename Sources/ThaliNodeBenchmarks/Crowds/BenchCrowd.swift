import ArgumentParser
import Foundation
import Logging
import NIOConcurrencyHelpers
import ThaliBeacons
import ThaliNodeCore

/// `thali-node bench crowd`: many honest peers on one segment (a conference hall), each with a few
/// contacts among the others and an item for each of them. Every peer is a real `ThaliPeer` with its own
/// SQLite store and its own address (127.0.1.x in a network namespace the benchmark creates), all in one
/// process on the machine's cores.
struct BenchCrowd: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "crowd",
        abstract: "Run a crowd of peers on one segment and measure delivery, discovery downtime, CPU and memory (root: it creates a network namespace).")

    @Option(help: "Peers in the crowd.") var peers = 150
    @Option(help: "Contacts each peer sends one item to (the next ones in the ring; each also hears from as many).")
    var contacts = 3
    @Option(help: "Give up after this many seconds.") var timeout = 300.0
    @Flag(help: "Print one JSON object (keys peers, items, delivered, started_s, all_delivered_s, delivered_after_start_s, discovery_off_s, port_closed_s, limits_fired, narrowings, busy_answers, fetches, fetch_failures, fetch_failures_by_kind, cpu_s, cpu_bound_s, cpu_s_per_peer, cpu_ms_per_pair, peak_rss_mb_per_peer, load_average).")
    var json = false
    @Flag(name: .customLong(String(BenchNamespace.insideFlag.dropFirst(2))), help: .hidden) var insideNamespace = false

    func validate() throws {
        guard peers >= 2, peers <= 2000 else { throw ValidationError("--peers must be in 2...2000") }
        guard contacts >= 1, contacts < peers else { throw ValidationError("--contacts must be in 1..<peers") }
    }

    func run() async throws {
        guard insideNamespace else {
            var arguments = ["bench", "crowd", "--peers", "\(peers)", "--contacts", "\(contacts)", "--timeout", "\(timeout)"]
            if json { arguments.append("--json") }
            let status = try BenchNamespace.run(addressCount: peers, arguments: arguments)
            if status != 0 { throw ExitCode(status) }
            return
        }
        BenchNamespace.runningInside()
        BenchNamespace.raiseOpenFileLimit()
        let root = BenchNamespace.scratchPath("thali-crowd-\(getpid())")
        defer { try? FileManager.default.removeItem(atPath: root) }
        // THALI_CROWD_DEBUG: each peer's failures and its notices (limits, ignored sources) on standard output.
        let debug = ProcessInfo.processInfo.environment["THALI_CROWD_DEBUG"] != nil
        let ssdpPort = Int.random(in: 20000...60000)
        let expiry = Date().addingTimeInterval(3600)

        // Identities and stores first, then the ring of contacts and items.
        var stores: [NodeStore] = []
        var keys: [PrivateKey] = []
        for index in 0..<peers {
            let home = NodeHome(path: "\(root)/p\(index)")
            keys.append(try NodeIdentity.create(in: home))
            stores.append(try NodeStore(home: home))
        }
        let name = { (index: Int) in "p\(index)" }
        var expected: [Int: [String: Int]] = [:]  // receiver → text → sender
        for index in 0..<peers {
            for step in 1...contacts {
                let next = (index + step) % peers
                let previous = (index - step + peers) % peers
                // In a small crowd the next ones of one peer are the previous ones of another.
                for other in [next, previous] where (try? stores[index].contact(named: name(other))) == nil {
                    try stores[index].addContact(name: name(other), publicKey: keys[other].publicKey.hexString(compressed: true))
                }
                let text = "from \(name(index)) to \(name(next))"
                _ = try stores[index].enqueueText(text, to: name(next), expiresAt: expiry)
                expected[next, default: [:]][text] = index
            }
        }
        let items = peers * contacts

        let received = NIOLockedValueBox(0)
        let discoveryOff = NIOLockedValueBox(0.0)
        let portClosed = NIOLockedValueBox(0.0)
        let usageBefore = BenchNamespace.usage()
        var running: [ThaliPeer] = []
        for index in 0..<peers {
            var configuration = PeerConfiguration(interfaceAddress: BenchNamespace.address(index))
            configuration.ssdpPort = ssdpPort
            let peer = try ThaliPeer(store: stores[index], identity: keys[index], configuration: configuration,
                                     logger: Self.logger(peer: index, debug: debug), events: { event in
                switch event {
                case .delivery(_, .received): received.withLockedValue { $0 += 1 }
                case .limitTriggered(let report):
                    switch report.effect {
                    case .discoveryOff: discoveryOff.withLockedValue { $0 += report.period.seconds }
                    case .portClosed: portClosed.withLockedValue { $0 += report.period.seconds }
                    default: break
                    }
                    if debug { print("p\(index): \(event)") }
                case .connectionFailed, .sessionEnded(_, _, .some), .disconnected, .beaconMatched, .connecting:
                    if debug { print("p\(index): \(event)") }
                default: break
                }
            })
            running.append(peer)
        }
        let start = ContinuousClock.now
        for peer in running { try await peer.start() }
        // Starting 150 peers one after the other takes seconds: delivery is also timed from the last start.
        let started = (ContinuousClock.now - start).seconds
        if !json {
            print("crowd: \(peers) peers started in \(String(format: "%.1f", started)) s; \(items) items to deliver")
            fflush(nil)  // progress through a pipe too (naming stdout is not concurrency-safe in Swift 6)
        }
        var allDelivered: Double?
        var lastReport = ContinuousClock.now
        while (ContinuousClock.now - start).seconds < timeout {
            try await Task.sleep(for: .milliseconds(250))
            let count = received.withLockedValue { $0 }
            if count >= items {
                allDelivered = (ContinuousClock.now - start).seconds
                break
            }
            if !json, (ContinuousClock.now - lastReport).seconds >= 5 {
                lastReport = ContinuousClock.now
                print(String(format: "  %5.1f s: %d/%d received", (ContinuousClock.now - start).seconds, count, items))
                fflush(nil)
            }
        }
        let usageAfter = BenchNamespace.usage()
        if allDelivered == nil { await reportUndelivered(expected: expected, stores: stores, running: running) }
        // Narrowing switches nothing off: counted apart from the limits whose last resort does.
        var limitsFired: [String: Int] = [:]
        var narrowings = 0
        var busyAnswers = 0
        var discoveryCounts = PeerDiscoveryCounters()
        for peer in running {
            let status = await peer.status()
            for (kind, count) in status.limitsTriggered {
                if kind == .narrowed { narrowings += count } else { limitsFired[kind.rawValue, default: 0] += count }
            }
            busyAnswers += status.port.admission.busyAnswers
            discoveryCounts.beaconFetches += status.discovery.beaconFetches
            discoveryCounts.beaconFetchFailures += status.discovery.beaconFetchFailures
            discoveryCounts.beaconFetchFailuresByKind.merge(status.discovery.beaconFetchFailuresByKind, uniquingKeysWith: +)
        }
        for peer in running { await peer.stop() }

        // Exactly once, from the inboxes.
        var delivered = 0
        for (receiver, texts) in expected {
            let inbox = try stores[receiver].inbox().compactMap(\.text)
            for text in texts.keys where inbox.filter({ $0 == text }).count == 1 { delivered += 1 }
        }
        let cpu = usageAfter.cpuSeconds - usageBefore.cpuSeconds
        let cpuPerPeer = cpu / Double(peers)
        func rounded(_ value: Double, _ places: Double = 1000) -> Double { (value * places).rounded() / places }
        let rssPerPeer = usageAfter.peakRSSMiB / Double(peers)
        let cores = ProcessInfo.processInfo.activeProcessorCount
        if json {
            let object: [String: Any] = [
                "peers": peers, "items": items, "delivered": delivered,
                "started_s": rounded(started),
                "all_delivered_s": allDelivered.map { rounded($0) } as Any? ?? NSNull(),
                "delivered_after_start_s": allDelivered.map { rounded($0 - started) } as Any? ?? NSNull(),
                "discovery_off_s": discoveryOff.withLockedValue { $0 },
                "port_closed_s": portClosed.withLockedValue { $0 },
                "limits_fired": limitsFired,
                "narrowings": narrowings,
                "busy_answers": busyAnswers,
                "cpu_bound_s": rounded(cpu / Double(cores)),
                "load_average": Self.loadAverage() as Any? ?? NSNull(),
                "fetches": discoveryCounts.beaconFetches,
                "fetch_failures": discoveryCounts.beaconFetchFailures,
                "fetch_failures_by_kind": Dictionary(uniqueKeysWithValues: discoveryCounts.beaconFetchFailuresByKind.map { ($0.key.rawValue, $0.value) }),
                "cpu_s": rounded(cpu),
                "cpu_s_per_peer": rounded(cpuPerPeer),
                "cpu_ms_per_pair": rounded(cpu * 1000 / Double(peers * peers)),
                "peak_rss_mb_per_peer": (rssPerPeer * 100).rounded() / 100,
            ]
            let data = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
            print(String(decoding: data, as: UTF8.self))
        } else {
            print("crowd: \(delivered)/\(items) items delivered exactly once"
                  + (allDelivered.map { String(format: " in %.1f s", $0) } ?? String(format: " (not all within %g s)", timeout)))
            print(String(format: "crowd: discovery off %.0f s, ports closed %.0f s in total; %.3f CPU s per peer; peak RSS %.2f MiB per peer",
                         discoveryOff.withLockedValue { $0 }, portClosed.withLockedValue { $0 }, cpuPerPeer, rssPerPeer))
            print(String(format: "crowd: CPU bound %.1f s (%.1f CPU-s on %d cores); load average %@", cpu / Double(cores), cpu, cores,
                         Self.loadAverage().map { String(format: "%.2f", $0) } ?? "?"))
            let kinds = discoveryCounts.beaconFetchFailuresByKind.sorted { $0.key.rawValue < $1.key.rawValue }
                .map { "\($0.key) \($0.value)" }.joined(separator: ", ")
            print("crowd: \(discoveryCounts.beaconFetches) beacon fetches, \(discoveryCounts.beaconFetchFailures) failed"
                  + (kinds.isEmpty ? ", " : " (\(kinds)), ")
                  + "\(busyAnswers) answered busy; \(narrowings) narrowings; limits fired: "
                  + (limitsFired.isEmpty ? "none" : limitsFired.sorted { $0.key < $1.key }.map { "\($0.key) ×\($0.value)" }.joined(separator: ", ")))
        }
        if allDelivered == nil || delivered != items { throw ExitCode(1) }
    }

    /// The one-minute load average at the end (`/proc/loadavg`): the machine is shared, and the figures
    /// mean little without it.
    private static func loadAverage() -> Double? {
        (try? String(contentsOfFile: "/proc/loadavg", encoding: .utf8))?.split(separator: " ").first.flatMap { Double($0) }
    }

    /// Silent, or with `debug` notices and worse on standard output, labelled with the peer.
    private static func logger(peer index: Int, debug: Bool) -> Logger {
        Logger(label: "p\(index)") { label in
            guard debug else { return SwiftLogNoOpLogHandler() }
            var handler = StreamLogHandler.standardOutput(label: label)
            handler.logLevel = .notice
            return handler
        }
    }

    /// What each item still missing at the timeout is waiting for: one line per item, with the receiver's
    /// link to the sender and what the sender advertises (so a failed run says where delivery stopped).
    private func reportUndelivered(expected: [Int: [String: Int]], stores: [NodeStore], running: [ThaliPeer]) async {
        let shown = 20
        var missing = 0
        for (receiver, texts) in expected.sorted(by: { $0.key < $1.key }) {
            let inbox = Set(((try? stores[receiver].inbox()) ?? []).compactMap(\.text))
            for (text, sender) in texts.sorted(by: { $0.key < $1.key }) where !inbox.contains(text) {
                missing += 1
                guard missing <= shown else { continue }
                let receiverStatus = await running[receiver].status()
                let senderStatus = await running[sender].status()
                let link = receiverStatus.matchedContacts.first { $0.name == "p\(sender)" }
                let heard = senderStatus.location.map(receiverStatus.peersSeen.contains) ?? false
                print("crowd: undelivered \"\(text)\": p\(receiver) "
                      + (heard ? "hears" : "does not hear") + " p\(sender) at \(senderStatus.location.map { "\($0)" } ?? "-"); its link: "
                      + (link.map { "\($0.state) via \($0.location.map { "\($0)" } ?? "-")" } ?? "none (no match)")
                      + "; p\(sender) advertises for \(senderStatus.advertisingFor), limits fired \(senderStatus.limitsTriggered)"
                      + ", p\(receiver)'s \(receiverStatus.limitsTriggered)")
            }
        }
        if missing > shown { print("crowd: and \(missing - shown) more undelivered") }
    }
}
