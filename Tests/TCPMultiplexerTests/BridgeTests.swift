import Crypto
import NIOCore
import NIOPosix
import Testing
@testable import TCPMultiplexer

/// TCP connections carried over a session: client -> bridge listener -> session (real loopback TCP)
/// -> connecting bridge -> echo server, and back.
@Suite(.serialized, .timeLimit(.minutes(2))) struct BridgeTests {
    func bridge(to targetPort: Int, framing: MultiplexerFraming) async throws
        -> (bridgePort: Int, close: @Sendable () async -> Void) {
        var configuration = MultiplexerConfiguration(framing: framing)
        configuration.keepAliveInterval = nil
        let (client, server, listener) = try await sessionPair(
            configuration, serverInitializer: MultiplexerBridge.connectingInitializer(host: "127.0.0.1", port: targetPort))
        _ = server
        let bridgeListener = try await MultiplexerBridge.listen(forwardingTo: client).get()
        let port = try #require(bridgeListener.localAddress?.port)
        return (port, {
            try? await bridgeListener.close()
            try? await client.close().get()
            try? await listener.close()
        })
    }

    @Test(arguments: MultiplexerFraming.allCases)
    func connectionsAreCarriedWithHalfCloseBothWays(framing: MultiplexerFraming) async throws {
        let echo = try await listen { channel in
            channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(EchoHandler()) }
        }
        defer { echo.close(promise: nil) }
        let (port, close) = try await bridge(to: try #require(echo.localAddress?.port), framing: framing)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<10 {
                group.addTask {
                    let (payload, digest) = randomPayload(1 << 20)
                    let promise = testGroup.next().makePromise(of: Received.self)
                    let connection = try await connect(port: port) { channel in
                        channel.eventLoop.makeCompletedFuture {
                            try channel.pipeline.syncOperations.addHandler(DigestCollector(promise: promise))
                        }
                    }
                    // Our EOF travels as FIN; the echo's EOF comes back the same way.
                    let received = try await exchange(on: connection, payload: payload, collector: promise.futureResult)
                    #expect(received == Received(count: 1 << 20, digest: digest))
                    try? await connection.close()
                }
            }
            try await group.waitForAll()
        }
        await close()
    }

    @Test func aRefusedTargetResetsTheStreamAndTheClientConnection() async throws {
        // A port with nothing listening: bind one, note it, close it.
        let placeholder = try await listen { $0.eventLoop.makeSucceededVoidFuture() }
        let deadPort = try #require(placeholder.localAddress?.port)
        try await placeholder.close()
        let (port, close) = try await bridge(to: deadPort, framing: .yamux)
        let promise = testGroup.next().makePromise(of: Received.self)
        let connection = try await connect(port: port) { channel in
            channel.eventLoop.makeCompletedFuture {
                try channel.pipeline.syncOperations.addHandler(DigestCollector(promise: promise))
            }
        }
        // The stream is reset, so the client's connection is reset too: no echo, no orderly end. A reset
        // that arrives before this write goes out fails the write itself (EPIPE or ECONNRESET), and NIO
        // then closes the channel with no inbound error; after an orderly end (FIN) the write would
        // succeed. Otherwise the reset reaches the reader as an error.
        let writeFailed = await (try? connection.writeAndFlush(ByteBuffer(string: "anyone?")).get()) == nil
        var received: Received?
        var readFailed = false
        do { received = try await promise.futureResult.get() } catch { readFailed = true }
        #expect(received.map { $0.count == 0 } ?? true, "an echo came back: \(String(describing: received))")
        #expect(readFailed || writeFailed, "an orderly end instead of a reset: \(String(describing: received))")
        try await connection.closeFuture.get()
        await close()
    }
}
