import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import Testing
@testable import TCPMultiplexer

/// The session handler driven frame by frame through an `EmbeddedChannel`.
@Suite(.timeLimit(.minutes(2))) struct YamuxHandlerTests {
    /// A server session whose first frame (the round-trip ping) has been read off.
    func serverSession(_ accepted: AcceptedStreams, configure: (inout MultiplexerConfiguration) -> Void = { _ in })
        throws -> (EmbeddedChannel, MultiplexerSession) {
        var configuration = quietConfiguration(.yamux)
        configure(&configuration)
        let (channel, session) = try EmbeddedChannel.withSession(role: .server, configuration: configuration,
                                                                 initializer: accepted.initializer)
        #expect(hex(try channel.drainOutbound()) == hex(yamux(.ping, .syn, id: 0, length: 1)))
        return (channel, session)
    }

    @Test func acceptsAStreamAcknowledgesAndDeliversData() throws {
        let accepted = AcceptedStreams(halfClosure: true)
        let (channel, _) = try serverSession(accepted)
        try channel.writeInbound(yamux(.windowUpdate, .syn, id: 1, length: 0))
        #expect(hex(try channel.drainOutbound()) == hex(yamux(.windowUpdate, .ack, id: 1, length: 0)))
        try channel.writeInbound(yamux(.data, .fin, id: 1, length: 5, payload: Array("hello".utf8)))
        let stream = try #require(accepted.all.first)
        #expect(stream.recorder.receivedString == "hello")
        #expect(stream.recorder.inputClosed)
        try stream.channel.writeAndFlush(ByteBuffer(string: "bye")).wait()
        try stream.channel.close(mode: .output).wait()
        #expect(hex(try channel.drainOutbound())
                == hex(yamux(.data, id: 1, length: 3, payload: Array("bye".utf8))) + hex(yamux(.windowUpdate, .fin, id: 1, length: 0)))
        try stream.channel.closeFuture.wait()  // FIN both ways: the stream is finished
    }

    /// Two `close()` calls after the peer's FIN, while ours waits behind queued bytes: both complete when
    /// the FIN is out and the channel ends (the second used to replace the first's promise, which then
    /// never completed).
    @Test func aSecondGracefulCloseCompletesWithTheFirst() throws {
        let accepted = AcceptedStreams(halfClosure: true)
        let (channel, _) = try serverSession(accepted)
        try channel.writeInbound(yamux(.windowUpdate, .syn, id: 1, length: 0))
        try channel.writeInbound(yamux(.data, .fin, id: 1, length: 2, payload: Array("hi".utf8)))
        let stream = try #require(accepted.all.first)
        _ = try channel.drainOutbound()
        let window = YamuxHeader.initialWindowSize
        stream.channel.write(ByteBuffer(repeating: 7, count: window + 10), promise: nil)
        let first = stream.channel.close()
        let second = stream.channel.close()
        let done = NIOLockedValueBox((first: false, second: false))
        first.whenSuccess { done.withLockedValue { $0.first = true } }
        second.whenSuccess { done.withLockedValue { $0.second = true } }
        channel.embeddedEventLoop.run()
        #expect(done.withLockedValue { !$0.first && !$0.second }, "the FIN waits for the window")
        _ = try channel.drainOutbound()
        try channel.writeInbound(yamux(.windowUpdate, id: 1, length: UInt32(window)))
        var sent = try channel.drainOutbound()
        #expect(sent.readableBytes == YamuxHeader.size + 10)
        #expect(try YamuxHeader.read(from: &sent)?.flags.contains(.fin) == true)
        channel.embeddedEventLoop.run()
        #expect(done.withLockedValue { $0.first && $0.second })
        try first.wait()
        try second.wait()
        try stream.channel.closeFuture.wait()
    }

    @Test func answersPingsAndRefusesWrongParityWithGoAway() throws {
        let accepted = AcceptedStreams()
        let (channel, _) = try serverSession(accepted)
        try channel.writeInbound(yamux(.ping, .syn, id: 0, length: 77))
        #expect(hex(try channel.drainOutbound()) == hex(yamux(.ping, .ack, id: 0, length: 77)))
        // The client may not open even ids.
        #expect(throws: MultiplexerError.invalidStreamID(2)) {
            try channel.writeInbound(yamux(.windowUpdate, .syn, id: 2, length: 0))
        }
        #expect(hex(try channel.drainOutbound()) == hex(yamux(.goAway, id: 0, length: 1)))
        #expect(!channel.isActive)
    }

    @Test func dataBeyondTheWindowIsAProtocolError() throws {
        let accepted = AcceptedStreams(autoRead: false)
        let (channel, _) = try serverSession(accepted)
        try channel.writeInbound(yamux(.windowUpdate, .syn, id: 1, length: 0))
        _ = try channel.drainOutbound()
        let window = YamuxHeader.initialWindowSize
        try channel.writeInbound(yamux(.data, id: 1, length: UInt32(window), payload: Array(repeating: 1, count: window)))
        #expect(throws: MultiplexerError.receiveWindowExceeded(streamID: 1, window: 0, length: 1)) {
            try channel.writeInbound(yamux(.data, id: 1, length: 1, payload: [1]))
        }
        #expect(hex(try channel.drainOutbound()) == hex(yamux(.goAway, id: 0, length: 1)))
        let stream = try #require(accepted.all.first)
        #expect(stream.recorder.errors.compactMap { $0 as? MultiplexerError }
                == [.receiveWindowExceeded(streamID: 1, window: 0, length: 1)])
    }

    @Test func aReaderThatStopsHoldsAtMostItsWindowAndGetsNoUpdate() throws {
        let accepted = AcceptedStreams(autoRead: false)
        let (channel, session) = try serverSession(accepted)
        try channel.writeInbound(yamux(.windowUpdate, .syn, id: 1, length: 0))
        _ = try channel.drainOutbound()
        for _ in 0..<4 {
            try channel.writeInbound(yamux(.data, id: 1, length: 65536, payload: Array(repeating: 7, count: 65536)))
        }
        #expect(try channel.drainOutbound().readableBytes == 0)  // no window update: nothing was read
        let metrics = try session.metrics().wait()
        #expect(metrics.streams.first?.bufferedReceiveBytes == YamuxHeader.initialWindowSize)
        #expect(metrics.bufferedReceiveBytes <= metrics.streams.first?.receiveWindow ?? 0)
        // Reading replenishes the window by what was consumed.
        let stream = try #require(accepted.all.first)
        stream.channel.read()
        #expect(stream.recorder.received.count == YamuxHeader.initialWindowSize)
        #expect(hex(try channel.drainOutbound())
                == hex(yamux(.windowUpdate, id: 1, length: UInt32(YamuxHeader.initialWindowSize))))
    }

    @Test func windowsLimitSendingUntilTheyAreUpdated() throws {
        let accepted = AcceptedStreams()
        let (channel, session) = try serverSession(accepted)
        let stream = try session.openStream().wait()
        #expect(hex(try channel.drainOutbound()) == hex(yamux(.windowUpdate, .syn, id: 2, length: 0)))
        let window = YamuxHeader.initialWindowSize
        let write = stream.writeAndFlush(ByteBuffer(repeating: 9, count: window + 100))
        let written = WriteFlag()
        write.whenSuccess { written.set() }
        let sent = try channel.drainOutbound()
        #expect(sent.readableBytes == window + YamuxHeader.size)  // exactly the window, then it waits
        #expect(!written.isSet)
        try channel.writeInbound(yamux(.windowUpdate, .ack, id: 2, length: 100))
        var rest = try channel.drainOutbound()
        #expect(try YamuxHeader.read(from: &rest) == YamuxHeader(type: .data, streamID: 2, length: 100))
        try write.wait()
        #expect(written.isSet)
    }

    @Test func refusesStreamsBeyondTheLimitsWithReset() throws {
        let accepted = AcceptedStreams()
        let (channel, session) = try serverSession(accepted) { $0.maxConcurrentStreams = 2 }
        for id: UInt32 in [1, 3, 5] { try channel.writeInbound(yamux(.windowUpdate, .syn, id: id, length: 0)) }
        #expect(hex(try channel.drainOutbound())
                == hex(yamux(.windowUpdate, .ack, id: 1, length: 0)) + hex(yamux(.windowUpdate, .ack, id: 3, length: 0))
                + hex(yamux(.windowUpdate, .rst, id: 5, length: 0)))
        #expect(accepted.count == 2)
        #expect(throws: MultiplexerError.tooManyStreams(limit: 2)) { try session.openStream().wait() }
        #expect(try session.metrics().wait().streamsRefused == 1)
    }

    @Test func peerResetFailsTheStream() throws {
        let accepted = AcceptedStreams()
        let (channel, _) = try serverSession(accepted)
        try channel.writeInbound(yamux(.windowUpdate, .syn, id: 1, length: 0))
        try channel.writeInbound(yamux(.windowUpdate, .rst, id: 1, length: 0))
        let stream = try #require(accepted.all.first)
        try stream.channel.closeFuture.wait()
        #expect(stream.recorder.errors.compactMap { $0 as? MultiplexerError } == [.streamReset(message: nil)])
        // Late frames for the reset stream are dropped, not errors.
        try channel.writeInbound(yamux(.data, id: 1, length: 2, payload: [1, 2]))
        #expect(channel.isActive)
    }

    @Test func goAwayStopsNewLocalStreams() throws {
        let accepted = AcceptedStreams()
        let (channel, session) = try serverSession(accepted)
        try channel.writeInbound(yamux(.goAway, id: 0, length: 0))
        #expect(throws: MultiplexerError.goingAway) { try session.openStream().wait() }
        #expect(throws: MultiplexerError.remoteGoAway(code: 2)) {
            try channel.writeInbound(yamux(.goAway, id: 0, length: 2))
        }
        #expect(!channel.isActive)
    }
}

/// A flag set from a future's callback (same thread in embedded tests).
final class WriteFlag: @unchecked Sendable {
    private(set) var isSet = false
    func set() { isSet = true }
}

/// Limits and violations not covered above.
@Suite(.timeLimit(.minutes(2))) struct SessionLimitTests {
    @Test func streamsBeyondTheAcceptBacklogAreRefused() throws {
        var configuration = quietConfiguration(.yamux)
        configuration.acceptBacklog = 2
        let pending = PendingInitializers()
        let (channel, session) = try EmbeddedChannel.withSession(role: .server, configuration: configuration,
                                                                 initializer: pending.initializer)
        _ = try channel.drainOutbound()
        for id: UInt32 in [1, 3, 5] { try channel.writeInbound(yamux(.windowUpdate, .syn, id: id, length: 0)) }
        // Nobody has accepted 1 and 3 yet, so 5 is over the backlog.
        #expect(hex(try channel.drainOutbound()) == hex(yamux(.windowUpdate, .rst, id: 5, length: 0)))
        pending.completeAll()
        #expect(hex(try channel.drainOutbound())
                == hex(yamux(.windowUpdate, .ack, id: 1, length: 0)) + hex(yamux(.windowUpdate, .ack, id: 3, length: 0)))
        try channel.writeInbound(yamux(.windowUpdate, .syn, id: 7, length: 0))
        #expect(try session.metrics().wait().streamsRefused == 1)
        #expect(pending.count == 3)
    }

    @Test func thaliMultiplexDuplicateOpenEndsTheSession() throws {
        let accepted = AcceptedStreams()
        let (channel, _) = try EmbeddedChannel.withSession(role: .server, configuration: quietConfiguration(.thaliMultiplex),
                                                           initializer: accepted.initializer)
        try channel.writeInbound(bytes(hex: "0000"))
        #expect(throws: MultiplexerError.duplicateStream(0)) { try channel.writeInbound(bytes(hex: "0000")) }
        #expect(!channel.isActive)
        let stream = try #require(accepted.all.first)
        #expect(stream.recorder.errors.compactMap { $0 as? MultiplexerError } == [.duplicateStream(0)])
    }

    @Test func yamuxDataAfterTheStreamsFINResetsOnlyThatStream() throws {
        let accepted = AcceptedStreams(halfClosure: true)
        let (channel, _) = try EmbeddedChannel.withSession(role: .server, configuration: quietConfiguration(.yamux),
                                                           initializer: accepted.initializer)
        _ = try channel.drainOutbound()
        try channel.writeInbound(yamux(.windowUpdate, [.syn, .fin], id: 1, length: 0))
        _ = try channel.drainOutbound()
        try channel.writeInbound(yamux(.data, id: 1, length: 2, payload: [1, 2]))
        #expect(hex(try channel.drainOutbound()) == hex(yamux(.windowUpdate, .rst, id: 1, length: 0)))
        let stream = try #require(accepted.all.first)
        #expect(stream.recorder.errors.compactMap { $0 as? MultiplexerError }
                == [.unexpectedFrame(streamID: 1, reason: "data after the peer's FIN")])
        #expect(channel.isActive)
    }
}

/// Stream initializers that complete only when the test says so (to fill the accept backlog).
final class PendingInitializers: @unchecked Sendable {
    private var promises: [EventLoopPromise<Void>] = []
    var count: Int { promises.count }
    var initializer: MultiplexerHandler.StreamInitializer {
        { channel in
            let promise = channel.eventLoop.makePromise(of: Void.self)
            self.promises.append(promise)
            return promise.futureResult
        }
    }
    func completeAll() { promises.forEach { $0.succeed(()) } }
}

/// A peer that floods without reading cannot make the session queue answers without bound.
@Suite(.timeLimit(.minutes(2))) struct FloodTests {
    @Test func pingAnswersCoalesceAndRefusalFloodsEndTheSession() throws {
        let (channel, _) = try EmbeddedChannel.withSession(role: .server, configuration: quietConfiguration(.yamux),
                                                           initializer: nil)
        _ = try channel.drainOutbound()
        channel.isWritable = false
        channel.pipeline.fireChannelWritabilityChanged()
        for id in 1...1000 { try channel.writeInbound(yamux(.ping, .syn, id: 0, length: UInt32(id))) }
        #expect(try channel.drainOutbound().readableBytes == 0)
        channel.isWritable = true
        channel.pipeline.fireChannelWritabilityChanged()
        #expect(hex(try channel.drainOutbound()) == hex(yamux(.ping, .ack, id: 0, length: 1000)))

        // Streams refused (no initializer) while the peer reads nothing.
        channel.isWritable = false
        channel.pipeline.fireChannelWritabilityChanged()
        var wire = ByteBuffer()
        for id in stride(from: UInt32(1), to: 20_000, by: 2) {
            YamuxHeader(type: .windowUpdate, flags: .syn, streamID: id, length: 0).write(to: &wire)
        }
        #expect(throws: MultiplexerError.controlFrameBacklog(limit: MultiplexerHandler.maxControlBacklog)) {
            try channel.writeInbound(wire)
        }
        #expect(!channel.isActive)
    }
}

/// Found by the yamux-pair fuzz harness: the peer's last data and FIN arrive in one read with the window
/// update that lets our own queued data and FIN go out. Our FIN finishes the stream, but what the peer
/// sent is still waiting for the pipeline: it must be delivered, not dropped with the channel.
@Suite(.timeLimit(.minutes(2))) struct FinishedStreamDeliveryTests {
    @Test func thePeersLastBytesArriveEvenWhenOurFINFinishesTheStreamFirst() throws {
        let accepted = AcceptedStreams(halfClosure: true)
        let (channel, _) = try EmbeddedChannel.withSession(role: .server, configuration: quietConfiguration(.yamux),
                                                           initializer: accepted.initializer)
        try channel.writeInbound(yamux(.windowUpdate, .syn, id: 1, length: 0))
        let stream = try #require(accepted.all.first)
        // We write past the peer's window and half-close: the FIN waits behind the queued bytes.
        let window = YamuxHeader.initialWindowSize
        stream.channel.write(ByteBuffer(repeating: 7, count: window + 1000), promise: nil)
        stream.channel.close(mode: .output, promise: nil)
        stream.channel.flush()
        _ = try channel.drainOutbound()
        // One read: the peer's last bytes with its FIN, then the window update that frees our rest.
        var read = yamux(.data, .fin, id: 1, length: 5, payload: Array("last!".utf8))
        var update = yamux(.windowUpdate, id: 1, length: UInt32(window))
        read.writeBuffer(&update)
        try channel.writeInbound(read)
        channel.pipeline.fireChannelReadComplete()
        // Our rest went out with our FIN (the stream is finished on the wire) ...
        var sent = try channel.drainOutbound()
        #expect(sent.readableBytes == YamuxHeader.size + 1000)
        #expect(try YamuxHeader.read(from: &sent)?.flags.contains(.fin) == true)
        // ... and the peer's bytes and its end still reached the pipeline.
        #expect(stream.recorder.receivedString == "last!")
        #expect(stream.recorder.inputClosed)
        try stream.channel.closeFuture.wait()
    }
}
