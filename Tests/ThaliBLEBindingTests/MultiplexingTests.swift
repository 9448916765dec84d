import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import TCPMultiplexer
import Testing
@testable import ThaliBLEBinding

@Suite(.timeLimit(.minutes(1))) struct MultiplexingTests {
    let group = MultiThreadedEventLoopGroup.singleton

    /// Three TCP connections at once on the central become three streams over one Bluetooth connection,
    /// and three ordinary TCP connections to the peripheral's app.
    @Test func severalConnectionsOverOneBluetoothStream() async throws {
        let air = InProcessBluetoothAir()
        let app = try await EchoApp(group: group)
        let gateway = try await MultiplexedAppGateway.start(group: group, forwardingTo: app.port)
        let server = BluetoothRelayServer(transport: air.transport(for: serverAddress), group: group, appPort: gateway.port)
        try await server.start(channel: channelNumber)
        let connection = try await MultiplexedBluetoothClient(transport: air.transport(for: clientAddress), group: group)
            .connect(to: serverAddress, channel: channelNumber, hasNotifications: false)

        try await withThrowingTaskGroup(of: Void.self) { tasks in
            for index in 0..<3 {
                tasks.addTask {
                    let tcp = try await connectTCP(port: connection.localPort, group: group)
                    let message = (0..<(64 << 10)).map { UInt8(truncatingIfNeeded: $0 &+ index * 77) }
                    try await tcp.executeThenClose { inbound, outbound in
                        try await outbound.write(ByteBuffer(bytes: message))
                        let (bytes, _) = try await read(inbound.makeAsyncIterator(), count: message.count)
                        #expect(bytes == message)
                    }
                }
            }
            try await tasks.waitForAll()
        }
        #expect(app.connectionCount == 3)
        #expect(server.counters.relayed == 1)
        #expect(try await connection.session.metrics().get().streamsOpenedLocally == 3)

        await connection.close()
        try await connection.closeFuture.get()
        server.stop()
        await gateway.close()
        await app.stop()
    }

    /// The peripheral opens a stream toward the central the moment its session starts (as a node fetches
    /// the beacons of a central that said `00`): the central, which accepts such streams, gets it, on
    /// every link. Its multiplexer is in place before its relayed connection reads; bytes that reached the
    /// connection before it were dropped, and with them, now and then, that first stream.
    @Test func aStreamThePeripheralOpensAtOnceReachesTheCentral() async throws {
        let air = InProcessBluetoothAir()
        let peripheralApp = try await EchoApp(group: group)
        let centralApp = try await EchoApp(group: group)
        let echoed = NIOLockedValueBox(0)
        let group = self.group
        let gateway = try await MultiplexedAppGateway.start(
            group: group, streamInitializer: MultiplexerBridge.connectingInitializer(host: "127.0.0.1", port: peripheralApp.port),
            onSession: { session in
                Task {
                    guard let tcp = try? await connectTCP(port: session.localPort, group: group) else { return }
                    try? await tcp.executeThenClose { inbound, outbound in
                        try await outbound.write(ByteBuffer(string: "ping"))
                        let (bytes, _) = try await read(inbound.makeAsyncIterator(), count: 4)
                        if bytes == Array("ping".utf8) { echoed.withLockedValue { $0 += 1 } }
                    }
                }
            })
        // A race, so many links; the server lets them all in (64 in 10 s by default).
        var limits = BluetoothBindingLimits()
        limits.maxIncomingConnectionsPerWindow = 1000
        let server = BluetoothRelayServer(transport: air.transport(for: serverAddress), group: group, appPort: gateway.port, limits: limits)
        try await server.start(channel: channelNumber)
        for link in 1...100 {
            // A central of its own each time: the server admits 8 links per address in 10 s.
            let central = try #require(BluetoothAddress(octets: [0x00, 0x1A, 0x7D, 0xDA, 0x72, UInt8(link)]))
            let client = MultiplexedBluetoothClient(transport: air.transport(for: central), group: group)
            let connection = try await client.connect(
                to: serverAddress, channel: channelNumber, hasNotifications: true,
                inboundStreamInitializer: MultiplexerBridge.connectingInitializer(host: "127.0.0.1", port: centralApp.port))
            let reached = await eventually { echoed.withLockedValue { $0 } == link }
            await connection.close()
            #expect(reached, "link \(link): the peripheral's first stream was lost")
            if !reached { break }
        }
        server.stop()
        await gateway.close()
        await peripheralApp.stop()
        await centralApp.stop()
    }
}
