import Crypto
import NIOCore
import NIOEmbedded
import NIOPosix
import Testing
import ThaliTestSupport
@testable import TCPMultiplexer

/// Counts what it reads and completes at the end of the input.
final class Counter: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    var count = 0
    let done: EventLoopPromise<Int>
    init(done: EventLoopPromise<Int>) { self.done = done }
    func channelRead(context: ChannelHandlerContext, data: NIOAny) { count += unwrapInboundIn(data).readableBytes }
    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case ChannelEvent.inputClosed = event { done.succeed(count) }
    }
    func errorCaught(context: ChannelHandlerContext, error: Error) { done.fail(error) }
}

/// Two of our sessions on embedded channels, joined by ``EmbeddedSessionPair/pump()``: per-stream flow
/// An inbound stream initializer for the stalled-reader tests: the first stream the peer opens never
/// reads; every later one counts what it receives into `done`.
func stalledThenCounting(_ done: EventLoopPromise<Int>) -> MultiplexerHandler.StreamInitializer {
    let order = ManagedCounter()
    return { channel in
        channel.eventLoop.makeCompletedFuture {
            try channel.syncOptions?.setOption(.allowRemoteHalfClosure, value: true)
            if order.next() == 0 {
                try channel.syncOptions?.setOption(.autoRead, value: false)
            } else {
                try channel.pipeline.syncOperations.addHandler(Counter(done: done))
            }
        }
    }
}

/// control end to end with no socket, on the embedded loops' clocks.
@Suite(.timeLimit(.minutes(2))) struct FlowControlTests {
    @Test func aStalledReaderDoesNotBlockTheOtherStreamNorGrowMemory() throws {
        // The server's first stream never reads; the second counts everything.
        let fastDone = EmbeddedEventLoop().makePromise(of: Int.self)
        let pair = try EmbeddedSessionPair(quietConfiguration(.yamux), serverInitializer: stalledThenCounting(fastDone))
        let slow = try pair.clientSession.openStream().wait()
        try pair.pump()
        let slowWrite = slow.writeAndFlush(ByteBuffer(repeating: 1, count: 2 << 20))
        let fast = try pair.clientSession.openStream().wait()
        let fastBytes = 8 << 20
        fast.writeAndFlush(ByteBuffer(repeating: 2, count: fastBytes), promise: nil)
        fast.close(mode: .output, promise: nil)
        try pair.pump()
        #expect(try fastDone.futureResult.wait() == fastBytes)

        // The stalled stream holds exactly its first window on the server and was never granted more.
        let serverMetrics = try pair.serverSession.metrics().wait()
        let stalled = try #require(serverMetrics.streams.first { $0.streamID == slow.multiplexerStreamID })
        #expect(stalled.bufferedReceiveBytes == YamuxHeader.initialWindowSize)
        #expect(stalled.receiveWindow == YamuxHeader.initialWindowSize)
        #expect(serverMetrics.bufferedReceiveBytes == YamuxHeader.initialWindowSize)
        // The client keeps the rest queued, with no send window and its channel not writable.
        let clientMetrics = try pair.clientSession.metrics().wait()
        let sender = try #require(clientMetrics.streams.first { $0.streamID == slow.multiplexerStreamID })
        #expect(sender.sendWindow == 0)
        #expect(sender.queuedSendBytes == (2 << 20) - YamuxHeader.initialWindowSize)
        #expect(!slow.isWritable)
        // Reading the stalled stream releases the sender.
        let stalledChannel = try #require(pair.accepted.first)
        try stalledChannel.setOption(.autoRead, value: true).wait()
        try pair.pump()
        try slowWrite.wait()
        #expect(slow.isWritable)
        try pair.clientSession.close().wait()
    }

    /// A session pair whose server streams count what they receive into `done`; the start pings have
    /// come back 1 ms later, so both sides know the round-trip time.
    static func countingPair(_ configuration: MultiplexerConfiguration, done: EventLoopPromise<Int>) throws -> EmbeddedSessionPair {
        let pair = try EmbeddedSessionPair(configuration) { channel in
            channel.eventLoop.makeCompletedFuture {
                try channel.syncOptions?.setOption(.allowRemoteHalfClosure, value: true)
                try channel.pipeline.syncOperations.addHandler(Counter(done: done))
            }
        }
        pair.advanceTime(by: .milliseconds(1))
        try pair.pump()
        return pair
    }

    @Test func windowsGrowWhileTheReaderKeepsUpAndStayUnderTheCap() throws {
        var configuration = quietConfiguration(.yamux)
        configuration.maxStreamWindowSize = 1 << 20
        let done = EmbeddedEventLoop().makePromise(of: Int.self)
        let pair = try Self.countingPair(configuration, done: done)
        let stream = try pair.clientSession.openStream().wait()
        stream.writeAndFlush(ByteBuffer(repeating: 3, count: 8 << 20), promise: nil)
        stream.close(mode: .output, promise: nil)
        // No time passes while the bytes move: every window turns over within a round trip, so it doubles
        // up to the cap and no further.
        try pair.pump()
        #expect(try done.futureResult.wait() == 8 << 20)
        let metrics = try pair.serverSession.metrics().wait()
        #expect(metrics.windowGrowths == 2)
        #expect(metrics.streams.map(\.receiveWindow) == [1 << 20])
        try pair.clientSession.close().wait()
    }

    @Test func aSlowReaderKeepsTheInitialWindow() throws {
        let done = EmbeddedEventLoop().makePromise(of: Int.self)
        let pair = try Self.countingPair(quietConfiguration(.yamux), done: done)
        let stream = try pair.clientSession.openStream().wait()
        try pair.pump()
        for _ in 0..<16 {
            // Each window takes longer than four round trips to turn over.
            pair.advanceTime(by: .milliseconds(5))
            try stream.writeAndFlush(ByteBuffer(repeating: 4, count: 128 << 10)).wait()
            try pair.pump()
        }
        stream.close(mode: .output, promise: nil)
        try pair.pump()
        #expect(try done.futureResult.wait() == 16 * 128 << 10)
        let metrics = try pair.serverSession.metrics().wait()
        #expect(metrics.windowGrowths == 0)
        #expect(metrics.windowUpdatesSent == 16)  // each 128 KiB read is half the window
        #expect(metrics.streams.map(\.receiveWindow) == [YamuxHeader.initialWindowSize])
    }

    @Test func thaliMultiplexResetsAStreamWhoseBufferOverflows() throws {
        var configuration = quietConfiguration(.thaliMultiplex)
        configuration.maxStreamReceiveBuffer = 1000
        let accepted = AcceptedStreams(autoRead: false)
        let (channel, session) = try EmbeddedChannel.withSession(role: .server, configuration: configuration,
                                                                 initializer: accepted.initializer)
        var wire = ByteBuffer()
        ThaliMultiplexHeader(streamID: 3, flag: .open, length: 0).write(to: &wire)
        ThaliMultiplexHeader(streamID: 3, flag: .messageInitiator, length: 600).write(to: &wire)
        wire.writeRepeatingByte(1, count: 600)
        ThaliMultiplexHeader(streamID: 3, flag: .messageInitiator, length: 600).write(to: &wire)
        wire.writeRepeatingByte(2, count: 600)
        try channel.writeInbound(wire)
        let stream = try #require(accepted.all.first)
        #expect(stream.recorder.errors.compactMap { $0 as? MultiplexerError }
                == [.receiveBufferOverflow(streamID: 3, limit: 1000)])
        var reset = ByteBuffer()
        ThaliMultiplexHeader(streamID: 3, flag: .resetReceiver, length: 23).write(to: &reset)
        reset.writeString("receive buffer overflow")
        #expect(hex(try channel.drainOutbound()) == hex(reset))
        let metrics = try session.metrics().wait()
        #expect(metrics.overflowResets == 1 && metrics.bufferedReceiveBytes == 0 && metrics.openStreams == 0)
        #expect(channel.isActive)  // the session survives; only the stream is gone
    }
}

/// The same stalled reader over a real loopback TCP connection: the session also respects the
/// underlying socket's writability (``MultiplexerConfiguration/underlyingWriteBufferWaterMark``).
@Suite(.serialized, .timeLimit(.minutes(2))) struct LoopbackFlowControlTests {
    @Test func aStalledReaderDoesNotBlockTheOtherStreamOverTCP() async throws {
        let fastDone = testGroup.next().makePromise(of: Int.self)
        let (client, server, listener) = try await sessionPair(MultiplexerConfiguration(),
                                                               serverInitializer: stalledThenCounting(fastDone))
        defer { listener.close(promise: nil) }
        let slow = try await client.openStream().get()
        // Wait until the server has taken the slow stream, so the order is certain.
        try #require(try await waitUntil(timeout: .seconds(10), every: .milliseconds(5)) {
            try await server.metrics().get().streamsAccepted >= 1
        })
        let slowWrite = slow.eventLoop.makePromise(of: Void.self)
        slow.writeAndFlush(ByteBuffer(repeating: 1, count: 8 << 20), promise: slowWrite)
        let fast = try await client.openStream().get()
        let fastBytes = 64 << 20
        try await fast.writeAndFlush(ByteBuffer(repeating: 2, count: fastBytes)).get()
        try await fast.close(mode: .output).get()
        #expect(try await fastDone.futureResult.get() == fastBytes)
        let serverMetrics = try await server.metrics().get()
        #expect(serverMetrics.bufferedReceiveBytes == YamuxHeader.initialWindowSize)
        let clientMetrics = try await client.metrics().get()
        let sender = try #require(clientMetrics.streams.first { $0.streamID == slow.multiplexerStreamID })
        #expect(sender.sendWindow == 0)
        try await client.close().get()
        await #expect(throws: (any Error).self) { try await slowWrite.futureResult.get() }
    }
}

/// A counter shared with `@Sendable` initializers (they run on one event loop).
final class ManagedCounter: @unchecked Sendable {
    private var value = 0
    func next() -> Int { defer { value += 1 }; return value }
}

extension Channel {
    /// The stream id of a multiplexer stream channel.
    var multiplexerStreamID: UInt64? { (self as? MultiplexerStreamChannel)?.streamID }
}
