import Foundation
import NIOCore
import NIOEmbedded
import Testing
import ThaliTestSupport
@testable import TCPMultiplexer

/// The bytes npm `multiplex` 6.7.0 wrote in a scripted scenario (Tests/TCPMultiplexerTests/Reference),
/// grouped by step number and direction.
struct ReferenceTranscript {
    /// Hex of the A->B and B->A bytes of each step, joined.
    var aToB: [Int: String] = [:]
    var bToA: [Int: String] = [:]

    init() throws {
        let path = PackagePaths.root() + "/Tests/TCPMultiplexerTests/Reference/multiplex-6.7.0-node.json"
        let data = try Data(contentsOf: URL(fileURLWithPath: path))
        let json = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        let chunks = try #require(json["chunks"] as? [[String: String]])
        for chunk in chunks {
            let label = try #require(chunk["step"])
            let step = try #require(Int(label.prefix { $0 != " " }))
            let hex = try #require(chunk["hex"])
            if chunk["dir"] == "A->B" { aToB[step, default: ""] += hex } else { bToA[step, default: ""] += hex }
        }
    }
}

@Suite(.timeLimit(.minutes(2))) struct ReferenceTranscriptTests {
    /// Our session plays A (the side that opens every stream): it must write A's bytes exactly and
    /// understand B's.
    @Test func playsTheOpenerByteForByte() throws {
        let transcript = try ReferenceTranscript()
        // The reference reuses a reset stream's id at once; ours quarantines it (maxQuarantinedStreamIDs,
        // tested below). Without the quarantine every byte matches.
        var configuration = quietConfiguration(.thaliMultiplex)
        configuration.maxQuarantinedStreamIDs = 0
        let (channel, session) = try EmbeddedChannel.withSession(role: .client, configuration: configuration, initializer: nil)
        func expectStep(_ step: Int, sourceLocation: SourceLocation = #_sourceLocation) throws {
            #expect(hex(try channel.drainOutbound()) == transcript.aToB[step, default: ""], "step \(step)",
                    sourceLocation: sourceLocation)
        }
        func feedStep(_ step: Int) throws {
            try channel.writeInbound(bytes(hex: transcript.bToA[step, default: ""]))
            channel.embeddedEventLoop.run()
        }

        let r0 = StreamRecorder()
        let s0 = try session.openStream(initializer: recordingInitializer(r0)).wait()
        try expectStep(1)
        try s0.writeAndFlush(ByteBuffer(string: "hello")).wait()
        try expectStep(2)
        try feedStep(3)
        #expect(r0.receivedString == "world")
        try s0.close(mode: .output).wait()
        try feedStep(4)
        try expectStep(4)
        #expect(r0.inputClosed)
        try s0.closeFuture.wait()  // both halves closed: the stream is gone and its id free

        let r1 = StreamRecorder(), r2 = StreamRecorder()
        let s1 = try session.openStream(initializer: recordingInitializer(r1)).wait()
        try expectStep(5)
        let s2 = try session.openStream(initializer: recordingInitializer(r2)).wait()
        try expectStep(6)
        try feedStep(7)
        #expect(r2.errors.compactMap { $0 as? MultiplexerError } == [.streamReset(message: "boom")])
        try s2.closeFuture.wait()
        try s1.close().wait()  // close while the peer may still send: a reset
        try expectStep(8)

        let s3 = try session.openStream(name: "named", initializer: nil).wait()
        try expectStep(9)
        try s3.writeAndFlush(ByteBuffer(repeating: 0x61, count: 300)).wait()
        try expectStep(10)
        for _ in 0..<16 { _ = try session.openStream(initializer: nil).wait() }
        try expectStep(11)
        try session.close().wait()
        try expectStep(12)  // no frames: the transport's end tells the peer
    }

    /// Our session plays B (the side that accepts): fed A's bytes, it must report the same streams and
    /// data as the reference library and write B's bytes exactly.
    @Test func playsTheAcceptorByteForByte() throws {
        let transcript = try ReferenceTranscript()
        let accepted = AcceptedStreams(halfClosure: false)
        let (channel, _) = try EmbeddedChannel.withSession(
            role: .server, configuration: quietConfiguration(.thaliMultiplex), initializer: accepted.initializer)
        func play(_ step: Int, sourceLocation: SourceLocation = #_sourceLocation, _ act: () throws -> Void = {}) throws {
            try channel.writeInbound(bytes(hex: transcript.aToB[step, default: ""]))
            channel.embeddedEventLoop.run()
            try act()
            channel.embeddedEventLoop.run()
            #expect(hex(try channel.drainOutbound()) == transcript.bToA[step, default: ""], "step \(step)",
                    sourceLocation: sourceLocation)
        }

        try play(1)
        let first = try accepted.stream(named: "0")
        try play(2)
        #expect(first.recorder.receivedString == "hello")
        try play(3) { try first.channel.writeAndFlush(ByteBuffer(string: "world")).wait() }
        try play(4)  // A's close: without half-open, B ends its side too (flag 3)
        try first.channel.closeFuture.wait()
        try play(5)
        try play(6)
        let zero = try accepted.stream(named: "0"), one = try accepted.stream(named: "1")
        #expect(zero.channel !== first.channel)
        try play(7) {
            try one.channel.triggerUserOutboundEvent(MultiplexerStreamReset(message: "boom")).wait()
        }
        try play(8)
        #expect(zero.recorder.errors.compactMap { $0 as? MultiplexerError } == [.streamReset(message: nil)])
        try play(9)
        let named = try accepted.stream(named: "named")
        try play(10)
        #expect(named.recorder.received == Array(repeating: 0x61, count: 300))
        try play(11)
        #expect(accepted.all.compactMap { ($0.channel as? MultiplexerStreamChannel)?.name }.suffix(16)
                == (1...16).map(String.init))
        try play(12)
        try channel.close().wait()
        #expect(named.recorder.inactive)
    }
}

@Suite(.timeLimit(.minutes(2))) struct ThaliMultiplexIDReuseTests {
    /// The reference library reuses an id as soon as both sides closed the stream; the close and the
    /// next open may arrive in one read, before our channel has even seen its end.
    @Test func anIDReusedInTheSameReadOpensANewStream() throws {
        let accepted = AcceptedStreams(halfClosure: true, autoRead: false)
        let (channel, session) = try EmbeddedChannel.withSession(
            role: .server, configuration: quietConfiguration(.thaliMultiplex), initializer: accepted.initializer)
        try channel.writeInbound(bytes(hex: "0000" + "0205" + "68656c6c6f"))  // open 0, "hello"
        let first = try #require(accepted.all.first)
        try first.channel.close(mode: .output).wait()
        #expect(hex(try channel.drainOutbound()) == "0300")
        try channel.writeInbound(bytes(hex: "0400" + "0000" + "0202" + "6869"))  // close 0, open 0 again, "hi"
        #expect(channel.isActive)
        #expect(accepted.count == 2)
        let second = try #require(accepted.all.last)
        second.channel.read()
        #expect(second.recorder.receivedString == "hi")
        // The first stream still hands out what it had, then its end.
        first.channel.read()
        #expect(first.recorder.receivedString == "hello")
        #expect(first.recorder.inputClosed)
        try first.channel.closeFuture.wait()
        #expect(try session.metrics().wait().bufferedReceiveBytes == 0)
    }

    /// After we reset a stream, the peer may still send on it until it sees the reset, and the reference
    /// reuses ids at once: those bytes would land on our next stream with that id. The id waits until the
    /// peer's own reset for it arrives; what arrives for it meanwhile is dropped.
    @Test func aResetIDWaitsUntilThePeerCannotSendOnIt() throws {
        let (channel, session) = try EmbeddedChannel.withSession(
            role: .client, configuration: quietConfiguration(.thaliMultiplex), initializer: nil)
        let first = try session.openStream(initializer: nil).wait()
        #expect((first as? MultiplexerStreamChannel)?.streamID == 0)
        try first.close().wait()  // a reset: the peer has not closed its side
        _ = try channel.drainOutbound()

        let recorder = StreamRecorder()
        let second = try session.openStream(initializer: recordingInitializer(recorder)).wait()
        #expect((second as? MultiplexerStreamChannel)?.streamID == 1)
        try channel.writeInbound(bytes(hex: "0103" + "616263"))  // the peer's late data on 0, before our reset reached it
        second.read()
        #expect(recorder.receivedString == "")
        #expect(channel.isActive)

        try channel.writeInbound(bytes(hex: "0500"))  // the peer's reset for 0: nothing more of it can come
        let third = try session.openStream(initializer: nil).wait()
        #expect((third as? MultiplexerStreamChannel)?.streamID == 0)
    }

    /// A stream closed both ways is over for us, but the peer may still reset it: its reset can cross our
    /// close. Reused at once, the id would take that reset on our next stream (found by the
    /// thali-multiplex-pair harness: a stream nobody reset lost its end). It waits like a reset one.
    @Test func anIDClosedBothWaysWaitsForALateReset() throws {
        let (channel, session) = try EmbeddedChannel.withSession(
            role: .client, configuration: quietConfiguration(.thaliMultiplex), initializer: nil)
        let first = try session.openStream(initializer: nil).wait()
        #expect((first as? MultiplexerStreamChannel)?.streamID == 0)
        try first.close(mode: .output).wait()
        try channel.writeInbound(bytes(hex: "0300"))  // the peer's close for 0: closed both ways
        try first.closeFuture.wait()
        _ = try channel.drainOutbound()

        let second = try session.openStream(initializer: nil).wait()
        #expect((second as? MultiplexerStreamChannel)?.streamID == 1)
        try channel.writeInbound(bytes(hex: "0500"))  // the peer's reset for 0, sent before our close reached it
        #expect(second.isActive)
        // After the peer's reset nothing more of 0 can come: the id is free again.
        let third = try session.openStream(initializer: nil).wait()
        #expect((third as? MultiplexerStreamChannel)?.streamID == 0)
        #expect(channel.isActive)
    }

    @Test func theQuarantineIsBounded() throws {
        var configuration = quietConfiguration(.thaliMultiplex)
        configuration.maxQuarantinedStreamIDs = 1
        let (_, session) = try EmbeddedChannel.withSession(role: .client, configuration: configuration, initializer: nil)
        let a = try session.openStream(initializer: nil).wait()
        let b = try session.openStream(initializer: nil).wait()
        try a.close().wait()
        try b.close().wait()  // 0 then 1 quarantined; only one may wait, so 0 is free again
        let c = try session.openStream(initializer: nil).wait()
        #expect((c as? MultiplexerStreamChannel)?.streamID == 0)
        let d = try session.openStream(initializer: nil).wait()
        #expect((d as? MultiplexerStreamChannel)?.streamID == 2)
    }
}
