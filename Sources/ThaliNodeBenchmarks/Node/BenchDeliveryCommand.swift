import ArgumentParser
import Foundation
import Logging
import NIOCore
import NIOPosix
import ThaliBeacons
import ThaliNodeCore

/// `thali-node bench delivery [--json]`: delivery throughput between two stores over loopback TCP (no
/// TLS, no multiplexer: the cost of the store-and-forward core alone), and in the same run the PSK-TLS
/// bulk throughput of one connection (`bench tls`'s figure), the layer a node's delivery runs on, and
/// what the disk under the data directory takes to write and sync as many bytes (the bound of a durable
/// receiver). With `--node-mib`, also a file delivered as users run it: between two `thali-node run`
/// processes, over PSK-TLS and the multiplexer (``NodeFileDelivery``).
struct BenchDelivery: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "delivery",
        abstract: "Measure delivery of texts and of a file between two local stores over loopback TCP.")

    @Option(help: "How many texts to deliver.") var texts = 200
    @Option(help: "Size of the file to deliver, in MiB.") var fileMib = 64
    @Option(help: "Data chunk size in bytes.") var chunkBytes = DeliveryLimits.default.chunkBytes
    @Option(help: "MiB sent over one PSK-TLS connection for the TLS bulk figure (0: skip it).") var tlsMib = 512
    @Option(help: "Block size of the file reads and writes (and of the disk reference), in KiB.")
    var blockKib = DeliveryLimits.default.blockBytes >> 10
    @Option(help: "MiB the receiver writes between two requests to start the disk's writeback.")
    var writebackMib = DeliveryLimits.default.writebackBytes >> 20
    @Flag(help: "The receiver writes the file through the page cache, not with direct I/O (DeliveryLimits.directWrites).")
    var bufferedWrites = false
    @Option(help: "Size of the file delivered between two thali-node run processes (PSK-TLS, multiplexer), in MiB (0: skip it).")
    var nodeMib = 64
    @Option(help: "Give up on the delivery between two nodes after this many seconds.") var nodeTimeout = 120.0
    @Flag(help: """
        Print one JSON object instead of lines (keys texts, texts_s, texts_per_s, ms_per_text, file_mib, \
        file_queue_s, file_queue_mb_s, file_s, file_mb_s, file_cpu_s, chunk_bytes, tls_bulk_mb_s, file_tls_ratio, \
        disk_mb_s, file_disk_ratio, node_file_mib, node_file_s, node_file_mb_s, node_file_cpu_s, node_file_tls_ratio; \
        rates in items/s and MiB/s; the text, file, TLS or node keys absent when --texts, --file-mib, --tls-mib or \
        --node-mib is 0).
        """)
    var json = false

    /// The figures of one run, as `--json` prints them (the same as the lines).
    struct Figures: Encodable {
        var texts: Int?
        var textsSeconds: Double?
        var textsPerSecond: Double?
        var millisecondsPerText: Double?
        var fileMiB: Int?
        var fileQueueSeconds: Double?
        var fileQueueMiBPerSecond: Double?
        var fileSeconds: Double?
        var fileMiBPerSecond: Double?
        /// CPU seconds the process (both stores, every thread) spent while the file was delivered.
        var fileCPUSeconds: Double?
        var chunkBytes: Int?
        var tlsBulkMiBPerSecond: Double?
        var fileToTLSRatio: Double?
        var diskMiBPerSecond: Double?
        var fileToDiskRatio: Double?
        var nodeFileMiB: Int?
        var nodeFileSeconds: Double?
        var nodeFileMiBPerSecond: Double?
        /// CPU seconds both `run` processes spent while the file went from one to the other.
        var nodeFileCPUSeconds: Double?
        var nodeFileToTLSRatio: Double?

        enum CodingKeys: String, CodingKey {
            case texts
            case textsSeconds = "texts_s"
            case textsPerSecond = "texts_per_s"
            case millisecondsPerText = "ms_per_text"
            case fileMiB = "file_mib"
            case fileQueueSeconds = "file_queue_s"
            case fileQueueMiBPerSecond = "file_queue_mb_s"
            case fileSeconds = "file_s"
            case fileMiBPerSecond = "file_mb_s"
            case fileCPUSeconds = "file_cpu_s"
            case chunkBytes = "chunk_bytes"
            case tlsBulkMiBPerSecond = "tls_bulk_mb_s"
            case fileToTLSRatio = "file_tls_ratio"
            case diskMiBPerSecond = "disk_mb_s"
            case fileToDiskRatio = "file_disk_ratio"
            case nodeFileMiB = "node_file_mib"
            case nodeFileSeconds = "node_file_s"
            case nodeFileMiBPerSecond = "node_file_mb_s"
            case nodeFileCPUSeconds = "node_file_cpu_s"
            case nodeFileToTLSRatio = "node_file_tls_ratio"
        }
    }

    func run() async throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("thali-bench-\(getpid())").path
        defer { try? FileManager.default.removeItem(atPath: root) }
        let limits = DeliveryLimits(chunkBytes: chunkBytes, maxItemBytes: UInt64(max(fileMib, 1)) << 20,
                                    blockBytes: blockKib << 10, writebackBytes: writebackMib << 20,
                                    directWrites: !bufferedWrites)
        let alice = try NodeStore(home: NodeHome(path: root + "/alice"), limits: limits)
        let bob = try NodeStore(home: NodeHome(path: root + "/bob"), limits: limits)
        let key = { PrivateKey().publicKey.hexString(compressed: true) }
        let bobAtAlice = try alice.addContact(name: "bob", publicKey: key())
        let aliceAtBob = try bob.addContact(name: "alice", publicKey: key())
        let expiry = Date().addingTimeInterval(3600)
        var figures = Figures()

        if texts > 0 {
            for index in 0..<texts { try alice.enqueueText("message \(index)", to: "bob", expiresAt: expiry) }
            let textSeconds = try await deliver(alice, bobAtAlice, bob, aliceAtBob, limits)
            (figures.texts, figures.textsSeconds) = (texts, textSeconds)
            figures.textsPerSecond = Double(texts) / textSeconds
            figures.millisecondsPerText = textSeconds * 1000 / Double(texts)
            if !json {
                print(String(format: "texts: %d delivered in %.3f s: %.0f items/s, %.2f ms per item (each committed durably)",
                             texts, textSeconds, Double(texts) / textSeconds, textSeconds * 1000 / Double(texts)))
            }
        }

        if tlsMib > 0 {
            figures.tlsBulkMiBPerSecond = try await tlsBulkMiBPerSecond()
            if !json, let bulk = figures.tlsBulkMiBPerSecond {
                print(String(format: "PSK-TLS bulk, one connection, same run: %.0f MiB/s (%d MiB)", bulk, tlsMib))
            }
        }
        let block = Data((0..<limits.blockBytes).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) })
        if fileMib > 0 {
            try await measureFile(alice, bobAtAlice, bob, aliceAtBob, limits, block, in: root, into: &figures)
        }
        if nodeMib > 0 {
            let node = try await NodeFileDelivery.measure(mib: nodeMib, block: block, timeout: nodeTimeout)
            let rate = Double(nodeMib) / node.seconds
            (figures.nodeFileMiB, figures.nodeFileSeconds, figures.nodeFileMiBPerSecond) = (nodeMib, node.seconds, rate)
            figures.nodeFileCPUSeconds = node.cpuSeconds
            figures.nodeFileToTLSRatio = figures.tlsBulkMiBPerSecond.map { rate / $0 }
            if !json {
                print(String(format: "file between two nodes (PSK-TLS, multiplexer): %d MiB delivered in %.3f s: %.0f MiB/s, %.3f CPU seconds (both nodes)",
                             nodeMib, node.seconds, rate, node.cpuSeconds))
                if let ratio = figures.nodeFileToTLSRatio { print(String(format: "file between two nodes / PSK-TLS bulk: %.2f", ratio)) }
            }
        }
        try printJSONIfAsked(figures)
    }

    /// The file figures: a file of `fileMib` MiB queued at `sender` and delivered to `receiver` over
    /// loopback TCP, and the disk's reference in the same directory `root` as the stores.
    private func measureFile(_ alice: NodeStore, _ bobAtAlice: Contact, _ bob: NodeStore, _ aliceAtBob: Contact,
                             _ limits: DeliveryLimits, _ block: Data, in root: String,
                             into figures: inout Figures) async throws {
        let expiry = Date().addingTimeInterval(3600)
        // The file a user queues is on the disk already: synced before anything is timed, so the kernel
        // does not write it back while the queue copy or the delivery runs.
        let source = root + "/payload.bin"
        _ = try Self.writeAndSync(block, bytes: fileMib << 20, to: source)
        let queueStart = ContinuousClock.now
        try alice.enqueueFile(at: source, to: "bob", expiresAt: expiry)
        let queueSeconds = (ContinuousClock.now - queueStart).seconds
        // The disk's own bound for a durable receiver, in the same run and data directory: as many bytes in
        // blocks of the same size, plain writes, one fsync. Kept until the end: deleting it now would have
        // the file system discard its blocks during the delivery.
        let diskSeconds = try Self.writeAndSync(block, bytes: fileMib << 20, to: root + "/disk-reference.bin")
        let cpuBefore = BenchSSDP.cpuSeconds()
        let fileSeconds = try await deliver(alice, bobAtAlice, bob, aliceAtBob, limits)
        figures.fileCPUSeconds = BenchSSDP.cpuSeconds() - cpuBefore
        let mib = Double(fileMib)
        (figures.diskMiBPerSecond, figures.fileToDiskRatio) = (mib / diskSeconds, diskSeconds / fileSeconds)
        (figures.fileMiB, figures.fileQueueSeconds, figures.fileQueueMiBPerSecond) = (fileMib, queueSeconds, mib / queueSeconds)
        (figures.fileSeconds, figures.fileMiBPerSecond, figures.chunkBytes) = (fileSeconds, mib / fileSeconds, limits.chunkBytes)
        figures.fileToTLSRatio = figures.tlsBulkMiBPerSecond.map { (mib / fileSeconds) / $0 }
        if !json {
            print(String(format: "file: %d MiB queued (copy + SHA-256) in %.3f s (%.0f MiB/s); delivered in %.3f s: %.0f MiB/s, chunks of %d bytes, %.3f CPU seconds",
                         fileMib, queueSeconds, mib / queueSeconds, fileSeconds, mib / fileSeconds, limits.chunkBytes,
                         figures.fileCPUSeconds ?? 0))
            if let ratio = figures.fileToTLSRatio { print(String(format: "file delivery / PSK-TLS bulk: %.2f", ratio)) }
            print(String(format: "disk, same run: %d MiB written in blocks of %d bytes and synced once in %.3f s: %.0f MiB/s; file delivery / disk: %.2f",
                         fileMib, limits.blockBytes, diskSeconds, mib / diskSeconds, diskSeconds / fileSeconds))
        }
    }

    /// Writes `bytes` bytes to a new file at `path` in `block`-sized write calls, syncs it once, and
    /// returns the seconds that took.
    static func writeAndSync(_ block: Data, bytes: Int, to path: String) throws -> Double {
        guard FileManager.default.createFile(atPath: path, contents: nil) else { throw CocoaError(.fileWriteUnknown) }
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
        defer { try? handle.close() }
        let start = ContinuousClock.now
        var left = bytes
        while left > 0 {
            try handle.write(contentsOf: left >= block.count ? block : block.prefix(left))
            left -= block.count
        }
        try handle.synchronize()
        return (ContinuousClock.now - start).seconds
    }

    /// `bench tls`'s bulk figure (one PSK-TLS connection, sender and receiver on two event loops) for
    /// `tlsMib` MiB, in MiB/s like the delivery figures.
    private func tlsBulkMiBPerSecond() async throws -> Double {
        let bench = try BenchTLS.parse(["--megabytes", String(max(1, tlsMib * 1_048_576 / 1_000_000))])
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        let bulk: Double
        do {
            bulk = try await bench.bulkThroughput(eventLoops: group).megabytesPerSecond
        } catch {
            try? await group.shutdownGracefully()
            throw error
        }
        try await group.shutdownGracefully()
        return bulk * 1_000_000 / 1_048_576
    }

    private func printJSONIfAsked(_ figures: Figures) throws {
        guard json else { return }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        print(String(decoding: try encoder.encode(figures), as: UTF8.self))
    }

    /// Runs one session from `sender` to `receiver` and returns its duration in seconds: until the
    /// receiver's session ends (after the sender's `done`, which follows its record of the last `ack`),
    /// not the sender's deletion of its delivered copies after the stream closed.
    private func deliver(_ sender: NodeStore, _ senderPeer: Contact, _ receiver: NodeStore, _ receiverPeer: Contact,
                         _ limits: DeliveryLimits) async throws -> Double {
        let quiet = Logger(label: "bench") { _ in SwiftLogNoOpLogHandler() }
        let group = MultiThreadedEventLoopGroup.singleton
        let server = try await ServerBootstrap(group: group).bind(host: "127.0.0.1", port: 0) { child in
            child.eventLoop.makeCompletedFuture { try DeliveryChannel.configureSynchronously(child, limits: limits) }
        }
        guard let port = server.channel.localAddress?.port else { throw ChannelError.unknownLocalAddress }
        let start = ContinuousClock.now
        async let received: ContinuousClock.Instant = server.executeThenClose { connections in
            for try await connection in connections {
                _ = try await DeliveryReceiver(store: receiver, authenticatedPeer: receiverPeer, limits: limits,
                                               logger: quiet).run(on: connection)
                return ContinuousClock.now
            }
            throw ChannelError.alreadyClosed
        }
        let client = try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: port) { channel in
            channel.eventLoop.makeCompletedFuture { try DeliveryChannel.configureSynchronously(channel, limits: limits) }
        }
        _ = try await DeliverySender(store: sender, authenticatedPeer: senderPeer, limits: limits, logger: quiet).run(on: client)
        return (try await received - start).seconds
    }
}
