import ArgumentParser
import Foundation
import Logging
import NIOConcurrencyHelpers
import ThaliBeacons
import ThaliNodeCore

/// `thali-node bench send`: what an app's `ThaliPeer.send(text:to:)` costs its caller when the peer
/// advertises for many contacts. Every send of a new item makes the peer announce anew (an ECDH per
/// contact, and store queries); this measures how long a send takes and how long the Swift concurrency
/// pool goes without running anything else meanwhile (an app's UI and network tasks share it).
struct BenchSend: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "send",
        abstract: "Measure ThaliPeer.send's cost to its caller with many contacts advertised (a real peer on 127.0.0.1).")

    @Option(help: "Contacts, each with an item pending, so that every announcement carries a beacon for each.")
    var contacts = 300
    @Option(help: "Rounds; each sends one text per core at once.") var rounds = 10
    @Flag(help: "Print one JSON object (keys contacts, sends, send_ms_median, send_ms_max, pool_stall_ms_max).")
    var json = false

    func validate() throws {
        guard (1...2000).contains(contacts) else { throw ValidationError("--contacts must be in 1...2000") }
        guard (1...1000).contains(rounds) else { throw ValidationError("--rounds must be in 1...1000") }
    }

    func run() async throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("thali-bench-send-\(getpid())").path
        defer { try? FileManager.default.removeItem(atPath: root) }
        let home = NodeHome(path: root)
        let key = try NodeIdentity.create(in: home)
        let store = try NodeStore(home: home)
        let expiry = Date().addingTimeInterval(3600)
        for index in 0..<contacts {
            _ = try store.addContact(name: "c\(index)", publicKey: PrivateKey().publicKey.hexString())
            _ = try store.enqueueText("pending \(index)", to: "c\(index)", expiresAt: expiry)
        }
        var configuration = PeerConfiguration(interfaceAddress: "127.0.0.1")
        configuration.ssdpPort = Int.random(in: 20000...60000)
        let peer = try ThaliPeer(store: store, identity: key, configuration: configuration, logger: Logger(label: "bench-send") { _ in SwiftLogNoOpLogHandler() })
        try await peer.start()

        // One ticker per core on the concurrency pool: the longest it waited past its period is how long
        // every thread of the pool was held.
        let stall = NIOLockedValueBox(Duration.zero)
        let ticking = NIOLockedValueBox(true)
        let period = Duration.milliseconds(1)
        let width = ProcessInfo.processInfo.activeProcessorCount
        let tickers = (0..<width).map { _ in
            Task {
                let clock = ContinuousClock()
                while ticking.withLockedValue({ $0 }) {
                    let before = clock.now
                    try? await Task.sleep(for: period)
                    let late = clock.now - before - period
                    stall.withLockedValue { $0 = max($0, late) }
                }
            }
        }
        var sendTimes: [Duration] = []
        var sent = 0
        for round in 0..<rounds {
            let times = try await withThrowingTaskGroup(of: Duration.self) { group in
                for lane in 0..<width {
                    let contact = "c\((round * width + lane) % contacts)"
                    group.addTask {
                        let clock = ContinuousClock()
                        let start = clock.now
                        try await peer.send(text: "round \(round) lane \(lane)", to: contact, expiresIn: .seconds(3600))
                        return clock.now - start
                    }
                }
                return try await group.reduce(into: [Duration]()) { $0.append($1) }
            }
            sendTimes += times
            sent += times.count
        }
        ticking.withLockedValue { $0 = false }
        for ticker in tickers { await ticker.value }
        await peer.stop()

        let milliseconds = { (duration: Duration) in Double(duration.components.seconds) * 1000 + Double(duration.components.attoseconds) / 1e15 }
        let sorted = sendTimes.map(milliseconds).sorted()
        let median = sorted.isEmpty ? 0 : sorted[sorted.count / 2]
        let most = sorted.last ?? 0
        let stalled = milliseconds(stall.withLockedValue { $0 })
        func rounded(_ value: Double) -> Double { (value * 100).rounded() / 100 }
        if json {
            print("{\"contacts\": \(contacts), \"sends\": \(sent), \"send_ms_median\": \(rounded(median)), \"send_ms_max\": \(rounded(most)), "
                + "\"pool_stall_ms_max\": \(rounded(stalled))}")
        } else {
            print("ThaliPeer.send with \(contacts) contacts advertised, \(width) sends at once, \(rounds) rounds")
            print("  send: median \(rounded(median)) ms, max \(rounded(most)) ms")
            print("  the concurrency pool went up to \(rounded(stalled)) ms without running a ticker due every 1 ms")
        }
    }
}
