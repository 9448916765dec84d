import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing
import ThaliAdmission
import ThaliPSKTLS
import ThaliTestSupport

/// Our client against our server over loopback sockets.
extension PSKTLSTests {
    @Suite struct LoopbackTests {
        static let lookup: PSKLookup = { $0 == Fixtures.identity192 ? Fixtures.psk : nil }

        static func serve(_ configure: (inout PSKTLSConfiguration) -> Void = { _ in }) async throws -> PSKTLSServer {
            var configuration = PSKTLSConfiguration(dhGroup: .ffdhe2048)
            configure(&configuration)
            return try await PSKTLSServer.serve(host: "127.0.0.1", port: 0, configuration: configuration, lookup: lookup)
        }

        /// Echoes every connection until the client half-closes, then closes.
        static func echo(_ server: PSKTLSServer) -> Task<Void, Never> {
            Task {
                await withDiscardingTaskGroup { group in
                    for await connection in server.connections {
                        group.addTask {
                            try? await connection.executeThenClose { inbound, outbound in
                                for try await buffer in inbound { try await outbound.write(buffer) }
                            }
                        }
                    }
                }
            }
        }

        @Test func noIdentityHintAndTheProfileOnBothSides() async throws {
            try await expectNoLeaks {
                let server = try await Self.serve()
                let client = try await PSKTLSClient.connect(host: "127.0.0.1", port: server.port,
                                                            identity: Fixtures.identity192, psk: Fixtures.psk)
                var connections = server.connections.makeAsyncIterator()
                let accepted = try #require(await connections.next())
                #expect(!client.parameters.serverSentIdentityHint)
                #expect(client.parameters.cipherSuite == accepted.parameters.cipherSuite)
                #expect(accepted.parameters.dhGroupBits == 2048)
                try await client.executeThenClose { _, _ in }
                try await accepted.executeThenClose { inbound, _ in
                    for try await _ in inbound {}  // ends cleanly with the client's close_notify
                }
                await server.close()
            }
        }

        @Test func halfCloseOverSockets() async throws {
            try await expectNoLeaks {
                let server = try await Self.serve()
                let echo = Self.echo(server)
                let connection = try await PSKTLSClient.connect(host: "127.0.0.1", port: server.port,
                                                                identity: Fixtures.identity192, psk: Fixtures.psk)
                let payload = (0..<200_000).map { UInt8(truncatingIfNeeded: $0) }
                try await connection.executeThenClose { inbound, outbound in
                    try await outbound.write(ByteBuffer(bytes: payload))
                    outbound.finish()  // close_notify + TCP half-close; the echo still answers
                    var iterator = inbound.makeAsyncIterator()
                    let echoed = try await readAll(&iterator)
                    #expect(echoed == payload)
                }
                await server.close()
                await echo.value
            }
        }

        @Test func manyConcurrentConnections() async throws {
            try await expectNoLeaks {
                // One client opening 40 at once: more than the per-source defaults allow a stranger, so
                // this server admits that much from one address.
                var admission = AdmissionLimits()
                admission.maxConnectionsPerSource = 40
                admission.maxUnauthenticatedPerSource = 40
                admission.maxOpenPerSource = 40
                admission.maxUnauthenticatedGlobal = 40
                let server = try await PSKTLSServer.serve(host: "127.0.0.1", port: 0,
                                                          configuration: PSKTLSConfiguration(dhGroup: .ffdhe2048),
                                                          admission: admission, lookup: Self.lookup)
                let echo = Self.echo(server)
                let client = try PSKTLSClient()
                try await withThrowingTaskGroup(of: Void.self) { group in
                    for index in 0..<40 {
                        group.addTask {
                            let connection = try await client.connect(host: "127.0.0.1", port: server.port,
                                                                      identity: Fixtures.identity192, psk: Fixtures.psk)
                            try await connection.executeThenClose { inbound, outbound in
                                let message = Array("connection \(index)".utf8)
                                try await outbound.write(ByteBuffer(bytes: message))
                                outbound.finish()
                                var iterator = inbound.makeAsyncIterator()
                                #expect(try await readAll(&iterator) == message)
                            }
                        }
                    }
                    try await group.waitForAll()
                }
                #expect(server.statistics.established == 40)
                #expect(server.statistics.failed == 0)
                await server.close()
                await echo.value
            }
        }

        @Test("one source is refused beyond its unauthenticated slots; another source still gets in")
        func perSourceUnauthenticatedSlots() async throws {
            try await expectNoLeaks {
                var admission = AdmissionLimits()
                admission.maxUnauthenticatedPerSource = 2
                let server = try await PSKTLSServer.serve(host: "127.0.0.1", port: 0,
                                                          configuration: PSKTLSConfiguration(dhGroup: .ffdhe2048),
                                                          admission: admission, lookup: Self.lookup)
                // Two stalled handshakes from 127.0.0.2 (a ClientHello record header, then silence).
                var stalled: [Channel] = []
                for _ in 0..<3 {
                    let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                        .bind(to: try SocketAddress(ipAddress: "127.0.0.2", port: 0))
                        .connect(host: "127.0.0.1", port: server.port).get()
                    try? await channel.writeAndFlush(ByteBuffer(bytes: [0x16, 0x03, 0x01, 0x00, 0x2F])).get()
                    stalled.append(channel)
                }
                _ = try await waitUntil(timeout: .seconds(5)) { !stalled.allSatisfy(\.isActive) }
                #expect(stalled.filter { !$0.isActive }.count == 1, "the third from one source is refused")
                #expect(server.admissionCounters.refusedSourceUnauthenticated == 1)
                // 127.0.0.1 is another source: its handshake completes.
                let connection = try await PSKTLSClient.connect(host: "127.0.0.1", port: server.port,
                                                                identity: Fixtures.identity192, psk: Fixtures.psk)
                var accepted = server.connections.makeAsyncIterator()
                let served = try #require(await accepted.next())
                #expect(server.admissionCounters.authenticated == 1)
                try await connection.executeThenClose { _, _ in }
                try await served.executeThenClose { inbound, _ in for try await _ in inbound {} }
                for channel in stalled { try? await channel.close() }
                await server.close()
            }
        }

        @Test func connectionsOverTheLimitAreRefused() async throws {
            try await expectNoLeaks {
                let server = try await Self.serve { $0.maximumConcurrentConnections = 2 }
                var connections = server.connections.makeAsyncIterator()
                var held: [PSKTLSConnection] = []
                for _ in 0..<2 {
                    held.append(try await PSKTLSClient.connect(host: "127.0.0.1", port: server.port,
                                                               identity: Fixtures.identity192, psk: Fixtures.psk))
                    held.append(try #require(await connections.next()))
                }
                await #expect(throws: (any Error).self) {
                    _ = try await PSKTLSClient.connect(host: "127.0.0.1", port: server.port,
                                                       identity: Fixtures.identity192, psk: Fixtures.psk)
                }
                #expect(server.statistics.refused == 1)
                for connection in held { try await connection.executeThenClose { _, _ in } }
                await server.close()
            }
        }

        @Test func establishedConnectionsNobodyTakesAreBoundedAndClosed() async throws {
            try await expectNoLeaks {
                let server = try await Self.serve { $0.maximumPendingConnections = 1 }
                let first = try await PSKTLSClient.connect(host: "127.0.0.1", port: server.port,
                                                           identity: Fixtures.identity192, psk: Fixtures.psk)
                let second = try await PSKTLSClient.connect(host: "127.0.0.1", port: server.port,
                                                            identity: Fixtures.identity192, psk: Fixtures.psk)
                // The second found the queue full: the server closed it (cleanly, with close_notify).
                try await second.executeThenClose { inbound, _ in
                    var iterator = inbound.makeAsyncIterator()
                    let rest = try await readAll(&iterator)
                    #expect(rest.isEmpty)
                }
                #expect(server.statistics.dropped == 1)
                // The first waits in the queue and works.
                var connections = server.connections.makeAsyncIterator()
                let accepted = try #require(await connections.next())
                async let served: Void = accepted.executeThenClose { inbound, outbound in
                    for try await buffer in inbound { try await outbound.write(buffer) }
                }
                try await first.executeThenClose { inbound, outbound in
                    try await outbound.write(ByteBuffer(string: "still here"))
                    outbound.finish()
                    var iterator = inbound.makeAsyncIterator()
                    #expect(try await readAll(&iterator) == Array("still here".utf8))
                }
                try await served
                await server.close()
            }
        }

        /// Over sockets: a server channel without remote half-closure (a plain `ServerBootstrap`, as the
        /// node's port is) answers a client's close_notify at once although the client keeps its TCP
        /// output open, and closes; the client sees the answer (a clean end) within a few seconds at most.
        @Test func closeNotifyWithTCPKeptOpenIsAnsweredAtOnce() async throws {
            try await expectNoLeaks {
                let context = try PSKTLSContext(role: .server, configuration: PSKTLSConfiguration(dhGroup: .ffdhe2048))
                let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                    .childChannelInitializer { channel in
                        channel.eventLoop.makeCompletedFuture {
                            try channel.pipeline.syncOperations.addHandler(PSKTLSHandler(serverContext: context, lookup: Self.lookup))
                        }
                    }
                    .bind(host: "127.0.0.1", port: 0).get()
                let port = try #require(server.localAddress?.port)
                let clientContext = try PSKTLSContext(role: .client, configuration: PSKTLSConfiguration(dhGroup: .ffdhe2048))
                let handshake = MultiThreadedEventLoopGroup.singleton.next().makePromise(of: PSKTLSNegotiatedParameters.self)
                let recorder = NIOLoopBoundBox<Recorder?>.makeEmptyBox(eventLoop: handshake.futureResult.eventLoop)
                let client = try await ClientBootstrap(group: handshake.futureResult.eventLoop)
                    .channelInitializer { channel in
                        channel.eventLoop.makeCompletedFuture {
                            let log = Recorder()
                            recorder.value = log
                            try channel.pipeline.syncOperations.addHandlers([
                                NetworkSide(),  // swallows the TCP output shutdown: the connection stays open
                                try PSKTLSHandler(clientContext: clientContext, identity: Fixtures.identity192, psk: Fixtures.psk,
                                                  handshakePromise: handshake),
                                log,
                            ])
                        }
                    }
                    .connect(host: "127.0.0.1", port: port).get()
                _ = try await handshake.futureResult.get()
                let sent = ContinuousClock.now
                try await client.close(mode: .output).get()
                // The server's answer closes the client (its close_notify arrives in state outputClosed); a
                // server that does not answer is cut off after 3 s.
                let timedOut = NIOLockedValueBox(false)
                let cutOff = client.eventLoop.scheduleTask(in: .seconds(3)) {
                    timedOut.withLockedValue { $0 = true }
                    client.close(promise: nil)
                }
                try? await client.closeFuture.get()
                cutOff.cancel()
                print("close_notify answered after \(ContinuousClock.now - sent)")
                #expect(!timedOut.withLockedValue { $0 }, "the server did not answer close_notify within 3 s")
                let errors = try await client.eventLoop.submit { recorder.value?.errors.map { "\($0)" } ?? [] }.get()
                #expect(errors.isEmpty, "a clean end, with the server's close_notify: \(errors)")
                try? await client.close()
                try await server.close()
            }
        }

        /// A reader that stops reading makes the writer wait: neither side buffers the whole transfer.
        /// The server side is a plain NIO writer that writes while the channel is writable (what
        /// `PSKTLSHandler` must keep meaningful: it holds no plaintext of its own once the handshake is
        /// done); the client side is the async API with an application that pauses.
        @Test func aSlowReaderStopsTheWriter() async throws {
            try await expectNoLeaks {
                let total = 64 << 20
                let written = ManagedCounter()
                let context = try PSKTLSContext(role: .server, configuration: PSKTLSConfiguration(dhGroup: .ffdhe2048))
                let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                    .childChannelInitializer { channel in
                        channel.eventLoop.makeCompletedFuture {
                            try channel.pipeline.syncOperations.addHandlers(
                                PSKTLSHandler(serverContext: context, lookup: Self.lookup),
                                WritabilityPump(total: total, written: written))
                        }
                    }
                    .bind(host: "127.0.0.1", port: 0).get()
                let port = try #require(server.localAddress?.port)
                let connection = try await PSKTLSClient.connect(host: "127.0.0.1", port: port,
                                                                identity: Fixtures.identity192, psk: Fixtures.psk)
                try await connection.executeThenClose { inbound, _ in
                    var iterator = inbound.makeAsyncIterator()
                    var received = try #require(try await iterator.next()).readableBytes
                    // Stop reading: the server's writes must come to a halt far short of the total. (Wait until
                    // the count stays put for 300 ms, however long a busy machine takes to get there.)
                    let (stalledAt, settled) = try await waitUntilSettled(quiet: .milliseconds(300), timeout: .seconds(20)) { written.value }
                    #expect(settled && written.value == stalledAt, "the writer kept going while nobody read")
                    #expect(stalledAt < total / 4, "wrote \(stalledAt) bytes to a reader that was not reading")
                    // Then read everything: all of it arrives intact, and the stream ends with close_notify.
                    while let buffer = try await iterator.next() {
                        #expect(buffer.readableBytesView.first == 0x5A && buffer.readableBytesView.last == 0x5A)
                        received += buffer.readableBytes
                    }
                    #expect(received == total)
                }
                try await server.close()
            }
        }
    }
}

/// Writes `total` bytes as fast as the channel stays writable, the way NIO code respects backpressure,
/// then closes (which sends close_notify through the TLS handler).
final class WritabilityPump: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    private let total: Int
    private let written: ManagedCounter
    private var sent = 0
    private var started = false

    init(total: Int, written: ManagedCounter) {
        self.total = total
        self.written = written
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case .handshakeCompleted = event as? PSKTLSEvent {
            started = true
            pump(context: context)
        }
        context.fireUserInboundEventTriggered(event)
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if started { pump(context: context) }
        context.fireChannelWritabilityChanged()
    }

    private func pump(context: ChannelHandlerContext) {
        let chunk = ByteBuffer(repeating: 0x5A, count: 64 << 10)
        while sent < total && context.channel.isWritable {
            sent += chunk.readableBytes
            written.add(chunk.readableBytes)
            context.writeAndFlush(wrapOutboundOut(chunk), promise: nil)
        }
        if sent >= total && started {
            started = false
            context.close(promise: nil)
        }
    }
}

/// A counter shared between tasks.
final class ManagedCounter: Sendable {
    private let box = NIOLockedValueBox(0)
    var value: Int { box.withLockedValue { $0 } }
    func add(_ amount: Int) { box.withLockedValue { $0 += amount } }
}
