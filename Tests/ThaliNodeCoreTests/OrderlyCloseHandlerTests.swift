import NIOCore
import NIOEmbedded
import Testing
@testable import ThaliNodeCore

/// The app stream's close, as the handler alone sees it: a close while the other side may still send
/// waits for that side's end (dropping what still arrives), or for the linger.
@Suite("Orderly close of app streams")
struct OrderlyCloseHandlerTests {
    /// Stands for the multiplexer stream below the handler: it half-closes (records the output's end)
    /// where an embedded channel would close whole.
    final class HalfClosingStream: ChannelOutboundHandler {
        typealias OutboundIn = ByteBuffer
        var outputEnded = false

        func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
            guard mode == .output else { return context.close(mode: mode, promise: promise) }
            outputEnded = true
            promise?.succeed(())
        }
    }

    static func channel() throws -> (EmbeddedChannel, HalfClosingStream) {
        let stream = HalfClosingStream()
        let channel = EmbeddedChannel(handlers: [stream, OrderlyCloseHandler(linger: .seconds(10))])
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        return (channel, stream)
    }

    @Test("a close waits for the other side's end, dropping its late bytes, then closes")
    func closeWaitsForTheOtherSidesEnd() throws {
        let (channel, stream) = try Self.channel()
        let closed = channel.close()
        #expect(try closed.wait() == (), "the app's close completes at once")
        #expect(stream.outputEnded, "our output ended (FIN after what was written)")
        #expect(channel.isActive, "the stream stays until the other side ends")
        try channel.writeInbound(ByteBuffer(string: "late"))
        #expect(try channel.readInbound(as: ByteBuffer.self) == nil, "what arrives after the close is dropped")
        channel.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
        #expect(!channel.isActive, "both sides ended: closed")
    }

    @Test("a close whose other side never ends goes after the linger")
    func closeGoesAfterTheLinger() throws {
        let (channel, _) = try Self.channel()
        _ = channel.close()
        channel.embeddedEventLoop.advanceTime(by: .seconds(9))
        #expect(channel.isActive)
        channel.embeddedEventLoop.advanceTime(by: .seconds(1))
        #expect(!channel.isActive)
    }

    @Test("after the other side's end, a close is immediate; bytes before a close pass through")
    func closeAfterTheOtherSidesEnd() throws {
        let (channel, _) = try Self.channel()
        try channel.writeInbound(ByteBuffer(string: "early"))
        #expect(try channel.readInbound(as: ByteBuffer.self) == ByteBuffer(string: "early"))
        channel.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
        #expect(channel.isActive)
        _ = channel.close()
        #expect(!channel.isActive)
    }
}
