import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import TCPMultiplexer
import Testing
import ThaliPSKTLS
@testable import ThaliNodeCore

/// The one capability both bindings use: PSK-TLS, the peer resolved once from the lookup, then the
/// multiplexer, over real loopback TCP and OpenSSL.
@Suite(.timeLimit(.minutes(1))) struct AuthenticatedSessionTests {
    let group = MultiThreadedEventLoopGroup.singleton
    static let psk: [UInt8] = Array(repeating: 0x42, count: 32)

    /// A server whose lookup knows `known` (identity → peer name) and records how often it was asked;
    /// each inbound stream reports the peer it was given and its first bytes.
    func server(known: [String: String], lookups: NIOLockedValueBox<Int>,
                streams: AsyncStream<(String, String)>.Continuation,
                peers: NIOLockedValueBox<[EventLoopFuture<String>]>) async throws -> Channel {
        let context = try PSKTLSContext(role: .server, configuration: PSKTLSConfiguration(dhGroup: .ffdhe2048))
        return try await ServerBootstrap(group: group).childChannelInitializer { child in
            AuthenticatedSession.configureServer(on: child, context: context, lookup: { identity in
                lookups.withLockedValue { $0 += 1 }
                return known[identity].map { (Self.psk, $0) }
            }, inboundStream: { stream, peer in
                stream.eventLoop.makeCompletedFuture {
                    try stream.pipeline.syncOperations.addHandler(FirstBytesReporter { streams.yield((peer, $0)) })
                }
            }).map { server in
                peers.withLockedValue { $0.append(server.peer) }
            }
        }.bind(host: "127.0.0.1", port: 0).get()
    }

    func connect(to server: Channel, identity: String) async throws -> AuthenticatedSession.Client {
        let context = try PSKTLSContext(role: .client)
        return try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: server.localAddress?.port ?? 0) { channel in
            AuthenticatedSession.configureClient(on: channel, context: context, identity: identity, psk: Self.psk)
        }
    }

    @Test func streamsReachTheServerWithThePeerItsLookupNamed() async throws {
        let lookups = NIOLockedValueBox(0)
        let peers = NIOLockedValueBox<[EventLoopFuture<String>]>([])
        let (streams, sink) = AsyncStream.makeStream(of: (String, String).self)
        let server = try await server(known: ["identity-bob": "bob"], lookups: lookups, streams: sink, peers: peers)
        defer { server.close(promise: nil) }

        let client = try await connect(to: server, identity: "identity-bob")
        let parameters = try await client.handshake.get()
        #expect(parameters.pskIdentity == "identity-bob")
        for text in ["one", "two"] {
            let stream = try await client.session.openStream().get()
            try await stream.writeAndFlush(ByteBuffer(string: text))
        }
        var iterator = streams.makeAsyncIterator()
        var seen: [String] = []
        for _ in 0..<2 {
            let (peer, text) = try #require(await iterator.next())
            #expect(peer == "bob")
            seen.append(text)
        }
        #expect(seen.sorted() == ["one", "two"])
        #expect(try await peers.withLockedValue { $0 }.first?.get() == "bob")
        // Resolved once, during the handshake: not again per stream.
        #expect(lookups.withLockedValue { $0 } == 1)
        try await client.session.channel.close()
    }

    @Test func anIdentityTheLookupDoesNotKnowFailsTheHandshakeAndOpensNothing() async throws {
        let lookups = NIOLockedValueBox(0)
        let peers = NIOLockedValueBox<[EventLoopFuture<String>]>([])
        let (streams, sink) = AsyncStream.makeStream(of: (String, String).self)
        let server = try await server(known: ["identity-bob": "bob"], lookups: lookups, streams: sink, peers: peers)
        defer { server.close(promise: nil) }

        let client = try await connect(to: server, identity: "identity-mallory")
        await #expect {
            _ = try await client.handshake.get()
        } throws: { error in
            (error as? PSKTLSError)?.reason == .alertReceived(.unknownPSKIdentity)
        }
        await #expect(throws: (any Error).self) { _ = try await peers.withLockedValue { $0 }.first?.get() }
        sink.finish()
        var iterator = streams.makeAsyncIterator()
        #expect(await iterator.next() == nil)
    }
}

/// Reports the first bytes a stream receives, as text.
private final class FirstBytesReporter: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    let report: @Sendable (String) -> Void

    init(_ report: @escaping @Sendable (String) -> Void) { self.report = report }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        report(String(buffer: unwrapInboundIn(data)))
    }
}
