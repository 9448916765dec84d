import NIOCore
import NIOEmbedded
import Testing
@testable import TCPMultiplexer

/// Keepalive and idle timeout, on the embedded event loop's clock.
@Suite(.timeLimit(.minutes(2))) struct SessionTimerTests {
    @Test func keepalivePingsAndAnUnansweredPingEndsTheSession() throws {
        var configuration = MultiplexerConfiguration()
        configuration.keepAliveInterval = .seconds(10)
        configuration.keepAliveTimeout = .seconds(2)
        let (channel, _) = try EmbeddedChannel.withSession(role: .client, configuration: configuration, initializer: nil)
        #expect(hex(try channel.drainOutbound()) == hex(yamux(.ping, .syn, id: 0, length: 1)))
        try channel.writeInbound(yamux(.ping, .ack, id: 0, length: 1))
        channel.embeddedEventLoop.advanceTime(by: .seconds(10))
        #expect(hex(try channel.drainOutbound()) == hex(yamux(.ping, .syn, id: 0, length: 2)))
        try channel.writeInbound(yamux(.ping, .ack, id: 0, length: 2))
        channel.embeddedEventLoop.advanceTime(by: .seconds(10))
        #expect(hex(try channel.drainOutbound()) == hex(yamux(.ping, .syn, id: 0, length: 3)))
        #expect(channel.isActive)
        channel.embeddedEventLoop.advanceTime(by: .seconds(2))  // ping 3 never answered
        #expect(hex(try channel.drainOutbound()) == hex(yamux(.goAway, id: 0, length: 0)))
        #expect(!channel.isActive)
        #expect(throws: MultiplexerError.keepAliveTimeout) { try channel.throwIfErrorCaught() }
    }

    @Test func anIdleSessionClosesButNotWhileAStreamIsOpen() throws {
        var configuration = quietConfiguration(.thaliMultiplex)
        configuration.idleTimeout = .seconds(5)
        let (channel, session) = try EmbeddedChannel.withSession(role: .client, configuration: configuration, initializer: nil)
        let stream = try session.openStream().wait()
        channel.embeddedEventLoop.advanceTime(by: .seconds(6))
        #expect(channel.isActive)
        try stream.close().wait()  // reset: the stream is gone, the idle clock starts
        channel.embeddedEventLoop.advanceTime(by: .seconds(4))
        #expect(channel.isActive)
        channel.embeddedEventLoop.advanceTime(by: .seconds(1))
        #expect(!channel.isActive)
        #expect(throws: MultiplexerError.idleTimeout) { try channel.throwIfErrorCaught() }
    }
}
