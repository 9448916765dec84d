import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import Testing
import ThaliBeacons
import ThaliSSDP
@testable import ThaliBLEBinding

/// A minimal `/NotificationBeacons` server standing in for the peripheral's app (204 when empty, else
/// 200 with the octet stream), so the relay carries real HTTP.
final class BeaconsApp: @unchecked Sendable {
    final class Handler: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = HTTPServerRequestPart
        typealias OutboundOut = HTTPServerResponsePart
        let body: [UInt8]
        var path = ""
        init(body: [UInt8]) { self.body = body }
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            switch unwrapInboundIn(data) {
            case .head(let head): path = head.uri
            case .body: break
            case .end:
                let found = path == "/NotificationBeacons"
                var headers = HTTPHeaders()
                headers.add(name: "Content-Type", value: "application/octet-stream")
                headers.add(name: "Cache-Control", value: "no-cache")
                headers.add(name: "Content-Length", value: found ? "\(body.count)" : "0")
                context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: found ? .ok : .notFound,
                                                                     headers: headers))), promise: nil)
                if found { context.write(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(bytes: body)))), promise: nil) }
                context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
            }
        }
    }

    let channel: any Channel
    var port: Int { channel.localAddress!.port! }

    init(group: any EventLoopGroup, body: [UInt8]) async throws {
        channel = try await ServerBootstrap(group: group)
            .childChannelInitializer { child in
                child.eventLoop.makeCompletedFuture {
                    try child.pipeline.syncOperations.configureHTTPServerPipeline()
                    try child.pipeline.syncOperations.addHandler(Handler(body: body))
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
    }

    func stop() async { try? await channel.close() }
}

/// GETs `/NotificationBeacons` over a plain TCP connection to `port`; returns the response head (text)
/// and body (the `Content-Length` octets after it).
func fetchBeacons(port: Int, group: any EventLoopGroup) async throws -> (head: String, body: [UInt8]) {
    let tcp = try await connectTCP(port: port, group: group)
    return try await tcp.executeThenClose { inbound, outbound in
        try await outbound.write(ByteBuffer(string: "GET /NotificationBeacons HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"))
        var response: [UInt8] = []
        let separator: [UInt8] = Array("\r\n\r\n".utf8)
        for try await var buffer in inbound {
            response += buffer.readBytes(length: buffer.readableBytes) ?? []
            guard let end = response.indices.first(where: { response[$0...].starts(with: separator) }) else { continue }
            let head = String(decoding: response[..<end], as: UTF8.self)
            let length = head.split(separator: "\r\n")
                .first { $0.lowercased().hasPrefix("content-length:") }
                .flatMap { Int($0.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces)) } ?? 0
            let body = Array(response[(end + separator.count)...])
            if body.count >= length { return (head, Array(body.prefix(length))) }
        }
        return (String(decoding: response, as: UTF8.self), [])
    }
}

@Suite(.serialized, .enabled(if: BlueZMock.peersPresent, "needs dbus-daemon and python-dbusmock"), .timeLimit(.minutes(1))) struct EndToEndTests {
    let group = MultiThreadedEventLoopGroup.singleton

    /// The same path with the suite's real parts on both ends: the peripheral (Alice) serves a
    /// ThaliBeacons announcement with ThaliSSDP's `/NotificationBeacons` server; the central (Bob)
    /// fetches it through the Bluetooth relay with ThaliSSDP's HTTP client and finds his beacon in it
    /// with ThaliBeacons' receiver.
    @Test func contactFindsItsBeaconOverTheBluetoothRelay() async throws {
        let alice = PrivateKey(), bob = PrivateKey(), carol = PrivateKey()
        let announcement = try BeaconGenerator(identity: alice).makeAnnouncement(for: [carol.publicKey, bob.publicKey],
                                                                               validity: .seconds(60))
        let receiver = BeaconReceiver(identity: bob)
        try receiver.addressBook.add(alice.publicKey)

        let mock = try await BlueZMock()
        try await mock.addAdapter("hci0")
        try await mock.addAdapter("hci1")
        let air = InProcessBluetoothAir()
        let aliceAddress = BluetoothAddress("00:1A:7D:DA:71:1A")!
        let bobAddress = BluetoothAddress("00:1A:7D:DA:71:1B")!

        let http = BeaconHTTPServer(host: "127.0.0.1", group: group)
        http.setBeacons(announcement.stream)
        let httpPort = try await http.start()
        let server = BluetoothRelayServer(transport: air.transport(for: aliceAddress), group: group, appPort: httpPort)
        try await server.start(channel: 1)
        let peripheral = try BlueZClient(configuration: BlueZConfiguration(busAddress: mock.busAddress, adapterName: "hci0"))
        defer { peripheral.close() }
        try await peripheral.advertise(ThaliAdvertisement(payload: .bluetoothAddress(aliceAddress)))

        let central = try BlueZClient(configuration: BlueZConfiguration(busAddress: mock.busAddress, adapterName: "hci1"))
        defer { central.close() }
        let discoveries = try await central.scan()
        try await Self.carryAdvertisement(mock: mock, from: peripheral, toAdapter: "hci1", advertiser: "5E:00:00:00:00:02")
        var iterator = discoveries.makeAsyncIterator()
        let discovery = try #require(try await iterator.next())
        let target = try #require(discovery.peerAddress)
        #expect(target == aliceAddress)

        let relay = try await BluetoothRelayClient(transport: air.transport(for: bobAddress), group: group)
            .connect(to: target, channel: 1, hasNotifications: false)
        let bytes = try await BeaconHTTPClient(group: group).fetch(BeaconLocation(host: "127.0.0.1", port: relay.localPort))
        #expect(bytes == announcement.stream)
        let match = try receiver.receive(bytes)
        #expect(match.sender == alice.publicKey)
        #expect(match.beaconIndex == 1)
        try await relay.closeFuture.get()
        #expect(http.counters.requestsAnswered == 1)
        server.stop()
        await http.stop()
    }

    /// Plays the radio between two adapters of the mock: reads the advertisement `peripheral`
    /// registered (as bluetoothd does) and makes `adapter` report a device advertising it.
    static func carryAdvertisement(mock: BlueZMock, from peripheral: BlueZClient, toAdapter adapter: String,
                                   advertiser: String) async throws
    {
        let properties = try await mock.control.call(
            destination: peripheral.uniqueBusName, path: peripheral.advertisementPath,
            interface: "org.freedesktop.DBus.Properties", member: "GetAll", arguments: [.string("org.bluez.LEAdvertisement1")])
        let advertised = try #require(properties.first?.stringKeyedDictionary)
        #expect(advertised["Type"]?.string == "broadcast")
        let device = try await mock.addDevice(advertiser, adapter: adapter)
        try await mock.updateProperties(device, interface: "org.bluez.Device1",
                                        [("ServiceData", try #require(advertised["ServiceData"]?.unwrapped))])
    }

    /// Peripheral and central each with their own BlueZ client (two adapters of the mock bluetoothd) and
    /// their own Bluetooth address in the in-process air. The test plays the radio: it reads the
    /// advertisement the peripheral registered (as bluetoothd would) and makes the central's adapter
    /// report it. The central then connects, handshakes and fetches the beacons through the relay, over
    /// real TCP on both sides, several times in a row.
    @Test func centralFindsPeripheralConnectsAndFetchesBeacons() async throws {
        let mock = try await BlueZMock()
        try await mock.addAdapter("hci0")
        try await mock.addAdapter("hci1")
        let air = InProcessBluetoothAir()
        let peripheralAddress = BluetoothAddress("00:1A:7D:DA:71:0A")!
        let centralAddress = BluetoothAddress("00:1A:7D:DA:71:0B")!
        let beacons = (0..<(88 + 8 + 48 * 3)).map { UInt8(truncatingIfNeeded: $0 * 7) }

        // Peripheral: its app, the Bluetooth server in front of it, the advertisement.
        let app = try await BeaconsApp(group: group, body: beacons)
        let server = BluetoothRelayServer(transport: air.transport(for: peripheralAddress), group: group, appPort: app.port)
        let serverLog = EventLog(server.events)
        try await server.start(channel: 1)
        let peripheral = try BlueZClient(configuration: BlueZConfiguration(busAddress: mock.busAddress, adapterName: "hci0"))
        defer { peripheral.close() }
        try await peripheral.advertise(ThaliAdvertisement(payload: .bluetoothAddress(peripheralAddress)))

        // Central: scanning.
        let central = try BlueZClient(configuration: BlueZConfiguration(busAddress: mock.busAddress, adapterName: "hci1"))
        defer { central.close() }
        let discoveries = try await central.scan()

        // The radio: what the peripheral registered reaches the central's adapter.
        try await Self.carryAdvertisement(mock: mock, from: peripheral, toAdapter: "hci1", advertiser: "5E:00:00:00:00:01")
        var iterator = discoveries.makeAsyncIterator()
        let discovery = try #require(try await iterator.next())
        #expect(discovery.peerAddress == peripheralAddress)

        // Connect, handshake, relay; fetch the beacons over HTTP, several times.
        let client = BluetoothRelayClient(transport: air.transport(for: centralAddress), group: group)
        for round in 0..<3 {
            let relay = try await client.connect(to: try #require(discovery.peerAddress), channel: 1, hasNotifications: round == 0)
            let response = try await fetchBeacons(port: relay.localPort, group: group)
            #expect(response.head.hasPrefix("HTTP/1.1 200 OK\r\n"))
            #expect(response.head.lowercased().contains("content-type: application/octet-stream"))
            #expect(response.body == beacons)
            try await relay.closeFuture.get()
        }
        // The first connection announced beacons: the peripheral counts it as a discovery of the central.
        #expect(await serverLog.waitFor(.discoveredByConnection(centralAddress)))
        #expect(server.counters.relayed == 3)
        try await central.stopScanning()
        server.stop()
        await app.stop()
    }
}
