import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing

@testable import ThaliSSDP

/// Collects what reaches the end of a pipeline the secure-connection initializer set up.
private final class Collector: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    let bytes = NIOLockedValueBox<[UInt8]>([])
    let done: EventLoopPromise<Void>
    let expected: Int

    init(expected: Int, done: EventLoopPromise<Void>) {
        self.expected = expected
        self.done = done
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let count = bytes.withLockedValue { bytes in
            bytes += unwrapInboundIn(data).readableBytesView
            return bytes.count
        }
        if count >= expected { done.succeed() }
    }
}

/// The beacon server's optional hook: one port for `/NotificationBeacons` and the app's TLS.
@Suite("Beacon server: TLS on the same port")
struct SecureConnectionHookTests {
    let group = MultiThreadedEventLoopGroup.singleton

    /// Bytes that start like a TLS ClientHello record, sent in awkward pieces.
    static let clientHelloStart: [UInt8] = [0x16, 0x03, 0x01, 0x00, 0x2F, 0x01, 0x00, 0x00, 0x2B, 0x03, 0x03] + Array(repeating: 0xAB, count: 40)

    @Test("a connection whose first byte is 0x16 reaches the initializer with every byte; HTTP is unaffected")
    func tlsFirstByteGoesToTheInitializer() async throws {
        let initialized = NIOLockedValueBox(0)
        let done = group.next().makePromise(of: Void.self)
        let collector = Collector(expected: Self.clientHelloStart.count, done: done)
        var limits = BeaconHTTPServerLimits()
        limits.connectionTimeout = .milliseconds(200)
        let server = BeaconHTTPServer(host: "127.0.0.1", limits: limits, group: group, secureConnectionInitializer: { channel in
            initialized.withLockedValue { $0 += 1 }
            return channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(collector) }
        })
        let port = try await server.start()
        server.setBeacons([1, 2, 3])

        // TLS-looking bytes, split after the first byte and in the middle.
        let client = try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: port).get()
        for piece in [Self.clientHelloStart[0..<1], Self.clientHelloStart[1..<7], Self.clientHelloStart[7...]] {
            try await client.writeAndFlush(client.allocator.buffer(bytes: piece)).get()
            try await Task.sleep(for: .milliseconds(20))
        }
        try await done.futureResult.get()
        #expect(collector.bytes.withLockedValue { $0 } == Self.clientHelloStart)
        #expect(initialized.withLockedValue { $0 } == 1)
        #expect(server.counters.secureConnections == 1)
        // The app's protocol bounds its own time: the HTTP request timeout no longer applies.
        try await Task.sleep(for: .milliseconds(400))
        #expect(client.isActive)
        #expect(server.counters.timedOut == 0)
        try await client.close()

        // Plain HTTP on the same port still gets the beacons, and does not reach the initializer.
        var configuration = BeaconHTTPClientConfiguration()
        configuration.maxAttempts = 1
        let fetched = try await BeaconHTTPClient(configuration: configuration, group: group)
            .fetch(BeaconLocation(host: "127.0.0.1", port: port))
        #expect(fetched == [1, 2, 3])
        #expect(initialized.withLockedValue { $0 } == 1)
        #expect(server.counters.requestsAnswered == 1)
        await server.stop()
    }

    @Test("TLS connections count against the per-source admission limit")
    func tlsConnectionsAreAdmittedLikeRequests() async throws {
        var limits = BeaconHTTPServerLimits()
        limits.maxRequestsPerSource = 2
        limits.sourceWindow = .seconds(30)
        let initialized = NIOLockedValueBox(0)
        let server = BeaconHTTPServer(host: "127.0.0.1", limits: limits, group: group, secureConnectionInitializer: { channel in
            initialized.withLockedValue { $0 += 1 }
            return channel.eventLoop.makeSucceededVoidFuture()
        })
        let port = try await server.start()
        var clients: [Channel] = []
        for _ in 0..<3 {
            let client = try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: port).get()
            // The refused one may be closed before its bytes leave.
            try? await client.writeAndFlush(client.allocator.buffer(bytes: Self.clientHelloStart)).get()
            clients.append(client)
        }
        // Admission runs in each accepted channel's initializer, on that channel's event loop, so the
        // refused one need not be the third to connect: wait (bounded) until one is closed.
        let deadline = ContinuousClock.now + .seconds(5)
        while clients.allSatisfy(\.isActive) && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(20)) }
        #expect(initialized.withLockedValue { $0 } == 2)
        #expect(server.counters.rejectedPerSource == 1)
        #expect(clients.filter { !$0.isActive }.count == 1)
        for client in clients { try? await client.close() }
        await server.stop()
    }
}
