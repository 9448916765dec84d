import NIOCore
import NIOPosix
import Testing
import TCPMultiplexer
@testable import ThaliBLEBinding

/// What an unauthenticated Bluetooth client can hold (issue 12): relays admitted after the one-octet
/// handshake are cut when they stay silent or idle, and the multiplexer that runs below TLS gets the
/// small pre-authentication bounds. The in-process transport stands in for RFCOMM (no radio here); the
/// relays and the app are real sockets.
@Suite("Bluetooth pre-authentication limits", .serialized, .timeLimit(.minutes(1)))
struct PreAuthenticationLimitsTests {
    let group = MultiThreadedEventLoopGroup.singleton
    let server = BluetoothAddress("00:00:00:00:AA:01")!
    let channel: UInt8 = 7

    @Test("16 clients that say hello and then nothing are cut; an honest client is served again")
    func silentClientsDoNotHoldTheSlots() async throws {
        let air = InProcessBluetoothAir()
        let app = try await EchoApp(group: group)
        var limits = BluetoothBindingLimits()
        limits.relayFirstBytesTimeout = .milliseconds(300)
        limits.maxIncomingConnectionsPerWindow = 1000
        let relayServer = BluetoothRelayServer(transport: air.transport(for: server), group: group, appPort: app.port, limits: limits)
        try await relayServer.start(channel: channel)
        var silent: [BluetoothClientRelay] = []
        for index in 0..<limits.maxConcurrentIncomingConnections {
            let address = BluetoothAddress(octets: [0, 0, 0, 1, 0, UInt8(index)])!
            silent.append(try await BluetoothRelayClient(transport: air.transport(for: address), group: group)
                .connect(to: server, channel: channel, hasNotifications: false))
        }
        // Every slot is held by a silent client: the server cuts them after relayFirstBytesTimeout.
        for relay in silent { try await relay.closeFuture.get() }
        #expect(relayServer.counters.silentRelaysClosed == limits.maxConcurrentIncomingConnections)

        let honest = try await BluetoothRelayClient(transport: air.transport(for: BluetoothAddress("00:00:00:02:00:01")!), group: group)
            .connect(to: server, channel: channel, hasNotifications: true)
        let tcp = try await connectTCP(port: honest.localPort, group: group)
        try await tcp.executeThenClose { inbound, outbound in
            try await outbound.write(ByteBuffer(string: "hello"))
            var iterator = inbound.makeAsyncIterator()
            let reply = try #require(try await iterator.next())
            #expect(String(buffer: reply) == "hello")
        }
        #expect(relayServer.counters.gate.refusedBusy == 0, "no client was refused for lack of a slot")
        relayServer.stop()
        await app.stop()
    }

    @Test("a relay on which nothing moves for relayIdleTimeout is closed")
    func idleRelaysAreClosed() async throws {
        let air = InProcessBluetoothAir()
        let app = try await EchoApp(group: group)
        var limits = BluetoothBindingLimits()
        limits.relayIdleTimeout = .milliseconds(400)
        let relayServer = BluetoothRelayServer(transport: air.transport(for: server), group: group, appPort: app.port, limits: limits)
        try await relayServer.start(channel: channel)
        let relay = try await BluetoothRelayClient(transport: air.transport(for: BluetoothAddress("00:00:00:03:00:01")!), group: group)
            .connect(to: server, channel: channel, hasNotifications: false)
        let tcp = try await connectTCP(port: relay.localPort, group: group)
        try await tcp.executeThenClose { inbound, outbound in
            try await outbound.write(ByteBuffer(string: "ping"))
            var iterator = inbound.makeAsyncIterator()
            _ = try await iterator.next()
            // Then silence: the server closes the relay, and the local connection ends.
            while try await iterator.next() != nil {}
        }
        try await relay.closeFuture.get()
        #expect(relayServer.counters.idleRelaysClosed == 1)
        relayServer.stop()
        await app.stop()
    }

    @Test("the gateway's multiplexer below TLS refuses streams beyond the pre-authentication bound")
    func gatewayBoundsStreamsBeforeAuthentication() async throws {
        let app = try await EchoApp(group: group)
        let gateway = try await MultiplexedAppGateway.start(group: group, forwardingTo: app.port)
        let bound = MultiplexerConfiguration.beforeAuthentication
        #expect(bound.maxConcurrentStreams <= 8)
        #expect(bound.maxSessionReceiveBuffer <= 2 << 20)
        // An unauthenticated client on the gateway's port opens as many streams as it can.
        let carrier = try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: gateway.port).get()
        let session = try await MultiplexerSession.configure(on: carrier, role: .client).get()
        var opened = 0
        for _ in 0..<64 {
            guard let stream = try? await session.openStream().get() else { break }
            _ = stream
            opened += 1
        }
        // The gateway reads the opens before the ping and answers the ones it refuses (a reset) before the
        // ping's answer: once that is back, the client's open streams are the ones the gateway took.
        _ = try await session.ping().get()
        let taken = try await session.metrics().get().openStreams
        #expect(opened > bound.maxConcurrentStreams && taken <= bound.maxConcurrentStreams,
                "streams taken before authentication: \(taken) of \(opened)")
        // Each one it took becomes a local connection to the app.
        #expect(await eventually { app.accepted.withLockedValue { $0.count } >= taken })
        let local = app.accepted.withLockedValue { $0.filter(\.isActive).count }
        #expect(local <= bound.maxConcurrentStreams, "local connections to the app bounded: \(local)")
        _ = try? await session.close().get()
        await gateway.close()
        await app.stop()
    }
}
