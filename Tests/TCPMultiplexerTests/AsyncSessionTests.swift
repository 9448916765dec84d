import NIOCore
import NIOEmbedded
import NIOPosix
import Testing
@testable import TCPMultiplexer

/// Reads each stream the peer opens and writes it back, ending its side when the peer has: the accepting
/// end of the DocC article "Carry many streams over one connection".
func echoEveryStream(of session: MultiplexerAsyncSession<NIOAsyncChannel<ByteBuffer, ByteBuffer>>) async throws {
    try await withThrowingDiscardingTaskGroup { streams in
        for try await stream in session.inbound {
            streams.addTask {
                try await stream.executeThenClose { inbound, outbound in
                    for try await bytes in inbound { try await outbound.write(bytes) }
                }
            }
        }
    }
}

/// The async API (`configureAsync`, `openStream`, `inbound`), over loopback TCP as the article uses it.
@Suite(.serialized, .timeLimit(.minutes(1))) struct AsyncSessionTests {
    /// The article's code, compiled and run: an echo service on each stream the peer opens.
    @Test func theArticlesEchoServiceAnswersEveryStream() async throws {
        // Accepting end: each connection gets a session; the streams its peer opens arrive on `inbound`.
        let listener = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .bind(host: "127.0.0.1", port: 0) { connection in
                MultiplexerSession.configureAsync(on: connection, role: .server)
            }
        let port = try #require(listener.channel.localAddress?.port)
        let service = Task {
            try await listener.executeThenClose { sessions in
                for try await session in sessions { try await echoEveryStream(of: session) }
            }
        }
        defer { service.cancel() }

        // Connecting end.
        let session = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connect(host: "127.0.0.1", port: port) { connection in
                MultiplexerSession.configureAsync(on: connection, role: .client)
            }
        try await withThrowingTaskGroup(of: String.self) { group in
            for index in 0..<5 {
                group.addTask {
                    let stream = try await session.openStream()
                    return try await stream.executeThenClose { inbound, outbound in
                        try await outbound.write(ByteBuffer(string: "hello \(index)"))
                        outbound.finish()  // FIN: the echo ends its side once it has sent everything back
                        var echoed = ""
                        for try await bytes in inbound { echoed += String(buffer: bytes) }
                        return echoed
                    }
                }
            }
            var answers: [String] = []
            for try await answer in group { answers.append(answer) }
            #expect(answers.sorted() == (0..<5).map { "hello \($0)" })
        }
        let metrics = try await session.session.metrics().get()
        #expect(metrics.streamsOpenedLocally == 5 && metrics.openStreams == 0)
        try await session.session.close().get()
        try await listener.channel.close()
    }

    @Test func inboundStreamsArriveInOrderAndEndWithTheSession() async throws {
        let session = try Self.sessionThatAcceptedTwoStreamsAndClosed()
        var ids: [UInt64] = []
        for try await stream in session.inbound { ids += [stream.channel.multiplexerStreamID ?? 0] }
        #expect(ids == [1, 3])
    }

    /// An embedded session (used only on this thread, before the test suspends) whose peer opened
    /// streams 1 and 3; then its channel closed.
    static func sessionThatAcceptedTwoStreamsAndClosed() throws -> MultiplexerAsyncSession<NIOAsyncChannel<ByteBuffer, ByteBuffer>> {
        let channel = EmbeddedChannel()
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        let session = try MultiplexerSession.configureAsync(on: channel, role: .server,
                                                            configuration: quietConfiguration(.yamux)).wait()
        _ = try channel.drainOutbound()
        try channel.writeInbound(yamux(.windowUpdate, .syn, id: 1, length: 0))
        try channel.writeInbound(yamux(.windowUpdate, .syn, id: 3, length: 0))
        #expect(hex(try channel.drainOutbound())
                == hex(yamux(.windowUpdate, .ack, id: 1, length: 0)) + hex(yamux(.windowUpdate, .ack, id: 3, length: 0)))
        try channel.close().wait()
        return session
    }

    @Test func aStreamFindingTheQueueFullIsReset() async throws {
        let session = try Self.sessionWhoseSecondStreamFoundTheQueueFull()
        var names: [String] = []
        for try await name in session.inbound { names.append(name) }
        #expect(names == ["first"])
    }

    /// An embedded session whose inbound queue holds one stream (maxConcurrentStreams): the peer opened
    /// "first" and reset it (so it is gone but still waits to be taken), then "second", which found the
    /// queue full and was reset; then the channel closed.
    static func sessionWhoseSecondStreamFoundTheQueueFull() throws -> MultiplexerAsyncSession<String> {
        var configuration = quietConfiguration(.thaliMultiplex)
        configuration.maxConcurrentStreams = 1
        let channel = EmbeddedChannel()
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        let session = try MultiplexerSession.configureAsync(on: channel, role: .server, configuration: configuration) { stream in
            stream.eventLoop.makeSucceededFuture((stream as? MultiplexerStreamChannel)?.name ?? "")
        }.wait()
        try channel.writeInbound(thali(.open, id: 0, body: Array("first".utf8)))
        try channel.writeInbound(thali(.resetInitiator, id: 0))
        try channel.writeInbound(thali(.open, id: 1, body: Array("second".utf8)))
        #expect(hex(try channel.drainOutbound()) == hex(thali(.resetReceiver, id: 1)))
        try channel.close().wait()
        return session
    }
}
