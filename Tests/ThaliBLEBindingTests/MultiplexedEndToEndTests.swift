import NIOCore
import NIOPosix
import TCPMultiplexer
import Testing
import ThaliBeacons
import ThaliSSDP
@testable import ThaliBLEBinding

@Suite(.serialized, .enabled(if: BlueZMock.peersPresent, "needs dbus-daemon and python-dbusmock"), .timeLimit(.minutes(1))) struct MultiplexedEndToEndTests {
    let group = MultiThreadedEventLoopGroup.singleton

    /// The whole binding: the central sees the peripheral's advertisement, connects over the (in-process)
    /// Bluetooth transport, handshakes, runs the TCP multiplexer over the one relayed connection and
    /// fetches /NotificationBeacons over HTTP on several streams at once, finding its beacon.
    @Test func beaconsOverTheMultiplexerOverBluetooth() async throws {
        let alice = PrivateKey(), bob = PrivateKey(), carol = PrivateKey()
        let announcement = try BeaconGenerator(identity: alice).makeAnnouncement(for: [carol.publicKey, bob.publicKey],
                                                                               validity: .seconds(60))
        let receiver = BeaconReceiver(identity: bob)
        try receiver.addressBook.add(alice.publicKey)

        let mock = try await BlueZMock()
        try await mock.addAdapter("hci0")
        try await mock.addAdapter("hci1")
        let air = InProcessBluetoothAir()
        let aliceAddress = BluetoothAddress("00:1A:7D:DA:71:2A")!
        let bobAddress = BluetoothAddress("00:1A:7D:DA:71:2B")!

        // Alice (peripheral): beacons over HTTP behind a multiplexer, behind the Bluetooth server.
        let http = BeaconHTTPServer(host: "127.0.0.1", group: group)
        http.setBeacons(announcement.stream)
        let httpPort = try await http.start()
        let muxApp = try await ServerBootstrap(group: group)
            .childChannelInitializer { child in
                MultiplexerSession.configure(
                    on: child, role: .server,
                    inboundStreamInitializer: MultiplexerBridge.connectingInitializer(host: "127.0.0.1", port: httpPort)
                ).map { _ in }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        let server = BluetoothRelayServer(transport: air.transport(for: aliceAddress), group: group,
                                          appPort: try #require(muxApp.localAddress?.port))
        try await server.start(channel: 1)
        let peripheral = try BlueZClient(configuration: BlueZConfiguration(busAddress: mock.busAddress, adapterName: "hci0"))
        defer { peripheral.close() }
        try await peripheral.advertise(ThaliAdvertisement(payload: .bluetoothAddress(aliceAddress)))

        // Bob (central): scan, find, connect, handshake.
        let central = try BlueZClient(configuration: BlueZConfiguration(busAddress: mock.busAddress, adapterName: "hci1"))
        defer { central.close() }
        let discoveries = try await central.scan()
        try await EndToEndTests.carryAdvertisement(mock: mock, from: peripheral, toAdapter: "hci1", advertiser: "5E:00:00:00:00:03")
        var iterator = discoveries.makeAsyncIterator()
        let target = try #require(try await iterator.next()?.peerAddress)
        #expect(target == aliceAddress)
        let relay = try await BluetoothRelayClient(transport: air.transport(for: bobAddress), group: group)
            .connect(to: target, channel: 1, hasNotifications: false)

        // The multiplexer over the single relayed connection; a local port whose connections are streams.
        let carrier = try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: relay.localPort).get()
        let session = try await MultiplexerSession.configure(on: carrier, role: .client).get()
        let bridge = try await MultiplexerBridge.listen(forwardingTo: session).get()
        let streamPort = try #require(bridge.localAddress?.port)
        let location = BeaconLocation(host: "127.0.0.1", port: streamPort)
        let httpClient = BeaconHTTPClient(group: group)

        let bytes = try await httpClient.fetch(location)
        let match = try receiver.receive(bytes)
        #expect(match.sender == alice.publicKey)

        // Several streams at once over the one Bluetooth connection.
        let results = try await withThrowingTaskGroup(of: [UInt8].self) { fetchGroup in
            for _ in 0..<4 { fetchGroup.addTask { try await httpClient.fetch(location) } }
            var results: [[UInt8]] = []
            for try await result in fetchGroup { results.append(result) }
            return results
        }
        #expect(results.count == 4)
        #expect(results.allSatisfy { $0 == announcement.stream })
        #expect(http.counters.requestsAnswered == 5)
        let metrics = try await session.metrics().get()
        #expect(metrics.streamsOpenedLocally == 5)

        try await session.close().get()
        try await relay.closeFuture.get()
        try? await bridge.close()
        server.stop()
        await http.stop()
        try? await muxApp.close()
    }
}
