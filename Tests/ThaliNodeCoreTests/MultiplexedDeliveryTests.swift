import Foundation
import NIOCore
import NIOPosix
import TCPMultiplexer
import Testing
@testable import ThaliNodeCore

/// The delivery protocol on a yamux stream of TCPMultiplexer over a real TCP connection: the shape it will
/// have inside PSK-TLS (the TLS layer sits below the multiplexer and does not change the stream's API).
@Suite("Delivery over a multiplexer stream")
struct MultiplexedDeliveryTests {
    @Test("texts and a file delivered on a yamux stream, exactly once, with a second stream after a cut")
    func deliveryOnYamuxStream() async throws {
        let limits = DeliveryLimits(chunkBytes: 8192, idleTimeout: .seconds(30))
        let pair = try NodePair(limits: limits)
        let content = try DeliveryTests.queueItems(pair, fileBytes: 200_000)
        let group = MultiThreadedEventLoopGroup.singleton
        // Bob's side: every stream Alice opens becomes a delivery receiver session.
        let (streams, streamSink) = AsyncStream.makeStream(of: DeliveryChannel.AsyncFrames.self)
        let server = try await ServerBootstrap(group: group).bind(host: "127.0.0.1", port: 0) { child in
            MultiplexerSession.configure(on: child, role: .server) { stream in
                stream.eventLoop.makeCompletedFuture {
                    streamSink.yield(try DeliveryChannel.configureSynchronously(stream, limits: limits))
                }
            }.map { _ in child }
        }
        let port = try #require(server.channel.localAddress?.port)
        let session = try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: port) { channel in
            MultiplexerSession.configure(on: channel, role: .client)
        }
        let receiver = DeliveryReceiver(store: pair.bob, authenticatedPeer: pair.aliceAtBob, limits: limits, logger: quietLogger)
        let sender = DeliverySender(store: pair.alice, authenticatedPeer: pair.bobAtAlice, limits: limits, logger: quietLogger)

        func openDeliveryStream(cutAfter: Int? = nil) async throws -> DeliveryChannel.AsyncFrames {
            let (opened, sink) = AsyncStream.makeStream(of: DeliveryChannel.AsyncFrames.self)
            _ = try await session.openStream { stream in
                stream.eventLoop.makeCompletedFuture {
                    if let cutAfter { try stream.pipeline.syncOperations.addHandler(CutAfterBytes(limit: cutAfter)) }
                    sink.yield(try DeliveryChannel.configureSynchronously(stream, limits: limits))
                }
            }.get()
            var iterator = opened.makeAsyncIterator()
            return try #require(await iterator.next())
        }

        var incoming = streams.makeAsyncIterator()
        // First stream: cut after 100,000 bytes (inside the file), as if the stream were reset.
        let cutStream = try await openDeliveryStream(cutAfter: 100_000)
        let cutReceiverFrames = try #require(await incoming.next())
        async let cutReceiver: Void = { _ = try? await receiver.run(on: cutReceiverFrames) }()
        await #expect(throws: (any Error).self) { _ = try await sender.run(on: cutStream) }
        await cutReceiver
        #expect(try pair.bob.inbox().count == 2)  // the two texts, not the file

        // Second stream on the same session: resumes the file and finishes.
        let stream = try await openDeliveryStream()
        let receiverFrames = try #require(await incoming.next())
        async let received = receiver.run(on: receiverFrames)
        let sent = try await sender.run(on: stream)
        let summary = try await received
        #expect(sent.delivered.count == 1)
        #expect(sent.bytesSent < 200_000)
        #expect(summary.received.map(\.fileName) == ["report.pdf"])
        try DeliveryTests.expectDeliveredExactlyOnce(pair, file: content)

        streamSink.finish()
        try await session.close().get()
        try await server.channel.close()
    }
}
