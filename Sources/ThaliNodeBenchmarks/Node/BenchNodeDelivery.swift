import ArgumentParser
import Foundation
import NIOConcurrencyHelpers
import ThaliNodeCore

/// File delivery as users run it, for `bench delivery`'s node figures: a file queued at node a for
/// contact b, then both nodes started as real `thali-node run` processes (``BenchNodePair``), which find
/// each other over SSDP on loopback and deliver over PSK-TLS and the multiplexer, the receiver hashing
/// and syncing as always. Timed from a's `offered` to b's `received` (the item committed to b's inbox),
/// as each node prints them.
enum NodeFileDelivery {
    /// What one delivery took.
    struct Measurement {
        var seconds: Double
        /// CPU seconds both nodes (every thread) spent from `offered` to `received`, read from /proc
        /// when each record arrived (clock ticks: 10 ms steps).
        var cpuSeconds: Double
    }

    /// The moment a record arrived, and both nodes' CPU seconds then.
    private struct Mark: Sendable {
        var at: ContinuousClock.Instant
        var cpuSeconds: Double
    }

    /// Delivers `mib` MiB (written in `block`-sized writes, synced, then queued) from a to b; gives up
    /// after `timeout` seconds or when a node exits.
    static func measure(mib: Int, block: Data, timeout: Double) async throws -> Measurement {
        let pair = try BenchNodePair(label: "delivery")
        defer { pair.stop() }
        let source = pair.root + "/payload.bin"
        _ = try BenchDelivery.writeAndSync(block, bytes: mib << 20, to: source)
        try NodeStore(home: pair.homes[0]).enqueueFile(at: source, to: BenchNodePair.names[1],
                                                       expiresAt: Date().addingTimeInterval(3600))
        let marks = NIOLockedValueBox<(offered: Mark?, received: Mark?)>((nil, nil))
        try pair.start(arguments: []) { [pair] name, record in
            let event = record["event"] as? String
            guard (name == "a" && event == "offered") || (name == "b" && event == "received") else { return }
            let mark = Mark(at: .now, cpuSeconds: pair.pids.map(BenchFlood.cpuSeconds(of:)).reduce(0, +))
            marks.withLockedValue { marks in
                if event == "offered" { marks.offered = marks.offered ?? mark } else { marks.received = marks.received ?? mark }
            }
        }
        let done = await pair.wait(seconds: timeout) { () -> (Mark, Mark)? in
            let (offered, received) = marks.withLockedValue { $0 }
            guard let offered, let received else { return nil }
            return (offered, received)
        }
        guard let (offered, received) = done else {
            let exited = pair.exited
            throw ValidationError(exited.isEmpty ? "the nodes delivered no file within \(timeout) s"
                                                 : "node \(exited.joined(separator: ", ")) exited before the file was delivered")
        }
        return Measurement(seconds: (received.at - offered.at).seconds,
                           cpuSeconds: received.cpuSeconds - offered.cpuSeconds)
    }
}
