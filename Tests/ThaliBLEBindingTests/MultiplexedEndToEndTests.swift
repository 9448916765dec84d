import NIOCore
import NIOPosix
import TCPMultiplexer
import Testing
import ThaliBeacons
import ThaliPSKTLS
import ThaliSSDP
@testable import ThaliBLEBinding

/// On the peripheral, routes each stream the central opens by its first octet: `0x16` (a TLS handshake
/// record) to the PSK-TLS server, anything else to the `/NotificationBeacons` server — the app's
/// demultiplexer for this test. The joining itself is the multiplexer's own bridge (half-closes carried
/// as FINs); the router only holds the first reads until the bridge is in place.
final class FirstOctetRouter: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    let httpPort: Int
    let tlsPort: Int
    private var held: [ByteBuffer] = []
    private var routing = false

    init(httpPort: Int, tlsPort: Int) {
        self.httpPort = httpPort
        self.tlsPort = tlsPort
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        held.append(buffer)
        guard !routing else { return }
        routing = true
        let port = buffer.getInteger(at: buffer.readerIndex, as: UInt8.self) == 0x16 ? tlsPort : httpPort
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        MultiplexerBridge.connectingInitializer(host: "127.0.0.1", port: port)(context.channel).whenComplete { result in
            let (router, context) = bound.value
            switch result {
            case .success:
                // The bridge's stream half now follows this handler: hand it what arrived meanwhile.
                for buffer in router.held { context.fireChannelRead(router.wrapInboundOut(buffer)) }
                router.held.removeAll()
                context.fireChannelReadComplete()
                context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
            case .failure:
                context.close(promise: nil)
            }
        }
    }
}

@Suite(.serialized, .enabled(if: BlueZMock.peersPresent, "needs dbus-daemon and python-dbusmock"), .timeLimit(.minutes(1))) struct MultiplexedEndToEndTests {
    let group = MultiThreadedEventLoopGroup.singleton

    /// The whole binding: the central sees the peripheral's advertisement, connects over the (in-process)
    /// Bluetooth transport, handshakes, runs the TCP multiplexer over the one relayed connection, fetches
    /// /NotificationBeacons over HTTP, finds its beacon, and opens a PSK-TLS connection with the beacon's
    /// identity while more HTTP fetches run on other streams at the same time.
    @Test func beaconsAndPSKTLSOverTheMultiplexerOverBluetooth() async throws {
        let alice = PrivateKey(), bob = PrivateKey(), carol = PrivateKey()
        let announcement = try BeaconGenerator(identity: alice).makeAnnouncement(for: [carol.publicKey, bob.publicKey],
                                                                               validity: .seconds(60))
        let pskTable = AdvertisedPSKTable()
        pskTable.register(announcement)
        let receiver = BeaconReceiver(identity: bob)
        try receiver.addressBook.add(alice.publicKey)

        let mock = try await BlueZMock()
        try await mock.addAdapter("hci0")
        try await mock.addAdapter("hci1")
        let air = InProcessBluetoothAir()
        let aliceAddress = BluetoothAddress("00:1A:7D:DA:71:2A")!
        let bobAddress = BluetoothAddress("00:1A:7D:DA:71:2B")!

        // Alice (peripheral): beacons over HTTP, PSK-TLS echo, both behind a multiplexer, behind the
        // Bluetooth server.
        let http = BeaconHTTPServer(host: "127.0.0.1", group: group)
        http.setBeacons(announcement.stream)
        let httpPort = try await http.start()
        var tlsConfiguration = PSKTLSConfiguration()
        tlsConfiguration.dhGroup = .ffdhe2048
        let tls = try await PSKTLSServer.serve(host: "127.0.0.1", port: 0, configuration: tlsConfiguration,
                                               eventLoopGroup: group) { identity in pskTable.lookup(identity: identity)?.psk }
        let echo = Task {
            for await connection in tls.connections {
                try? await connection.executeThenClose { inbound, outbound in
                    for try await buffer in inbound { try await outbound.write(buffer) }
                }
            }
        }
        let tlsPort = tls.port
        let gateway = try await MultiplexedAppGateway.start(group: group) { stream in
            stream.eventLoop.makeCompletedFuture {
                try stream.pipeline.syncOperations.addHandler(FirstOctetRouter(httpPort: httpPort, tlsPort: tlsPort))
            }
        }
        let server = BluetoothRelayServer(transport: air.transport(for: aliceAddress), group: group,
                                          appPort: gateway.port)
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
        let connection = try await MultiplexedBluetoothClient(transport: air.transport(for: bobAddress), group: group)
            .connect(to: target, channel: 1, hasNotifications: false)
        let streamPort = connection.localPort
        let location = BeaconLocation(host: "127.0.0.1", port: streamPort)
        let httpClient = BeaconHTTPClient(group: group)

        let bytes = try await httpClient.fetch(location)
        let match = try receiver.receive(bytes)
        #expect(match.sender == alice.publicKey)

        // PSK-TLS with the beacon's identity, while three more fetches run on their own streams.
        let tlsConnection = try await PSKTLSClient(configuration: tlsConfiguration, eventLoopGroup: group)
            .connect(host: "127.0.0.1", port: streamPort, identity: match.pskIdentity, psk: match.psk)
        #expect(tlsConnection.parameters.cipherSuite == "DHE-PSK-AES256-GCM-SHA384")
        #expect(tlsConnection.parameters.pskIdentity == match.pskIdentity)
        try await tlsConnection.executeThenClose { inbound, outbound in
            async let fetches = withThrowingTaskGroup(of: [UInt8].self) { fetchGroup in
                for _ in 0..<3 { fetchGroup.addTask { try await httpClient.fetch(location) } }
                var results: [[UInt8]] = []
                for try await result in fetchGroup { results.append(result) }
                return results
            }
            let message = Array("hello alice, it is bob".utf8)
            try await outbound.write(ByteBuffer(bytes: message))
            var echoed: [UInt8] = []
            var tlsIterator = inbound.makeAsyncIterator()
            while echoed.count < message.count, var buffer = try await tlsIterator.next() {
                echoed += buffer.readBytes(length: buffer.readableBytes) ?? []
            }
            #expect(echoed == message)
            let results = try await fetches
            #expect(results.count == 3)
            #expect(results.allSatisfy { $0 == announcement.stream })
        }
        #expect(http.counters.requestsAnswered == 4)
        #expect(tls.statistics.established == 1)
        // All of it ran as streams of the one multiplexer session over the one Bluetooth connection.
        #expect(try await connection.session.metrics().get().streamsOpenedLocally == 5)
        #expect(server.counters.relayed == 1)

        await connection.close()
        try await connection.closeFuture.get()
        server.stop()
        await tls.close()
        echo.cancel()
        await http.stop()
        await gateway.close()
    }
}
