import Crypto
import NIOCore
import NIOEmbedded
import NIOPosix
import Testing
@testable import TCPMultiplexer

/// Per-stream flow control over a real loopback TCP connection between two of our sessions.
@Suite(.serialized) struct FlowControlTests {
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

    @Test func aStalledReaderDoesNotBlockTheOtherStreamNorGrowMemory() async throws {
        let fastDone = testGroup.next().makePromise(of: Int.self)
        // The server's first stream never reads; the second counts everything.
        let order = ManagedCounter()
        let (client, server, listener) = try await sessionPair(MultiplexerConfiguration()) { channel in
            channel.eventLoop.makeCompletedFuture {
                try channel.syncOptions?.setOption(.allowRemoteHalfClosure, value: true)
                if order.next() == 0 {
                    try channel.syncOptions?.setOption(.autoRead, value: false)
                } else {
                    try channel.pipeline.syncOperations.addHandler(Counter(done: fastDone))
                }
            }
        }
        defer { listener.close(promise: nil) }
        let slow = try await client.openStream().get()
        // Wait until the server has taken the slow stream, so the order is certain.
        while try await server.metrics().get().streamsAccepted < 1 { try await Task.sleep(for: .milliseconds(5)) }
        let slowWrite = slow.eventLoop.makePromise(of: Void.self)
        slow.writeAndFlush(ByteBuffer(repeating: 1, count: 8 << 20), promise: slowWrite)
        let fast = try await client.openStream().get()
        let fastBytes = 64 << 20
        try await fast.writeAndFlush(ByteBuffer(repeating: 2, count: fastBytes)).get()
        try await fast.close(mode: .output).get()
        #expect(try await fastDone.futureResult.get() == fastBytes)

        // The stalled stream holds exactly its first window on the server and was never granted more.
        let serverMetrics = try await server.metrics().get()
        let stalled = try #require(serverMetrics.streams.first { $0.streamID == slow.multiplexerStreamID })
        #expect(stalled.bufferedReceiveBytes == YamuxHeader.initialWindowSize)
        #expect(stalled.bufferedReceiveBytes <= stalled.receiveWindow)
        #expect(stalled.receiveWindow == YamuxHeader.initialWindowSize)
        #expect(serverMetrics.bufferedReceiveBytes == YamuxHeader.initialWindowSize)
        // The client keeps the rest queued, with no send window and its channel not writable.
        let clientMetrics = try await client.metrics().get()
        let sender = try #require(clientMetrics.streams.first { $0.streamID == slow.multiplexerStreamID })
        #expect(sender.sendWindow == 0)
        #expect(sender.queuedSendBytes == (8 << 20) - YamuxHeader.initialWindowSize)
        #expect(!slow.isWritable)
        try await client.close().get()
        await #expect(throws: (any Error).self) { try await slowWrite.futureResult.get() }
    }

    @Test func windowsGrowWhileTheReaderKeepsUpAndStayUnderTheCap() async throws {
        var configuration = MultiplexerConfiguration()
        configuration.maxStreamWindowSize = 1 << 20
        let done = testGroup.next().makePromise(of: Int.self)
        let (client, server, listener) = try await sessionPair(configuration) { channel in
            channel.eventLoop.makeCompletedFuture {
                try channel.syncOptions?.setOption(.allowRemoteHalfClosure, value: true)
                try channel.pipeline.syncOperations.addHandler(Counter(done: done))
            }
        }
        defer { listener.close(promise: nil) }
        _ = try await client.ping().get()  // both sides know the round-trip time
        _ = try await server.ping().get()
        let stream = try await client.openStream().get()
        try await stream.writeAndFlush(ByteBuffer(repeating: 3, count: 32 << 20)).get()
        try await stream.close(mode: .output).get()
        #expect(try await done.futureResult.get() == 32 << 20)
        let metrics = try await server.metrics().get()
        #expect(metrics.windowGrowths > 0)
        #expect(metrics.streams.allSatisfy { $0.receiveWindow <= 1 << 20 })
        try await client.close().get()
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

/// A counter shared with `@Sendable` initializers (they run on one event loop).
final class ManagedCounter: @unchecked Sendable {
    private var value = 0
    func next() -> Int { defer { value += 1 }; return value }
}

extension Channel {
    /// The stream id of a multiplexer stream channel.
    var multiplexerStreamID: UInt64? { (self as? MultiplexerStreamChannel)?.streamID }
}
