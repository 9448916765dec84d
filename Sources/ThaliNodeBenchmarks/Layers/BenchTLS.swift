import ArgumentParser
import NIOCore
import NIOPosix
import ThaliAdmission
import ThaliPSKTLS

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// `thali-node bench tls`: PSK-TLS handshake cost and bulk throughput, client and server in this
/// process over loopback TCP.
struct BenchTLS: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tls",
        abstract: "Median CPU time per DHE-PSK handshake (ffdhe2048, ffdhe3072) and bulk throughput of one connection.")

    @Flag(help: "Print the figures as JSON (keys handshake_ms_2048, handshake_ms_3072, bulk_mb_s).")
    var json = false

    @Option(help: "Handshakes measured per DH group (after warm-up).")
    var handshakes = 40

    @Option(help: "Megabytes sent over one connection for the throughput figure.")
    var megabytes = 2048

    func run() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        let figures: (Double, Double, (megabytesPerSecond: Double, megabytesPerCPUSecond: Double))
        do {
            figures = (try await medianHandshakeCPU(group: .ffdhe2048, eventLoops: group),
                       try await medianHandshakeCPU(group: .ffdhe3072, eventLoops: group),
                       try await bulkThroughput(eventLoops: group))
        } catch {
            try? await group.shutdownGracefully()
            throw error
        }
        try await group.shutdownGracefully()
        let (handshake2048, handshake3072, bulk) = figures
        if json {
            print("{\"handshake_ms_2048\": \(rounded(handshake2048)), \"handshake_ms_3072\": \(rounded(handshake3072)), "
                + "\"bulk_mb_s\": \(rounded(bulk.megabytesPerSecond)), \"bulk_mb_per_cpu_s\": \(rounded(bulk.megabytesPerCPUSecond))}")
        } else {
            print("PSK-TLS (DHE-PSK-AES256-GCM-SHA384, TLS 1.2), client and server in one process over loopback")
            print("  handshake, ffdhe2048: \(rounded(handshake2048)) ms CPU (median of \(handshakes))")
            print("  handshake, ffdhe3072: \(rounded(handshake3072)) ms CPU (median of \(handshakes))")
            print("  bulk, one connection: \(rounded(bulk.megabytesPerSecond)) MB/s (\(megabytes) MB), "
                + "\(rounded(bulk.megabytesPerCPUSecond)) MB per CPU second (sender and receiver together)")
        }
    }

    private func rounded(_ value: Double) -> Double { (value * 100).rounded() / 100 }

    /// Process CPU time (all threads) in milliseconds.
    private static func processCPUMilliseconds() -> Double {
        var time = timespec()
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &time)
        return Double(time.tv_sec) * 1000 + Double(time.tv_nsec) / 1_000_000
    }

    /// Runs handshakes one after the other and returns the median process CPU time of one, client and
    /// server together (from connect to the client's completed handshake).
    private func medianHandshakeCPU(group dhGroup: DHGroup, eventLoops: any EventLoopGroup) async throws -> Double {
        let identity = String(repeating: "I", count: 192)
        let psk = [UInt8](repeating: 0x42, count: 16)
        // Every handshake comes from one address, faster than a stranger may connect: admit them all.
        var admission = AdmissionLimits()
        admission.maxConnectionsPerSource = handshakes + 5
        admission.maxConnectionsGlobal = handshakes + 5
        let server = try await PSKTLSServer.serve(
            host: "127.0.0.1", port: 0, configuration: PSKTLSConfiguration(dhGroup: dhGroup), admission: admission,
            eventLoopGroup: eventLoops, lookup: { $0 == identity ? psk : nil })
        let closer = Task {
            for await connection in server.connections { try? await connection.executeThenClose { _, _ in } }
        }
        let client = try PSKTLSClient(eventLoopGroup: eventLoops)
        var samples: [Double] = []
        for index in 0..<(handshakes + 5) {
            let start = Self.processCPUMilliseconds()
            let connection = try await client.connect(host: "127.0.0.1", port: server.port, identity: identity, psk: psk)
            let elapsed = Self.processCPUMilliseconds() - start
            try await connection.executeThenClose { _, _ in }
            if index >= 5 { samples.append(elapsed) }  // the first ones warm up caches and allocators
        }
        await server.close()
        await closer.value
        samples.sort()
        return samples[samples.count / 2]
    }

    /// Sends `megabytes` over one connection with large writes and returns MB/s (10^6 bytes per second)
    /// of wall time, and MB per second of process CPU time (which a busy machine disturbs less).
    func bulkThroughput(eventLoops: any EventLoopGroup) async throws -> (megabytesPerSecond: Double, megabytesPerCPUSecond: Double) {
        let identity = "bench"
        let psk = [UInt8](repeating: 0x17, count: 16)
        let total = megabytes * 1_000_000
        let serverContext = try PSKTLSContext(role: .server, configuration: PSKTLSConfiguration(dhGroup: .ffdhe2048))
        let clientContext = try PSKTLSContext(role: .client)
        // The sender on one event loop, the receiver on the other, so encryption and decryption can
        // run in parallel on two cores.
        let loops = Array(eventLoops.makeIterator())
        let senderLoop = loops[0]
        let receiverLoop = loops[loops.count > 1 ? 1 : 0]
        let done = receiverLoop.makePromise(of: Void.self)
        let reads = AdaptiveRecvByteBufferAllocator(minimum: 64 << 10, initial: 256 << 10, maximum: 1 << 20)
        let server = try await ServerBootstrap(group: senderLoop, childGroup: receiverLoop)
            .childChannelOption(.allowRemoteHalfClosure, value: true)
            .childChannelOption(.recvAllocator, value: reads)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandlers(
                        PSKTLSHandler(serverContext: serverContext, lookup: { $0 == identity ? psk : nil }),
                        CountingSink(expected: total, done: done))
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        let port = server.localAddress?.port ?? 0
        let started = senderLoop.makePromise(of: ContinuousClock.Instant.self)
        let client = try await ClientBootstrap(group: senderLoop)
            .channelOption(.recvAllocator, value: reads)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandlers(
                        PSKTLSHandler(clientContext: clientContext, identity: identity, psk: psk),
                        BulkSender(total: total, started: started))
                }
            }
            .connect(host: "127.0.0.1", port: port).get()
        let start = try await started.futureResult.get()
        let cpuStart = Self.processCPUMilliseconds()
        try await done.futureResult.get()
        let seconds = (ContinuousClock.now - start) / .seconds(1)
        let cpuSeconds = (Self.processCPUMilliseconds() - cpuStart) / 1000
        try? await client.close()
        try? await server.close()
        return (Double(total) / seconds / 1_000_000, Double(total) / cpuSeconds / 1_000_000)
    }
}

/// Writes `total` bytes in 1 MiB buffers whenever the channel is writable, starting at the handshake.
private final class BulkSender: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    private let total: Int
    private let started: EventLoopPromise<ContinuousClock.Instant>
    private var sent = 0
    private var running = false
    private let chunk = ByteBuffer(repeating: 0xAB, count: 1 << 20)

    init(total: Int, started: EventLoopPromise<ContinuousClock.Instant>) {
        self.total = total
        self.started = started
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case .handshakeCompleted = event as? PSKTLSEvent {
            running = true
            started.succeed(.now)
            pump(context: context)
        }
        context.fireUserInboundEventTriggered(event)
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if running { pump(context: context) }
        context.fireChannelWritabilityChanged()
    }

    private func pump(context: ChannelHandlerContext) {
        while sent < total && context.channel.isWritable {
            let size = min(chunk.readableBytes, total - sent)
            sent += size
            context.writeAndFlush(wrapOutboundOut(chunk.getSlice(at: 0, length: size)!), promise: nil)
        }
        if sent >= total { running = false }
    }
}

/// Counts plaintext bytes and completes `done` when `expected` arrived.
private final class CountingSink: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    private let expected: Int
    private let done: EventLoopPromise<Void>
    private var received = 0
    private var finished = false

    init(expected: Int, done: EventLoopPromise<Void>) {
        self.expected = expected
        self.done = done
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        received += unwrapInboundIn(data).readableBytes
        if received >= expected && !finished {
            finished = true
            done.succeed(())
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if !finished {
            finished = true
            done.fail(error)
        }
        context.close(promise: nil)
    }
}
