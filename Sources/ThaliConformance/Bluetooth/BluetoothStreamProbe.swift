import NIOConcurrencyHelpers
import NIOCore
import TCPMultiplexer
import ThaliBLEBinding
import ThaliBeacons

/// The first octet a stream answered with.
enum BluetoothFirstOctet: Equatable, Sendable {
    /// This octet came first.
    case octet(UInt8)
    /// The stream ended before any octet.
    case closed
    /// Nothing came, and the stream stayed open, for the whole wait.
    case timedOut
}

/// One Bluetooth stream to the implementation: what it sent first, and when it closed. Bytes after the
/// first octet are held until the stream is handed to a multiplexer, which then reads them first.
final class BluetoothStreamProbe: Sendable {
    let channel: any Channel
    private let firstOctet: EventLoopFuture<UInt8?>

    private init(channel: any Channel, firstOctet: EventLoopFuture<UInt8?>) {
        self.channel = channel
        self.firstOctet = firstOctet
    }

    static func start(_ socket: BluetoothSocket, on loop: any EventLoop, maxBytes: Int) async throws -> BluetoothStreamProbe {
        let promise = loop.makePromise(of: UInt8?.self)
        let channel = try await socket.makeChannel(on: loop) { channel in
            channel.eventLoop.makeCompletedFuture {
                try channel.pipeline.syncOperations.addHandler(BluetoothProbeHandler(firstOctet: promise, maxBytes: maxBytes))
            }
        }
        return BluetoothStreamProbe(channel: channel, firstOctet: promise.futureResult)
    }

    func send(_ bytes: [UInt8]) {
        channel.writeAndFlush(channel.allocator.buffer(bytes: bytes), promise: nil)
    }

    /// The first octet, the end of the stream, or `.timedOut` after `timeout`.
    func firstOctet(within timeout: TimeAmount) async -> BluetoothFirstOctet {
        let promise = channel.eventLoop.makePromise(of: BluetoothFirstOctet.self)
        firstOctet.whenSuccess { promise.succeed($0.map(BluetoothFirstOctet.octet) ?? .closed) }
        let timer = channel.eventLoop.scheduleTask(in: timeout) { promise.succeed(.timedOut) }
        defer { timer.cancel() }
        return (try? await promise.futureResult.get()) ?? .closed
    }

    /// Whether the stream closed within `timeout`.
    func closed(within timeout: TimeAmount) async -> Bool {
        await channel.closeFuture.ended(within: timeout)
    }

    /// Hands the stream to a yamux client session (the bytes held come first); `inbound` sets up the
    /// streams the implementation opens (nil: refused).
    func startMultiplexer(inbound: MultiplexerHandler.StreamInitializer?) async throws -> MultiplexerSession {
        let channel = self.channel
        return try await channel.eventLoop.flatSubmit {
            MultiplexerSession.configure(on: channel, role: .client, configuration: .beforeAuthentication,
                                         inboundStreamInitializer: inbound).flatMap { session in
                do {
                    let probe = try channel.pipeline.syncOperations.handler(type: BluetoothProbeHandler.self)
                    return channel.pipeline.syncOperations.removeHandler(probe).map { session }
                } catch {
                    return channel.eventLoop.makeFailedFuture(error)
                }
            }
        }.get()
    }

    func close() async { try? await channel.close() }
}

extension EventLoopFuture where Value == Void {
    /// Whether the future completed (either way) within `timeout`.
    func ended(within timeout: TimeAmount) async -> Bool {
        let promise = eventLoop.makePromise(of: Bool.self)
        whenComplete { _ in promise.succeed(true) }
        let timer = eventLoop.scheduleTask(in: timeout) { promise.succeed(false) }
        defer { timer.cancel() }
        return (try? await promise.futureResult.get()) ?? false
    }
}

/// Notes the first octet of a raw Bluetooth stream and holds the rest (bounded) until removed; only
/// moves bytes.
final class BluetoothProbeHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    private let firstOctet: EventLoopPromise<UInt8?>
    private let maxBytes: Int
    private var held = ByteBuffer()
    private var sawFirst = false

    init(firstOctet: EventLoopPromise<UInt8?>, maxBytes: Int) {
        self.firstOctet = firstOctet
        self.maxBytes = maxBytes
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var bytes = unwrapInboundIn(data)
        if !sawFirst, let octet = bytes.readInteger(as: UInt8.self) {
            sawFirst = true
            firstOctet.succeed(octet)
        }
        guard held.readableBytes + bytes.readableBytes <= maxBytes else {
            context.close(promise: nil)
            return
        }
        held.writeBuffer(&bytes)
    }

    func channelInactive(context: ChannelHandlerContext) {
        firstOctet.succeed(nil)
        context.fireChannelInactive()
    }

    func removeHandler(context: ChannelHandlerContext, removalToken: ChannelHandlerContext.RemovalToken) {
        context.leavePipeline(handingOn: &held, removalToken: removalToken)
    }
}

/// A yamux stream the suite opened: what came back (bounded) and when it ended.
final class BluetoothStreamTranscript: Sendable {
    /// The beacon request a node answers over TCP, asking it to close after its answer.
    static let beaconRequest = Array(
        "GET /NotificationBeacons HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nAccept: application/octet-stream\r\n\r\n".utf8)

    private let channel: any Channel
    private let bytes: NIOLockedValueBox<[UInt8]>

    private init(channel: any Channel, bytes: NIOLockedValueBox<[UInt8]>) {
        self.channel = channel
        self.bytes = bytes
    }

    /// Opens a stream on `session` and sends `request` on it.
    static func open(on session: MultiplexerSession, sending request: [UInt8], maxBytes: Int) async throws -> BluetoothStreamTranscript {
        let bytes = NIOLockedValueBox<[UInt8]>([])
        let channel = try await session.openStream { stream in
            stream.eventLoop.makeCompletedFuture {
                try stream.pipeline.syncOperations.addHandler(BluetoothTranscriptHandler(bytes: bytes, maxBytes: maxBytes))
            }
        }.get()
        if !request.isEmpty { try await channel.writeAndFlush(channel.allocator.buffer(bytes: request)) }
        return BluetoothStreamTranscript(channel: channel, bytes: bytes)
    }

    /// Everything received so far.
    var received: [UInt8] { bytes.withLockedValue { $0 } }

    /// Sends FIN: our end of the stream is done.
    func closeOutput() { channel.close(mode: .output, promise: nil) }

    /// Whether the implementation ended the stream within `timeout`.
    func ended(within timeout: TimeAmount) async -> Bool { await channel.closeFuture.ended(within: timeout) }

    /// The first line of `bytes` (up to CR or LF), at most 80 bytes of it.
    static func firstLine(_ bytes: some Collection<UInt8>) -> String? {
        bytes.split(maxSplits: 1, whereSeparator: { $0 == 0x0D || $0 == 0x0A }).first.map { String(decoding: $0.prefix(80), as: UTF8.self) }
    }

    /// Whether `answer` holds an HTTP head and, when it names a Content-Length, that many body bytes.
    static func isCompleteResponse(_ answer: [UInt8]) -> Bool {
        let separator = Array("\r\n\r\n".utf8)
        guard let end = answer.firstRange(of: separator)?.upperBound else { return false }
        let head = String(decoding: answer[..<end], as: UTF8.self).lowercased()
        guard let line = head.split(separator: "\r\n").first(where: { $0.hasPrefix("content-length:") }) else { return true }
        guard let length = Int(line.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces)) else { return false }
        return answer.count - end == length
    }
}

/// Collects a stream's bytes (closing it past `maxBytes`); only moves bytes.
private final class BluetoothTranscriptHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    private let bytes: NIOLockedValueBox<[UInt8]>
    private let maxBytes: Int

    init(bytes: NIOLockedValueBox<[UInt8]>, maxBytes: Int) {
        self.bytes = bytes
        self.maxBytes = maxBytes
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        let overflow = bytes.withLockedValue { stored -> Bool in
            guard stored.count + buffer.readableBytes <= maxBytes else { return true }
            stored += buffer.readableBytesView
            return false
        }
        if overflow { context.close(promise: nil) }
    }
}

/// The request lines of the streams the implementation opened to us, the first one awaited.
final class BluetoothBeaconRequests: Sendable {
    private let first: EventLoopPromise<String>

    init(loop: any EventLoop) { first = loop.makePromise() }

    func arrived(_ line: String) { first.succeed(line) }

    /// The first request line, or nil after `timeout`.
    func first(within timeout: TimeAmount) async -> String? {
        let promise = first.futureResult.eventLoop.makePromise(of: String?.self)
        first.futureResult.whenSuccess { promise.succeed($0) }
        let timer = promise.futureResult.eventLoop.scheduleTask(in: timeout) { promise.succeed(nil) }
        defer { timer.cancel() }
        return (try? await promise.futureResult.get()) ?? nil
    }
}

/// Serves a stream the implementation opened as a beacon location: reads a request head (bounded),
/// reports its request line, answers a beacon GET with `body` and closes; only moves bytes.
final class BluetoothBeaconServerHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    private let body: [UInt8]
    private let maxBytes: Int
    private let requests: BluetoothBeaconRequests
    private var head: [UInt8] = []
    private var done = false

    init(body: [UInt8], maxBytes: Int, requests: BluetoothBeaconRequests) {
        self.body = body
        self.maxBytes = maxBytes
        self.requests = requests
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !done else { return }
        head += unwrapInboundIn(data).readableBytesView
        guard let end = head.firstRange(of: Array("\r\n\r\n".utf8)) else {
            if head.count > maxBytes {
                done = true
                context.close(promise: nil)
            }
            return
        }
        done = true
        let line = BluetoothStreamTranscript.firstLine(head[..<end.lowerBound]) ?? ""
        requests.arrived(line)
        var response: ByteBuffer
        if line.hasPrefix("GET /NotificationBeacons ") {
            response = context.channel.allocator.buffer(
                string: "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: \(body.count)\r\nConnection: close\r\n\r\n")
            response.writeBytes(body)
        } else {
            response = context.channel.allocator.buffer(string: "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        }
        context.writeAndFlush(wrapOutboundOut(response), promise: nil)
        // FIN after the answer: the requester reads to the end, as from a `Connection: close` server.
        context.close(mode: .output, promise: nil)
    }
}
