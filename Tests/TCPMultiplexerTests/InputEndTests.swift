import NIOCore
import NIOEmbedded
import Testing
import ThaliTestSupport
@testable import TCPMultiplexer

/// The connection's input ending (`ChannelEvent.inputClosed`: a TCP half-closure, or a TLS close_notify
/// turned into end of input) ends the session at once; before, the session ignored it and waited for
/// the keepalive ping to time out (issue: "the multiplexer ignores end of input").
@Suite(.timeLimit(.minutes(1))) struct InputEndTests {
    /// A server session on an embedded channel whose peer opened one stream and sent "hi" on it.
    static func sessionWithOneStream(_ framing: MultiplexerFraming) throws
        -> (channel: EmbeddedChannel, stream: (channel: Channel, recorder: StreamRecorder)) {
        let accepted = AcceptedStreams()
        let (channel, _) = try EmbeddedChannel.withSession(role: .server, configuration: quietConfiguration(framing),
                                                           initializer: accepted.initializer)
        switch framing {
        case .yamux:
            try channel.writeInbound(yamux(.data, .syn, id: 1, length: 2, payload: Array("hi".utf8)))
        case .thaliMultiplex:
            try channel.writeInbound(thali(.open, id: 0, body: Array("a".utf8)))
            try channel.writeInbound(thali(.messageInitiator, id: 0, body: Array("hi".utf8)))
        }
        channel.pipeline.fireChannelReadComplete()
        _ = try channel.drainOutbound()
        let stream = try #require(accepted.all.first)
        #expect(stream.recorder.receivedString == "hi")
        return (channel, stream)
    }

    @Test(arguments: MultiplexerFraming.allCases)
    func theSessionEndsWhenTheInputEnds(framing: MultiplexerFraming) throws {
        let (channel, stream) = try Self.sessionWithOneStream(framing)
        channel.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)

        #expect(stream.recorder.errors.compactMap { $0 as? MultiplexerError } == [.inputEnded(midFrame: false)])
        #expect(stream.recorder.inactive)
        #expect(!channel.isActive)
        // A normal GoAway in yamux (the peer may still read); thali-multiplex has none. Not an error
        // of the session: nothing is fired through errorCaught.
        let goAway = framing == .yamux ? hex(yamux(.goAway, id: 0, length: YamuxHeader.GoAwayCode.normal.rawValue)) : ""
        #expect(hex(try channel.drainOutbound()) == goAway)
        try channel.throwIfErrorCaught()
    }

    /// A stream we had closed our side of, whose peer's end comes in the same read as the session's
    /// end (a node that closes its stream and then its session at once): the stream is over on the
    /// wire, so the session no longer holds it, but its end must still reach it. Before, the session
    /// dropped the delivery it had queued, and the stream stayed open for good.
    @Test(arguments: MultiplexerFraming.allCases)
    func aStreamsEndInTheSameReadAsTheSessionsEndStillReachesIt(framing: MultiplexerFraming) throws {
        let accepted = AcceptedStreams(halfClosure: true)
        let (channel, _) = try EmbeddedChannel.withSession(role: .server, configuration: quietConfiguration(framing),
                                                           initializer: accepted.initializer)
        let opening = framing == .yamux ? [yamux(.data, .syn, id: 1, length: 2, payload: Array("hi".utf8))]
                                        : [thali(.open, id: 0, body: Array("a".utf8)), thali(.messageInitiator, id: 0, body: Array("hi".utf8))]
        for frame in opening { try channel.writeInbound(frame) }
        channel.pipeline.fireChannelReadComplete()
        let stream = try #require(accepted.all.first)
        try stream.channel.close(mode: .output).wait()
        _ = try channel.drainOutbound()
        #expect(!stream.recorder.inactive)

        // One read: the peer's end of the stream, then the end of the session's input.
        // (writeInbound would complete the read in between.)
        channel.pipeline.fireChannelRead(framing == .yamux ? yamux(.data, .fin, id: 1, length: 0) : thali(.closeInitiator, id: 0))
        channel.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
        channel.pipeline.fireChannelReadComplete()

        #expect(stream.recorder.inputClosed)
        #expect(stream.recorder.inactive)
        #expect(stream.recorder.errors.isEmpty, "over on the wire before the session ended: \(stream.recorder.errors)")
        #expect(!channel.isActive)
    }

    @Test(arguments: MultiplexerFraming.allCases)
    func inputEndingInsideAFrameIsAProtocolError(framing: MultiplexerFraming) throws {
        let (channel, stream) = try Self.sessionWithOneStream(framing)
        // The first bytes of a frame, and no more.
        let frame = framing == .yamux ? yamux(.data, id: 1, length: 4, payload: Array("more".utf8))
                                      : thali(.messageInitiator, id: 0, body: Array("more".utf8))
        try channel.writeInbound(frame.getSlice(at: frame.readerIndex, length: 3)!)
        channel.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)

        #expect(stream.recorder.errors.compactMap { $0 as? MultiplexerError } == [.inputEnded(midFrame: true)])
        #expect(!channel.isActive)
        let goAway = framing == .yamux ? hex(yamux(.goAway, id: 0, length: YamuxHeader.GoAwayCode.protocolError.rawValue)) : ""
        #expect(hex(try channel.drainOutbound()) == goAway)
        #expect(throws: MultiplexerError.inputEnded(midFrame: true)) { try channel.throwIfErrorCaught() }
    }

    /// Over real loopback TCP (half-closure allowed): the client shuts down its output, and the server's
    /// session ends at once, though keepalive is off and nothing else would end it.
    @Test(arguments: MultiplexerFraming.allCases)
    func aTCPHalfClosureEndsTheSession(framing: MultiplexerFraming) async throws {
        let accepted = AcceptedStreams()
        let (client, server, listener) = try await sessionPair(quietConfiguration(framing),
                                                               serverInitializer: accepted.initializer)
        defer { listener.close(promise: nil) }
        _ = try await client.openStream(name: "a").get()
        try #require(try await waitUntil(timeout: .seconds(10), every: .milliseconds(5)) {
            try await server.metrics().get().streamsAccepted >= 1
        })
        let stream = try #require(accepted.all.first)

        try await client.channel.close(mode: .output).get()
        try await value(of: stream.channel.closeFuture, within: .seconds(10))
        try await value(of: server.channel.closeFuture, within: .seconds(10))
        #expect(stream.recorder.errors.compactMap { $0 as? MultiplexerError } == [.inputEnded(midFrame: false)])
        try await value(of: client.channel.closeFuture, within: .seconds(10))
    }

    @Test func theStateMachineTellsAnEndInsideAFrame() throws {
        var machine = yamuxMachine(.server)
        #expect(machine.inputEnded() == .inputEnded(midFrame: false))
        machine.receive(yamux(.ping, .syn, id: 0, length: 7).getSlice(at: 0, length: 5)!)
        #expect(try machine.nextInputAction(now: .uptimeNanoseconds(0), outputWritable: true) == nil)
        #expect(machine.inputEnded() == .inputEnded(midFrame: true))
    }
}

struct WaitTimedOut: Error {}

/// `future`'s value, or ``WaitTimedOut`` after `timeout`: `EventLoopFuture.get()` ignores task
/// cancellation, so a test's time limit alone would not end a wait for a future that never completes.
func value<T: Sendable>(of future: EventLoopFuture<T>, within timeout: TimeAmount) async throws -> T {
    let promise = future.eventLoop.makePromise(of: T.self)
    future.cascade(to: promise)
    let timer = future.eventLoop.scheduleTask(in: timeout) { promise.fail(WaitTimedOut()) }
    defer { timer.cancel() }
    return try await promise.futureResult.get()
}
