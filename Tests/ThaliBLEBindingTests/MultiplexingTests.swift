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
}
