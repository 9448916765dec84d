import NIOCore
import NIOPosix
import TCPMultiplexer
import Testing
@testable import ThaliBLEBinding

/// One Bluetooth link per pair, seen from the relay: with `sourcePerPeer` (and a gateway that connects
/// `fromCarrierSource`), what a Bluetooth peer sends reaches the app from that peer's own loopback
/// address, so the app's per-source limits tell peers apart; and the same link carries streams back.
@Suite(.timeLimit(.minutes(1))) struct LoopbackSourceTests {
    let group = MultiThreadedEventLoopGroup.singleton

    @Test func theLoopbackSourceIsDistinctPerAddressAndNeverTheUsualOne() {
        #expect(BluetoothAddress("00:1A:7D:DA:71:13")!.loopbackSource == "127.218.113.19")
        #expect(BluetoothAddress("AA:BB:CC:00:00:01")!.loopbackSource == "127.0.0.2")
        #expect(BluetoothAddress("AA:BB:CC:00:00:00")!.loopbackSource == "127.0.0.2")
    }

    @Test func eachPeersStreamsReachTheAppFromItsOwnSource() async throws {
        let air = InProcessBluetoothAir()
        let peripheral = BluetoothAddress("00:1A:7D:DA:71:0A")!
        let app = try await EchoApp(group: group)
        defer { Task { await app.stop() } }
        let gateway = try await MultiplexedAppGateway.start(
            group: group, streamInitializer: MultiplexerBridge.connectingInitializer(host: "127.0.0.1", port: app.port,
                                                                                     fromCarrierSource: true))
        let server = BluetoothRelayServer(transport: air.transport(for: peripheral), group: group, appPort: gateway.port,
                                          sourcePerPeer: true)
        try await server.start(channel: 3)
        defer { server.stop() }

        var expected: Set<String> = []
        var sources: Set<String> = []
        for central in [BluetoothAddress("00:1A:7D:DA:71:0B")!, BluetoothAddress("00:1A:7D:DA:72:0C")!] {
            let connection = try await MultiplexedBluetoothClient(transport: air.transport(for: central), group: group)
                .connect(to: peripheral, channel: 3, hasNotifications: false)
            let tcp = try await connectTCP(port: connection.localPort, group: group)
            try await tcp.executeThenClose { inbound, outbound in
                try await outbound.write(ByteBuffer(string: "hi"))
                #expect(try await read(inbound.makeAsyncIterator(), count: 2).0 == Array("hi".utf8))
                // While the app's connection is open (a closed channel forgets its remote address).
                sources.formUnion(app.accepted.withLockedValue { $0 }.compactMap { $0.remoteAddress?.ipAddress })
            }
            expected.insert(central.loopbackSource)
            await connection.close()
        }
        #expect(sources == expected)
    }

    @Test func thePeripheralReachesTheCentralsAppOverTheSameLink() async throws {
        let air = InProcessBluetoothAir()
        let peripheral = BluetoothAddress("00:1A:7D:DA:71:0A")!, central = BluetoothAddress("00:1A:7D:DA:71:0B")!
        let (peripheralApp, centralApp) = (try await EchoApp(group: group), try await EchoApp(group: group))
        defer { Task { await peripheralApp.stop(); await centralApp.stop() } }
        let (sessions, sink) = AsyncStream.makeStream(of: MultiplexedAppGateway.Session.self)
        let gateway = try await MultiplexedAppGateway.start(
            group: group, streamInitializer: MultiplexerBridge.connectingInitializer(host: "127.0.0.1", port: peripheralApp.port),
            onSession: { sink.yield($0) })
        let server = BluetoothRelayServer(transport: air.transport(for: peripheral), group: group, appPort: gateway.port,
                                          sourcePerPeer: true)
        try await server.start(channel: 3)
        defer { server.stop() }
        let connection = try await MultiplexedBluetoothClient(transport: air.transport(for: central), group: group)
            .connect(to: peripheral, channel: 3, hasNotifications: false,
                     inboundStreamInitializer: MultiplexerBridge.connectingInitializer(host: "127.0.0.1", port: centralApp.port))
        var iterator = sessions.makeAsyncIterator()
        let session = try #require(await iterator.next())
        #expect(session.source == central.loopbackSource)
        // The other way over the one link: the peripheral's local port reaches the central's app.
        let tcp = try await connectTCP(port: session.localPort, group: group)
        try await tcp.executeThenClose { inbound, outbound in
            try await outbound.write(ByteBuffer(string: "back"))
            #expect(try await read(inbound.makeAsyncIterator(), count: 4).0 == Array("back".utf8))
        }
        #expect(air.connectionCount == 1)
        await connection.close()
        try await session.closeFuture.get()
    }
}
