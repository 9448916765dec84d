import NIOCore
import NIOPosix
import TCPMultiplexer
import Testing
@testable import ThaliBLEBinding

/// With `sourcePerPeer` (and a gateway that connects `fromCarrierSource`), what a Bluetooth peer sends
/// reaches the app from that peer's own loopback address, so the app's per-source limits tell peers apart.
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
}
