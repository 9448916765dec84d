import Foundation
import NIOCore
import NIOEmbedded
import Testing
@testable import TCPMultiplexer

/// Records what a stream channel's pipeline sees. Used from one event loop at a time.
final class StreamRecorder: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = ByteBuffer

    private let lock = NSLock()
    private var _received: [UInt8] = []
    private var _errors: [Error] = []
    private var _inputClosed = false
    private var _inactive = false

    var received: [UInt8] { lock.withLock { _received } }
    var receivedString: String { String(decoding: received, as: UTF8.self) }
    var errors: [Error] { lock.withLock { _errors } }
    var inputClosed: Bool { lock.withLock { _inputClosed } }
    var inactive: Bool { lock.withLock { _inactive } }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        lock.withLock { _received += buffer.readableBytesView }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case ChannelEvent.inputClosed = event { lock.withLock { _inputClosed = true } }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        lock.withLock { _errors.append(error) }
    }

    func channelInactive(context: ChannelHandlerContext) {
        lock.withLock { _inactive = true }
    }
}

/// Streams the peer opened, in order, with their recorders.
final class AcceptedStreams: @unchecked Sendable {
    private let lock = NSLock()
    private var _streams: [(channel: Channel, recorder: StreamRecorder)] = []
    let halfClosure: Bool
    let autoRead: Bool

    init(halfClosure: Bool = false, autoRead: Bool = true) {
        self.halfClosure = halfClosure
        self.autoRead = autoRead
    }

    var all: [(channel: Channel, recorder: StreamRecorder)] { lock.withLock { _streams } }
    var count: Int { lock.withLock { _streams.count } }

    /// The last accepted stream the peer opened with `name`; the test fails if there is none.
    func stream(named name: String) throws -> (channel: Channel, recorder: StreamRecorder) {
        let match = all.last { ($0.channel as? MultiplexerStreamChannel)?.name == name }
        return try #require(match, "no accepted stream named \(name); accepted: \(count)")
    }

    var initializer: MultiplexerHandler.StreamInitializer {
        { channel in
            channel.eventLoop.makeCompletedFuture {
                let recorder = StreamRecorder()
                try channel.syncOptions?.setOption(.allowRemoteHalfClosure, value: self.halfClosure)
                try channel.syncOptions?.setOption(.autoRead, value: self.autoRead)
                try channel.pipeline.syncOperations.addHandler(recorder)
                self.lock.withLock { self._streams.append((channel, recorder)) }
            }
        }
    }
}

/// A recorder-equipped stream initializer for locally opened streams.
func recordingInitializer(_ recorder: StreamRecorder, halfClosure: Bool = true) -> MultiplexerHandler.StreamInitializer {
    { channel in
        channel.eventLoop.makeCompletedFuture {
            try channel.syncOptions?.setOption(.allowRemoteHalfClosure, value: halfClosure)
            try channel.pipeline.syncOperations.addHandler(recorder)
        }
    }
}

extension EmbeddedChannel {
    /// Everything written to the channel so far, joined.
    func drainOutbound() throws -> ByteBuffer {
        var joined = ByteBuffer()
        while var buffer = try readOutbound(as: ByteBuffer.self) { joined.writeBuffer(&buffer) }
        return joined
    }

    /// An active embedded channel with a session on it.
    static func withSession(role: MultiplexerRole, configuration: MultiplexerConfiguration,
                            initializer: MultiplexerHandler.StreamInitializer?) throws -> (EmbeddedChannel, MultiplexerSession) {
        let channel = EmbeddedChannel()
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        let session = try MultiplexerSession.configure(on: channel, role: role, configuration: configuration,
                                                       inboundStreamInitializer: initializer).wait()
        return (channel, session)
    }
}

/// A yamux frame as bytes.
func yamux(_ type: YamuxHeader.FrameType, _ flags: YamuxHeader.Flags = [], id: UInt32, length: UInt32,
           payload: [UInt8] = []) -> ByteBuffer {
    var buffer = ByteBuffer()
    YamuxHeader(type: type, flags: flags, streamID: id, length: length).write(to: &buffer)
    buffer.writeBytes(payload)
    return buffer
}

/// Test configuration: no timers, so embedded channels see only the frames a test causes.
func quietConfiguration(_ framing: MultiplexerFraming) -> MultiplexerConfiguration {
    var configuration = MultiplexerConfiguration(framing: framing)
    configuration.keepAliveInterval = nil
    return configuration
}

/// Deterministic pseudo-random bytes (xorshift), so large transfers can be checked without storing them twice.
struct PatternGenerator {
    private var state: UInt64
    init(seed: UInt64) { state = seed | 1 }
    mutating func next() -> UInt64 {
        state ^= state << 13
        state ^= state >> 7
        state ^= state << 17
        return state
    }
    mutating func fill(_ buffer: inout ByteBuffer, count: Int) {
        var remaining = count
        while remaining >= 8 { buffer.writeInteger(next()); remaining -= 8 }
        while remaining > 0 { buffer.writeInteger(UInt8(truncatingIfNeeded: next())); remaining -= 1 }
    }
}

/// A client and a server session on two embedded channels; ``pump()`` carries each side's bytes to the
/// other. No socket, no thread: flow control end to end, with time moved by the test.
final class EmbeddedSessionPair {
    let client = EmbeddedChannel()
    let server = EmbeddedChannel()
    let clientSession: MultiplexerSession
    let serverSession: MultiplexerSession
    private let acceptedBox = AcceptedChannels()

    /// Streams the server accepted, in order.
    var accepted: [Channel] { acceptedBox.channels }

    final class AcceptedChannels: @unchecked Sendable { var channels: [Channel] = [] }

    init(_ configuration: MultiplexerConfiguration, serverInitializer: @escaping MultiplexerHandler.StreamInitializer) throws {
        let box = acceptedBox
        try client.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        try server.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 2)).wait()
        clientSession = try MultiplexerSession.configure(on: client, role: .client, configuration: configuration).wait()
        serverSession = try MultiplexerSession.configure(on: server, role: .server, configuration: configuration,
                                                         inboundStreamInitializer: { channel in
                                                             box.channels.append(channel)
                                                             return serverInitializer(channel)
                                                         }).wait()
    }

    /// Moves bytes both ways until neither side has anything more to send.
    func pump() throws {
        var moved = true
        while moved {
            moved = false
            for (from, to) in [(client, server), (server, client)] {
                let bytes = try from.drainOutbound()
                guard bytes.readableBytes > 0, to.isActive else { continue }
                try to.writeInbound(bytes)
                moved = true
            }
        }
    }

    /// Moves both sides' clocks forward.
    func advanceTime(by amount: TimeAmount) {
        client.embeddedEventLoop.advanceTime(by: amount)
        server.embeddedEventLoop.advanceTime(by: amount)
    }
}
