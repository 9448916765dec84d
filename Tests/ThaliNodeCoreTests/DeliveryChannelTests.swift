import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOPosix
import TCPMultiplexer
import Testing
@testable import ThaliNodeCore

@Suite("Delivery channel")
struct DeliveryChannelTests {
    @Test("an idle event closes the channel with a typed error; other events pass through")
    func idleTimeoutHandler() throws {
        // IdleStateHandler measures with the real clock, so the EmbeddedChannel test drives the event itself;
        // the real timer is exercised over TCP below.
        let channel = EmbeddedChannel(handler: IdleTimeoutHandler(timeout: .seconds(5)))
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        channel.pipeline.fireUserInboundEventTriggered(IdleStateHandler.IdleStateEvent.read)
        #expect(channel.isActive)
        channel.pipeline.fireUserInboundEventTriggered(IdleStateHandler.IdleStateEvent.all)
        #expect(!channel.isActive)
        #expect(throws: DeliveryIdleTimeout(timeout: .seconds(5))) { try channel.throwIfErrorCaught() }
    }

    @Test("a receiver whose peer connects and then stays silent gives up with DeliveryIdleTimeout")
    func silentPeerOverTCP() async throws {
        let pair = try NodePair(limits: DeliveryLimits())
        let limits = DeliveryLimits(idleTimeout: .milliseconds(300))
        let group = MultiThreadedEventLoopGroup.singleton
        let server = try await ServerBootstrap(group: group).bind(host: "127.0.0.1", port: 0) { child in
            child.eventLoop.makeCompletedFuture { try DeliveryChannel.configureSynchronously(child, limits: limits) }
        }
        let port = try #require(server.channel.localAddress?.port)
        let silent = try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: port).get()
        let receiver = DeliveryReceiver(store: pair.bob, authenticatedPeer: pair.aliceAtBob, limits: limits, logger: quietLogger)
        await #expect(throws: DeliveryIdleTimeout(timeout: .milliseconds(300))) {
            try await server.executeThenClose { connections in
                for try await connection in connections { _ = try await receiver.run(on: connection); return }
            }
        }
        try? await silent.close()  // the server side closed it already
    }

    @Test("a peer sending garbage ends the session with a typed protocol error, nothing stored")
    func garbageOverTCP() async throws {
        let pair = try NodePair(limits: DeliveryLimits())
        let limits = DeliveryLimits(idleTimeout: .seconds(10))
        let group = MultiThreadedEventLoopGroup.singleton
        let server = try await ServerBootstrap(group: group).bind(host: "127.0.0.1", port: 0) { child in
            child.eventLoop.makeCompletedFuture { try DeliveryChannel.configureSynchronously(child, limits: limits) }
        }
        let port = try #require(server.channel.localAddress?.port)
        let client = try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: port).get()
        // A valid hello, then a frame header announcing 4 GiB.
        try await client.writeAndFlush(ByteBuffer(bytes: [1, 0, 0, 0, 1, 1, 5, 0xFF, 0xFF, 0xFF, 0xFF])).get()
        let receiver = DeliveryReceiver(store: pair.bob, authenticatedPeer: pair.aliceAtBob, limits: limits, logger: quietLogger)
        await #expect(throws: DeliveryProtocolError.frameTooLarge(length: Int(UInt32.max), limit: limits.maxFramePayloadBytes)) {
            try await server.executeThenClose { connections in
                for try await connection in connections { _ = try await receiver.run(on: connection); return }
            }
        }
        try? await client.close()
        #expect(try pair.bob.inbox().isEmpty)
    }
}

extension DeliveryChannelTests {
    /// Counts the bytes the connection brought, in front of the delivery handlers.
    final class ReadCounter: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        let bytes = NIOLockedValueBox(0)

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let count = unwrapInboundIn(data).readableBytes
            bytes.withLockedValue { $0 += count }
            context.fireChannelRead(data)
        }
    }

    @Test("a delivery stream reads ahead of a session that takes nothing up to inboundFrames frames, then waits; nothing is lost",
          .timeLimit(.minutes(1)), arguments: [4, 64])
    func inboundFramesBoundTheReadAhead(inboundFrames: Int) async throws {
        let limits = DeliveryLimits(inboundFrames: inboundFrames)
        let (frameBytes, frames) = (16 * 1024, 128)  // 2 MiB, more than loopback's socket buffers hold at once
        let counter = ReadCounter()
        let group = MultiThreadedEventLoopGroup.singleton
        // Reads of 16 KiB: each brings at most two pieces of the 16 KiB data frames.
        let server = try await ServerBootstrap(group: group)
            .childChannelOption(.recvAllocator, value: FixedSizeRecvByteBufferAllocator(capacity: frameBytes))
            .bind(host: "127.0.0.1", port: 0) { child in
                child.eventLoop.makeCompletedFuture {
                    try child.pipeline.syncOperations.addHandler(counter)
                    return try DeliveryChannel.configureSynchronously(child, limits: limits)
                }
            }
        let port = try #require(server.channel.localAddress?.port)
        let client = try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: port).get()
        var stream = ByteBuffer()
        for index in 0..<frames { DeliveryFrame.data(ByteBuffer(repeating: UInt8(index), count: frameBytes)).encode(into: &stream) }
        client.writeAndFlush(stream, promise: nil)

        try await server.executeThenClose { connections in
            for try await connection in connections {
                // The session takes nothing until the reads stop (no new byte for 150 ms).
                let readAhead = try await waitUntilSettled(quiet: .milliseconds(150), timeout: .seconds(15)) {
                    counter.bytes.withLockedValue { $0 }
                }.value
                if inboundFrames == 4 {
                    #expect(readAhead <= 8 * frameBytes, "read \(readAhead) bytes ahead of the session")
                } else {
                    #expect(readAhead >= 32 * frameBytes, "read only \(readAhead) bytes ahead of the session")
                }
                var received = 0
                try await connection.executeThenClose { inbound, _ in
                    for try await frame in inbound {
                        guard case .data(let piece) = frame else { Issue.record("\(frame.name)"); return }
                        received += piece.readableBytes
                        if received == frames * frameBytes { return }
                    }
                }
                #expect(received == frames * frameBytes)
                return
            }
        }
        try? await client.close()
    }
}

@Suite("Delivery sessions per contact")
struct DeliverySessionClaimTests {
    @Test("a second receiving session with the same contact is refused while the first runs, allowed after")
    func oneSessionPerContact() async throws {
        let pair = try NodePair(limits: DeliveryLimits())
        let limits = DeliveryLimits(idleTimeout: .seconds(120))
        // One loop for the server and its children: accepted connections come out in accept order (with
        // several loops their initializers race, and `one` could be the second connection).
        let group = MultiThreadedEventLoopGroup.singleton.next()
        let server = try await ServerBootstrap(group: group).bind(host: "127.0.0.1", port: 0) { child in
            child.eventLoop.makeCompletedFuture { try DeliveryChannel.configureSynchronously(child, limits: limits) }
        }
        let port = try #require(server.channel.localAddress?.port)
        let first = try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: port).get()
        let receiver = DeliveryReceiver(store: pair.bob, authenticatedPeer: pair.aliceAtBob, limits: limits, logger: quietLogger)
        try await server.executeThenClose { connections in
            var iterator = connections.makeAsyncIterator()
            // Accept the first connection before making the second, so `one` is `first`'s server side.
            let one = try #require(try await iterator.next())
            let second = try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: port).get()
            defer { second.close(promise: nil) }
            let two = try #require(try await iterator.next())
            // The first session waits for its silent peer until that peer closes.
            async let firstSession: (any Error)? = { do { _ = try await receiver.run(on: one); return nil } catch { return error } }()
            // Wait until the running session holds the claim (polling without claiming: a probe that
            // claimed could itself make the first session's claim fail).
            _ = try await waitUntil(timeout: .seconds(30), every: .milliseconds(5)) {
                pair.bob.hasSession(.receiving, with: pair.aliceAtBob)
            }
            #expect(pair.bob.hasSession(.receiving, with: pair.aliceAtBob))
            await #expect(throws: NodeError.sessionInProgress(contact: "alice", role: "receiving")) {
                _ = try await receiver.run(on: two)
            }
            try? await first.close()
            let firstError = await firstSession
            #expect(firstError as? DeliveryProtocolError == .connectionClosed(state: "awaiting hello"))
        }
        // Released when the first session ended.
        #expect(throws: Never.self) { try pair.bob.claimSession(.receiving, with: pair.aliceAtBob) }
        pair.bob.releaseSession(.receiving, with: pair.aliceAtBob)
    }
    @Test("a stream the receiving side opens has its handlers before it is live: a frame sent at once is not lost")
    func openedStreamKeepsTheSendersImmediateFirstFrame() async throws {
        let group = MultiThreadedEventLoopGroup.singleton
        let limits = DeliveryLimits(idleTimeout: .seconds(5))
        let server = try await ServerBootstrap(group: group).childChannelInitializer { child in
            MultiplexerSession.configure(on: child, role: .server, inboundStreamInitializer: { stream in
                stream.eventLoop.makeCompletedFuture { try stream.pipeline.syncOperations.addHandler(HelloOnActive()) }
            }).map { _ in }
        }.bind(host: "127.0.0.1", port: 0).get()
        defer { server.close(promise: nil) }
        let port = try #require(server.localAddress?.port)
        let session = try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: port) { channel in
            MultiplexerSession.configure(on: channel, role: .client)
        }
        defer { session.channel.close(promise: nil) }
        // Every thread of the concurrency pool is held for a moment while the open is under way, so the
        // event loop delivers the peer's hello before this task resumes, as under load: a stream
        // configured only after the open returned would have dropped it and then idled out.
        let busy = (0..<ProcessInfo.processInfo.activeProcessorCount * 2).map { _ in
            Task.detached { holdThisThread(for: 0.3) }
        }
        let frames = try await DeliveryChannel.openStream(on: session, limits: limits)
        for task in busy { await task.value }
        let first = try await frames.executeThenClose { inbound, _ in
            var iterator = inbound.makeAsyncIterator()
            return try await iterator.next()
        }
        #expect(first == .hello(version: DeliveryFrame.protocolVersion))
    }
}

/// Blocks the calling thread (in a task: one of the concurrency pool's threads).
private func holdThisThread(for seconds: TimeInterval) {
    // A sleep, kept: holding the pool's threads is the load the test plays; nothing waits for a result.
    Thread.sleep(forTimeInterval: seconds)
}

/// The sender's side of the test above: its hello the moment the stream is live.
private final class HelloOnActive: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer

    func channelActive(context: ChannelHandlerContext) {
        var hello = context.channel.allocator.buffer(capacity: 8)
        DeliveryFrame.hello(version: DeliveryFrame.protocolVersion).encode(into: &hello)
        context.writeAndFlush(NIOAny(hello), promise: nil)
        context.fireChannelActive()
    }
}
