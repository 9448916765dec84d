import Crypto
import NIOCore
import NIOPosix
import Testing
import ThaliTestSupport
@testable import TCPMultiplexer

/// Our yamux against hashicorp/yamux running as a separate Go process.
@Suite(.serialized, .enabled(if: TestEnvironment.available(GoPeer.available), "needs golang-go and golang-github-hashicorp-yamux-dev"),
       .timeLimit(.minutes(4)))  // The first test may build the Go peer (up to 180 s).
struct GoInteropTests {
    @Test func swiftOpensManyConcurrentStreamsToGoAndGetsTheEcho() async throws {
        let (peer, port) = try await GoPeer.serve()
        defer { peer.terminate() }
        let session = try await connectSession(port: port)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<64 {
                group.addTask {
                    let (payload, digest) = randomPayload(200_000)
                    let (stream, collected) = try await openCollectingStream(session)
                    let received = try await exchange(on: stream, payload: payload, collector: collected)
                    #expect(received == Received(count: payload.readableBytes, digest: digest))
                }
            }
            try await group.waitForAll()
        }
        let metrics = try await session.metrics().get()
        #expect(metrics.streamsOpenedLocally == 64)
        #expect(metrics.protocolErrors == 0)
        try await session.close().get()
    }

    @Test func largeTransferThroughGoKeepsEveryByte() async throws {
        let (peer, port) = try await GoPeer.serve()
        defer { peer.terminate() }
        let session = try await connectSession(port: port)
        let (payload, digest) = randomPayload(64 << 20)
        let (stream, collected) = try await openCollectingStream(session)
        let received = try await exchange(on: stream, payload: payload, collector: collected)
        #expect(received == Received(count: 64 << 20, digest: digest))
        // Go's windows stay at 256 KiB; ours may have grown, never past the cap.
        let metrics = try await session.metrics().get()
        #expect(metrics.streams.allSatisfy { $0.receiveWindow <= MultiplexerConfiguration().maxStreamWindowSize })
        try await session.close().get()
    }

    @Test func goOpensStreamsToSwiftWhichEchoes() async throws {
        let serverSession = testGroup.next().makePromise(of: MultiplexerSession.self)
        let listener = try await listen { channel in
            MultiplexerSession.configure(on: channel, role: .server, inboundStreamInitializer: EchoHandler.initializer)
                .map { serverSession.succeed($0) }
        }
        defer { listener.close(promise: nil) }
        let port = try #require(listener.localAddress?.port)
        let peer = try ChildProcess(try await GoPeer.binary(),
                                    ["dial", "-port", "\(port)", "-streams", "100", "-size", "300000"])
        defer { peer.terminate() }
        #expect(try await peer.waitForExit(timeout: .seconds(60)) == 0, "\(peer.output)")
        #expect(peer.output.contains("DIAL-OK 100"))
        let metrics = try await serverSession.futureResult.get().metrics().get()
        #expect(metrics.streamsAccepted == 100)
        #expect(metrics.protocolErrors == 0)
    }

    @Test func bothSidesOpenStreamsOnOneSession() async throws {
        let (peer, port) = try await GoPeer.serve(["-open", "20", "-size", "100000"])
        defer { peer.terminate() }
        let session = try await connectSession(port: port, initializer: EchoHandler.initializer)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<20 {
                group.addTask {
                    let (payload, digest) = randomPayload(100_000)
                    let (stream, collected) = try await openCollectingStream(session)
                    let received = try await exchange(on: stream, payload: payload, collector: collected)
                    #expect(received == Received(count: payload.readableBytes, digest: digest))
                }
            }
            try await group.waitForAll()
        }
        try await peer.waitForOutput(containing: "OPENED-OK 20", timeout: .seconds(30))
        let metrics = try await session.metrics().get()
        #expect(metrics.streamsAccepted == 20 && metrics.streamsOpenedLocally == 20)
        try await session.close().get()
    }
}

/// A stream used as an async duplex stream (`NIOAsyncChannel` on top of the stream channel).
@Suite(.serialized, .enabled(if: TestEnvironment.available(GoPeer.available), "needs golang-go and golang-github-hashicorp-yamux-dev"),
       .timeLimit(.minutes(4)))  // The first test may build the Go peer (up to 180 s).
struct AsyncStreamTests {
    @Test func aStreamWorksAsAnAsyncChannelAgainstGo() async throws {
        let (peer, port) = try await GoPeer.serve()
        defer { peer.terminate() }
        let session = try await connectSession(port: port)
        let asyncStream = try await session.openStream { channel in
            channel.eventLoop.makeCompletedFuture {
                try channel.syncOptions?.setOption(.allowRemoteHalfClosure, value: true)
            }
        }.flatMapThrowing { channel in
            try NIOAsyncChannel<ByteBuffer, ByteBuffer>(
                wrappingChannelSynchronously: channel,
                configuration: .init(isOutboundHalfClosureEnabled: true))
        }.get()
        let lines = (0..<1000).map { "line \($0)\n" }
        let echoed = try await asyncStream.executeThenClose { inbound, outbound in
            for line in lines { try await outbound.write(ByteBuffer(string: line)) }
            outbound.finish()  // FIN; Go's echo answers with its own FIN
            var text = ""
            for try await buffer in inbound { text += String(buffer: buffer) }
            return text
        }
        #expect(echoed == lines.joined())
        try await session.close().get()
    }
}
