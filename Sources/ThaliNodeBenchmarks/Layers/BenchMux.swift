import ArgumentParser
import Foundation
import NIOCore
import NIOPosix
import TCPMultiplexer

/// `thali-node bench mux`: throughput of raw loopback TCP, of one multiplexed stream, of 100 streams
/// together, stream opens per second, and hashicorp/yamux (Go) on the same machine when installed.
struct BenchMux: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "mux",
        abstract: "Measure the TCP multiplexer against raw loopback TCP and Go's yamux."
    )

    @Flag(help: "Print one JSON object instead of a table.")
    var json = false

    @Option(help: "MiB sent in each throughput run.")
    var megabytes = 512

    @Option(help: "Stream open/close round trips to time.")
    var opens = 5000

    @Option(help: "Framing to measure (yamux or thali-multiplex).")
    var framing: String = "yamux"

    @Option(help: ArgumentHelp("Measure only N concurrent streams (for profiling).", visibility: .hidden))
    var onlyStreams: Int?

    func run() async throws {
        guard let framing = MultiplexerFraming(rawValue: framing) else {
            throw ValidationError("unknown framing \(framing)")
        }
        var configuration = MultiplexerConfiguration(framing: framing)
        configuration.keepAliveInterval = nil
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        let bytes = megabytes << 20
        if let count = onlyStreams {
            let rate = try? await MuxBenchmarks.streams(group: group, configuration: configuration, count: count, bytes: bytes)
            try? await group.shutdownGracefully()
            print(String(format: "%d streams: %.1f MB/s", count, rate ?? 0))
            return
        }
        let raw: Double, one: Double, hundred: Double, opensPerSecond: Double
        let rawCPU: Double, oneCPU: Double
        do {
            var cpu = MuxBenchmarks.cpuSeconds()
            raw = try await MuxBenchmarks.rawTCP(group: group, bytes: bytes)
            rawCPU = MuxBenchmarks.cpuSeconds() - cpu
            cpu = MuxBenchmarks.cpuSeconds()
            one = try await MuxBenchmarks.streams(group: group, configuration: configuration, count: 1, bytes: bytes)
            oneCPU = MuxBenchmarks.cpuSeconds() - cpu
            hundred = try await MuxBenchmarks.streams(group: group, configuration: configuration, count: 100, bytes: bytes)
            opensPerSecond = try await MuxBenchmarks.opens(group: group, configuration: configuration, count: opens)
        } catch {
            try? await group.shutdownGracefully()
            throw error
        }
        try? await group.shutdownGracefully()
        let go = try? MuxBenchmarks.goYamux(bytes: bytes)

        if json {
            func number(_ value: Double?) -> String { value.map { String(format: "%.1f", $0) } ?? "null" }
            print("{\"raw_tcp_mb_s\": \(number(raw)), \"one_stream_mb_s\": \(number(one)), "
                  + "\"hundred_streams_mb_s\": \(number(hundred)), \"opens_per_s\": \(number(opensPerSecond)), "
                  + "\"go_yamux_mb_s\": \(number(go ?? nil))}")
        } else {
            func row(_ name: String, _ value: Double?, _ unit: String) {
                let figure = value.map { String(format: "%10.1f", $0) } ?? "       n/a"
                print(name.padding(toLength: 34, withPad: " ", startingAt: 0) + figure + " " + unit)
            }
            print("TCP multiplexer (\(framing.rawValue)), \(megabytes) MiB per run, loopback")
            row("raw loopback TCP", raw, "MB/s")
            row("one mux stream", one, "MB/s  (\(String(format: "%.0f", one / raw * 100))% of raw)")
            row("100 concurrent streams", hundred, "MB/s")
            row("stream open/close", opensPerSecond, "per s")
            row("Go hashicorp/yamux, one stream", go ?? nil, "MB/s")
            // CPU time is steadier than wall time on a shared machine.
            let gigabytes = Double(bytes) / 1e9
            row("CPU per GB, raw TCP (both ends)", rawCPU / gigabytes * 1000, "ms")
            row("CPU per GB, one mux stream", oneCPU / gigabytes * 1000, "ms")
        }
    }
}

/// The measurements behind `bench mux`.
enum MuxBenchmarks {
    /// Counts bytes and completes when the expected number arrived or the input ended.
    final class Sink: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        private var count = 0
        private let expected: Int
        private let done: EventLoopPromise<Int>?
        init(expected: Int, done: EventLoopPromise<Int>?) {
            self.expected = expected
            self.done = done
        }
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            count += unwrapInboundIn(data).readableBytes
            if count >= expected { done?.succeed(count) }
        }
        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if case ChannelEvent.inputClosed = event {
                if count < expected { done?.succeed(count) }
                context.close(promise: nil)
            }
        }
        func errorCaught(context: ChannelHandlerContext, error: Error) {
            done?.fail(error)
            context.close(promise: nil)
        }
    }

    /// What every sender writes slices of. One block for all: a block per stream made the 100-stream run
    /// allocate and zero 100 MiB inside the timed part (a tenth of its CPU time) and copy out of
    /// 100 MiB instead of one cache-warm MiB, so it measured the benchmark more than the multiplexer.
    static let payload = ByteBuffer(repeating: 0x5A, count: 1 << 20)

    /// Writes `bytes` as slices of ``payload`` (no copies), keeping at most `depth` writes in flight,
    /// the same way for raw TCP and for streams.
    static func send(_ bytes: Int, on channel: Channel, depth: Int = 4) async throws {
        let block = payload
        var inflight: [EventLoopFuture<Void>] = []
        var sent = 0
        while sent < bytes {
            let piece = block.getSlice(at: 0, length: min(block.readableBytes, bytes - sent))!
            sent += piece.readableBytes
            let promise = channel.eventLoop.makePromise(of: Void.self)
            channel.writeAndFlush(piece, promise: promise)
            inflight.append(promise.futureResult)
            if inflight.count > depth { try await inflight.removeFirst().get() }
        }
        for write in inflight { try await write.get() }
    }

    /// User plus system CPU time of this process so far, in seconds.
    static func cpuSeconds() -> Double {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        func seconds(_ time: timeval) -> Double { Double(time.tv_sec) + Double(time.tv_usec) / 1e6 }
        return seconds(usage.ru_utime) + seconds(usage.ru_stime)
    }

    static func megabytesPerSecond(_ bytes: Int, since start: ContinuousClock.Instant) -> Double {
        let elapsed = ContinuousClock.now - start
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        return Double(bytes) / 1e6 / seconds
    }

    /// The server side's and the client side's event loops: always two different threads, so every
    /// run measures the same arrangement.
    static func loops(_ group: MultiThreadedEventLoopGroup) -> (server: EventLoop, client: EventLoop) {
        var loops = group.makeIterator()
        let server = loops.next()!
        return (server, loops.next() ?? server)
    }

    static func rawTCP(group: MultiThreadedEventLoopGroup, bytes: Int) async throws -> Double {
        let (serverLoop, clientLoop) = loops(group)
        let done = serverLoop.makePromise(of: Int.self)
        let server = try await ServerBootstrap(group: serverLoop)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(Sink(expected: bytes, done: done))
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        defer { server.close(promise: nil) }
        let client = try await ClientBootstrap(group: clientLoop).connect(to: server.localAddress!).get()
        let start = ContinuousClock.now
        try await send(bytes, on: client)
        _ = try await done.futureResult.get()
        let result = megabytesPerSecond(bytes, since: start)
        try await client.close()
        return result
    }

    /// A client and a server session over loopback TCP; the server's streams run `initializer`.
    static func sessionPair(group: MultiThreadedEventLoopGroup, configuration: MultiplexerConfiguration,
                            initializer: @escaping MultiplexerHandler.StreamInitializer)
        async throws -> (MultiplexerSession, Channel) {
        let (serverLoop, clientLoop) = loops(group)
        let server = try await ServerBootstrap(group: serverLoop)
            .childChannelInitializer { channel in
                MultiplexerSession.configure(on: channel, role: .server, configuration: configuration,
                                             inboundStreamInitializer: initializer).map { _ in }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        let session = clientLoop.makePromise(of: MultiplexerSession.self)
        _ = try await ClientBootstrap(group: clientLoop)
            .channelInitializer { channel in
                // Installed before the first read, so no frame of the server is missed.
                MultiplexerSession.configure(on: channel, role: .client, configuration: configuration)
                    .map { session.succeed($0) }
            }
            .connect(to: server.localAddress!).get()
        let client = try await session.futureResult.get()
        _ = try? await client.ping().get()  // let window auto-tuning know the round-trip time
        return (client, server)
    }

    /// `count` streams sending `bytes` in total at once.
    static func streams(group: MultiThreadedEventLoopGroup, configuration: MultiplexerConfiguration, count: Int, bytes: Int)
        async throws -> Double {
        let perStream = bytes / count
        let finished = Finished(count: count, loop: group.next())
        let (session, server) = try await sessionPair(group: group, configuration: configuration) { channel in
            channel.eventLoop.makeCompletedFuture {
                try channel.syncOptions?.setOption(.allowRemoteHalfClosure, value: true)
                try channel.pipeline.syncOperations.addHandler(Sink(expected: perStream, done: finished.promise()))
            }
        }
        defer { server.close(promise: nil) }
        var streams: [Channel] = []
        for _ in 0..<count { streams.append(try await session.openStream().get()) }
        let start = ContinuousClock.now
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            for stream in streams {
                tasks.addTask {
                    try await send(perStream, on: stream)
                    try await stream.close(mode: .output).get()
                }
            }
            try await tasks.waitForAll()
        }
        try await finished.all.get()
        let result = megabytesPerSecond(perStream * count, since: start)
        try await session.close().get()
        return result
    }

    /// Open a stream, half-close it, wait until the server's FIN has closed it: `count` times.
    static func opens(group: MultiThreadedEventLoopGroup, configuration: MultiplexerConfiguration, count: Int) async throws -> Double {
        let (session, server) = try await sessionPair(group: group, configuration: configuration) { channel in
            channel.eventLoop.makeCompletedFuture {
                try channel.pipeline.syncOperations.addHandler(Sink(expected: Int.max, done: nil))
            }
        }
        defer { server.close(promise: nil) }
        let start = ContinuousClock.now
        for _ in 0..<count {
            let stream = try await session.openStream().get()
            try await stream.close(mode: .output).get()
            try await stream.closeFuture.get()
        }
        let elapsed = ContinuousClock.now - start
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        try await session.close().get()
        return Double(count) / seconds
    }

    /// Builds the Go peer of the interop tests (Tests/TCPMultiplexerTests/GoPeer) and runs its bench mode;
    /// `nil` when Go, hashicorp/yamux or the source are not there.
    static func goYamux(bytes: Int) throws -> Double? {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().path
        let candidates = [FileManager.default.currentDirectoryPath, root]
        guard let source = candidates.map({ $0 + "/Tests/TCPMultiplexerTests/GoPeer/main.go" })
            .first(where: FileManager.default.fileExists(atPath:)),
            FileManager.default.fileExists(atPath: "/usr/share/gocode/src/github.com/hashicorp/yamux")
        else { return nil }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("thali-bench-gopeer-\(getpid())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let binary = directory.appendingPathComponent("yamux-peer").path
        guard try run("/usr/bin/env", ["go", "build", "-o", binary, source],
                      environment: ["GO111MODULE": "off", "GOPATH": "/usr/share/gocode"]) != nil else { return nil }
        guard let output = try run(binary, ["bench", "-size", "\(bytes)"], environment: [:]),
              let line = output.split(separator: "\n").first(where: { $0.hasPrefix("BENCH ") })
        else { return nil }
        return Double(line.dropFirst("BENCH ".count))
    }

    /// Runs a program to its end; its output, or `nil` if it failed.
    private static func run(_ path: String, _ arguments: [String], environment: [String: String]) throws -> String? {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = arguments
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        let output = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return process.terminationStatus == 0 ? String(decoding: output, as: UTF8.self) : nil
    }

    /// Completes `all` once `count` promises handed out by `promise()` have succeeded.
    final class Finished: @unchecked Sendable {
        // Mutated only on `loop`.
        private var remaining: Int
        private let loop: EventLoop
        private let done: EventLoopPromise<Void>
        var all: EventLoopFuture<Void> { done.futureResult }

        init(count: Int, loop: EventLoop) {
            self.remaining = count
            self.loop = loop
            self.done = loop.makePromise()
        }

        func promise() -> EventLoopPromise<Int> {
            let promise = loop.makePromise(of: Int.self)
            promise.futureResult.hop(to: loop).whenComplete { result in
                switch result {
                case .success:
                    self.remaining -= 1
                    if self.remaining == 0 { self.done.succeed(()) }
                case .failure(let error):
                    self.done.fail(error)
                }
            }
            return promise
        }
    }
}
