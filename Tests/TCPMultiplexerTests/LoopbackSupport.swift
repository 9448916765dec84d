import Crypto
import Foundation
import NIOCore
import NIOPosix
import Testing
import ThaliTestSupport
@testable import TCPMultiplexer

/// One event loop group for the tests that use real sockets.
let testGroup = MultiThreadedEventLoopGroup(numberOfThreads: 2)

/// Echoes what it reads and half-closes when the peer has.
final class EchoHandler: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        context.write(data, promise: nil)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        context.flush()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case ChannelEvent.inputClosed = event {
            context.close(mode: .output, promise: nil)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        context.close(promise: nil)
    }

    /// A stream/connection initializer that installs an echo (with half-closure on).
    static let initializer: MultiplexerHandler.StreamInitializer = { channel in
        channel.eventLoop.makeCompletedFuture {
            try channel.syncOptions?.setOption(.allowRemoteHalfClosure, value: true)
            try channel.pipeline.syncOperations.addHandler(EchoHandler())
        }
    }
}

/// What a digest collector saw by the end of its input.
struct Received: Sendable, Equatable {
    var count: Int
    /// SHA-256 of the bytes, as bytes (the digest type is not Sendable).
    var digest: [UInt8]
    init(count: Int, digest: SHA256.Digest) {
        self.count = count
        self.digest = Array(digest)
    }
}

/// Hashes everything read and completes when the input ends (or fails when the channel fails). A
/// NIO socket whose output is already shut down reports the peer's EOF by closing, not with
/// `inputClosed`, so the channel's end also completes it.
final class DigestCollector: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer

    private var hasher = SHA256()
    private var count = 0
    private var completed = false
    let promise: EventLoopPromise<Received>

    init(promise: EventLoopPromise<Received>) { self.promise = promise }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        count += buffer.readableBytes
        buffer.withUnsafeReadableBytes { hasher.update(bufferPointer: $0) }
    }

    private func complete(_ result: Result<Received, Error>) {
        guard !completed else { return }
        completed = true
        promise.completeWith(result)
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case ChannelEvent.inputClosed = event {
            complete(.success(Received(count: count, digest: hasher.finalize())))
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        complete(.failure(error))
    }

    func channelInactive(context: ChannelHandlerContext) {
        complete(.success(Received(count: count, digest: hasher.finalize())))
    }
}

/// `count` bytes of random data, and its digest.
func randomPayload(_ count: Int) -> (ByteBuffer, SHA256.Digest) {
    var generator = SystemRandomNumberGenerator()
    var block = ByteBuffer()
    block.reserveCapacity(min(count, 1 << 20))
    for _ in 0..<(min(count, 1 << 20) + 7) / 8 { block.writeInteger(generator.next() as UInt64) }
    var payload = ByteBuffer()
    payload.reserveCapacity(count)
    var index: UInt64 = 0
    while payload.readableBytes < count {
        // Each MiB differs: its index is written over the first 8 bytes.
        var piece = block.getSlice(at: 0, length: min(block.readableBytes, count - payload.readableBytes))!
        if piece.readableBytes >= 8 { piece.setInteger(index, at: piece.readerIndex) }
        payload.writeBuffer(&piece)
        index += 1
    }
    let digest = payload.withUnsafeReadableBytes { SHA256.hash(data: $0) }
    return (payload, digest)
}

/// Sends `payload` on `channel`, half-closes, and completes with what came back.
func exchange(on channel: Channel, payload: ByteBuffer, collector: EventLoopFuture<Received>) async throws -> Received {
    try await channel.writeAndFlush(payload).get()
    try await channel.close(mode: .output).get()
    return try await collector.get()
}

/// Opens a stream with a digest collector on it.
func openCollectingStream(_ session: MultiplexerSession) async throws -> (Channel, EventLoopFuture<Received>) {
    let promise = session.channel.eventLoop.makePromise(of: Received.self)
    let stream = try await session.openStream { channel in
        channel.eventLoop.makeCompletedFuture {
            try channel.syncOptions?.setOption(.allowRemoteHalfClosure, value: true)
            try channel.pipeline.syncOperations.addHandler(DigestCollector(promise: promise))
        }
    }.get()
    return (stream, promise.futureResult)
}

/// Connects a TCP client with `initializer` to 127.0.0.1:`port`.
func connect(port: Int, _ initializer: @escaping @Sendable (Channel) -> EventLoopFuture<Void>) async throws -> Channel {
    try await ClientBootstrap(group: testGroup)
        .channelOption(.allowRemoteHalfClosure, value: true)
        .channelInitializer(initializer)
        .connect(host: "127.0.0.1", port: port).get()
}

/// A TCP listener on 127.0.0.1, port 0.
func listen(_ initializer: @escaping @Sendable (Channel) -> EventLoopFuture<Void>) async throws -> Channel {
    try await ServerBootstrap(group: testGroup)
        .childChannelOption(.allowRemoteHalfClosure, value: true)
        .childChannelInitializer(initializer)
        .bind(host: "127.0.0.1", port: 0).get()
}

/// A session pair over a real loopback TCP connection.
func sessionPair(_ configuration: MultiplexerConfiguration, serverInitializer: MultiplexerHandler.StreamInitializer?)
    async throws -> (client: MultiplexerSession, server: MultiplexerSession, listener: Channel) {
    let serverSession = testGroup.next().makePromise(of: MultiplexerSession.self)
    let listener = try await listen { channel in
        MultiplexerSession.configure(on: channel, role: .server, configuration: configuration,
                                     inboundStreamInitializer: serverInitializer).map {
            serverSession.succeed($0)
        }
    }
    let port = try #require(listener.localAddress?.port)
    let client = try await connectSession(port: port, configuration: configuration)
    return (client, try await serverSession.futureResult.get(), listener)
}

/// Connects to 127.0.0.1:`port` with a client session installed before the first byte is read.
func connectSession(port: Int, configuration: MultiplexerConfiguration = MultiplexerConfiguration(),
                    initializer: MultiplexerHandler.StreamInitializer? = nil) async throws -> MultiplexerSession {
    let session = testGroup.next().makePromise(of: MultiplexerSession.self)
    _ = try await connect(port: port) { channel in
        MultiplexerSession.configure(on: channel, role: .client, configuration: configuration,
                                     inboundStreamInitializer: initializer).map { session.succeed($0) }
    }
    return try await session.futureResult.get()
}

/// Where the Go peer was built, removed when the test process exits.
nonisolated(unsafe) private var builtDirectory: String?

/// The Go hashicorp/yamux peer program in GoPeer/, built once per test run into a temporary directory.
enum GoPeer {
    static let yamuxSource = "/usr/share/gocode/src/github.com/hashicorp/yamux"

    /// Whether Go and the yamux package are installed.
    static var available: Bool {
        ChildProcess.which("go") != nil && FileManager.default.fileExists(atPath: yamuxSource)
    }

    private static let built = BuildOnce()

    /// The built binary's path.
    static func binary() async throws -> String { try await built.path() }

    private actor BuildOnce {
        private var result: String?
        func path() async throws -> String {
            if let result { return result }
            let directory = FileManager.default.temporaryDirectory
                .appendingPathComponent("thali-mux-gopeer-\(getpid())").path
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            let output = directory + "/yamux-peer"
            let source = PackagePaths.root() + "/Tests/TCPMultiplexerTests/GoPeer/main.go"
            let build = try ChildProcess("go", ["build", "-o", output, source],
                                         environment: ["GO111MODULE": "off", "GOPATH": "/usr/share/gocode"])
            let status = try await build.waitForExit(timeout: .seconds(180))
            guard status == 0 else { throw GoBuildFailed(output: build.output) }
            result = output
            builtDirectory = directory
            atexit { if let directory = builtDirectory { try? FileManager.default.removeItem(atPath: directory) } }
            return output
        }
    }

    struct GoBuildFailed: Error, CustomStringConvertible {
        var output: String
        var description: String { "go build failed:\n\(output)" }
    }

    /// Starts `yamux-peer serve` and returns it with the port it listens on.
    static func serve(_ arguments: [String] = []) async throws -> (ChildProcess, Int) {
        let peer = try ChildProcess(try await binary(), ["serve"] + arguments)
        try await peer.waitForOutput(containing: "LISTENING ")
        let line = try #require(peer.output.split(separator: "\n").first { $0.hasPrefix("LISTENING ") })
        return (peer, try #require(Int(line.dropFirst("LISTENING ".count))))
    }
}
