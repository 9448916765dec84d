import Foundation
import NIOCore
import NIOPosix
import Testing
@testable import ThaliBLEBinding

private let thaliUUID = ThaliAdvertisement.serviceUUIDString
private let peerAddress = BluetoothAddress("00:1A:7D:DA:71:13")!

/// Reads the first element of an async sequence, or nil after `timeout`.
private func first<S: AsyncSequence & Sendable>(_ sequence: S, timeout: Duration = .seconds(5)) async throws -> S.Element?
    where S.Element: Sendable
{
    try await withTimeout(timeout) {
        var iterator = sequence.makeAsyncIterator()
        return try await iterator.next()
    } ?? nil
}

@Suite(.serialized, .enabled(if: BlueZMock.peersPresent, "needs dbus-daemon and python-dbusmock"), .timeLimit(.minutes(1))) struct BlueZClientTests {
    private func makeClient(_ mock: BlueZMock, adapter: String? = nil, timeout: Duration = .seconds(3),
                            filterByServiceUUID: Bool = false) throws -> BlueZClient {
        var configuration = BlueZConfiguration(busAddress: mock.busAddress, adapterName: adapter)
        configuration.callTimeout = timeout
        configuration.filterByServiceUUID = filterByServiceUUID
        return try BlueZClient(configuration: configuration)
    }

    @Test func registersTheAdvertisementWithOurServiceData() async throws {
        let mock = try await BlueZMock()
        let adapter = try await mock.addAdapter()
        let client = try makeClient(mock)
        defer { client.close() }
        try await client.advertise(ThaliAdvertisement(payload: .bluetoothAddress(peerAddress)))

        let registrations = try await mock.calls(adapter, "RegisterAdvertisement")
        #expect(registrations.count == 1)
        #expect(registrations.first?.first == .objectPath(client.advertisementPath))
        let active = try await mock.bluez(adapter, "org.freedesktop.DBus.Properties", "Get",
                                          [.string("org.bluez.LEAdvertisingManager1"), .string("ActiveInstances")])
        #expect(active.first?.unwrapped == .byte(1))

        // Read our object the way bluetoothd does, from another process.
        let script = """
            props = bus.get_object(argv[0], argv[1], introspect=False).GetAll('org.bluez.LEAdvertisement1', \
            dbus_interface='org.freedesktop.DBus.Properties')
            print('TYPE', props['Type'])
            for uuid, value in props['ServiceData'].items(): print('SD', uuid, bytes(value).hex())
            print('KEYS', ','.join(sorted(props.keys())))
            """
        let output = try await mock.python(script, [client.uniqueBusName, client.advertisementPath])
        #expect(output.contains("TYPE broadcast"))
        #expect(output.contains("SD \(thaliUUID) 00001a7dda7113"))
        #expect(output.contains("KEYS ServiceData,Type"))

        // A beacon change: unregister, register again, new data.
        let next = BluetoothAddress("00:1A:7D:DA:71:14")!
        try await client.advertise(ThaliAdvertisement(payload: .bluetoothAddress(next)))
        #expect(try await mock.calls(adapter, "UnregisterAdvertisement").count == 1)
        #expect(try await mock.calls(adapter, "RegisterAdvertisement").count == 2)
        let after = try await mock.python(script, [client.uniqueBusName, client.advertisementPath])
        #expect(after.contains("SD \(thaliUUID) 00001a7dda7114"))

        try await client.stopAdvertising()
        #expect(try await mock.calls(adapter, "UnregisterAdvertisement").count == 2)
    }

    @Test func scanNamesTheThaliUUIDWhenAskedTo() async throws {
        let mock = try await BlueZMock()
        let adapter = try await mock.addAdapter()
        let client = try makeClient(mock, filterByServiceUUID: true)
        defer { client.close() }
        _ = try await client.scan()
        let filters = try await mock.calls(adapter, "SetDiscoveryFilter")
        let filter = try #require(filters.first?.first?.stringKeyedDictionary)
        #expect(filter["UUIDs"]?.stringArray == [thaliUUID])
    }

    @Test func anUnchangedAdvertisementIsReportedAgainOnlyAfterForget() async throws {
        let mock = try await BlueZMock()
        try await mock.addAdapter()
        let client = try makeClient(mock)
        defer { client.close() }
        let stream = try await client.scan()
        let advertiser = BluetoothAddress("7A:11:22:33:44:55")!
        let device = try await mock.addDevice(advertiser.description)
        let report: [(String, DBusValue)] = [("ServiceData", serviceData(thaliUUID, [0] + peerAddress.octets))]
        try await mock.updateProperties(device, interface: "org.bluez.Device1", report)
        #expect(try await first(stream)?.advertiserAddress == advertiser)

        // The same advertisement again: counted, not a discovery.
        try await mock.updateProperties(device, interface: "org.bluez.Device1", [("RSSI", .int16(-40))] + report)
        _ = try await waitUntil(timeout: .seconds(5)) { client.scanCounters.thaliReports >= 2 }
        #expect(client.scanCounters.thaliReports == 2)

        client.forget(advertiser)
        try await mock.updateProperties(device, interface: "org.bluez.Device1", [("RSSI", .int16(-41))] + report)
        #expect(try await first(stream)?.advertiserAddress == advertiser)
        // Exactly one discovery was waiting: the second report was not one (this ends the stream).
        #expect(try await first(stream, timeout: .milliseconds(300)) == nil)
    }

    @Test func scanReportsThaliPeersAndIgnoresOthers() async throws {
        let mock = try await BlueZMock()
        let adapter = try await mock.addAdapter()
        let client = try makeClient(mock)
        defer { client.close() }
        let stream = try await client.scan()

        let filters = try await mock.calls(adapter, "SetDiscoveryFilter")
        let filter = try #require(filters.first?.first?.stringKeyedDictionary)
        // No UUID filter by default: real bluetoothd (5.66) matches it against UUID lists only, and our
        // advertisement carries the UUID in service data alone; the client filters by itself.
        #expect(filter["UUIDs"] == nil)
        #expect(filter["Transport"]?.string == "le")
        #expect(filter["DuplicateData"]?.bool == true)
        #expect(try await mock.calls(adapter, "StartDiscovery").count == 1)

        // Someone else's device: other service data, Apple manufacturer data.
        let other = try await mock.addDevice("11:22:33:44:55:66")
        try await mock.updateProperties(other, interface: "org.bluez.Device1", [
            ("ServiceData", serviceData("0000feaa-0000-1000-8000-00805f9b34fb", [1, 2, 3])),
            ("ManufacturerData", manufacturerData(0x004C, [0x02, 0x15])),
        ])
        // A Thali peer in our form.
        let thali = try await mock.addDevice("7A:11:22:33:44:55")
        try await mock.updateProperties(thali, interface: "org.bluez.Device1", [
            ("ServiceData", serviceData(thaliUUID, [0] + peerAddress.octets)),
        ])
        let found = try #require(try await first(stream))
        #expect(found.advertiserAddress == BluetoothAddress("7A:11:22:33:44:55"))
        #expect(found.peerAddress == peerAddress)
        #expect(found.advertisement.encoding == .serviceData)
        #expect(client.scanCounters.otherReports >= 1)

        // A deployed Android peer in the manufacturer-data form.
        let android = try await mock.addDevice("5B:66:77:88:99:AA")
        let androidAddress = BluetoothAddress("C0:FF:EE:00:00:01")!
        try await mock.updateProperties(android, interface: "org.bluez.Device1", [
            ("ManufacturerData", manufacturerData(7413, [0x02, 0x15] + ThaliAdvertisement.serviceUUID + [4] + androidAddress.octets)),
        ])
        let second = try #require(try await first(stream))
        #expect(second.advertiserAddress == BluetoothAddress("5B:66:77:88:99:AA"))
        #expect(second.peerAddress == androidAddress)
        #expect(second.advertisement.generation == 4)

        // Malformed Thali service data is counted and ignored.
        let broken = try await mock.addDevice("5B:66:77:88:99:AB")
        try await mock.updateProperties(broken, interface: "org.bluez.Device1", [
            ("ServiceData", serviceData(thaliUUID, [0, 1, 2])),
        ])
        #expect(await eventually { client.scanCounters.malformedReports == 1 })
        #expect(client.scanCounters.thaliReports == 2)

        try await client.stopScanning()
        #expect(try await mock.calls(adapter, "StopDiscovery").count == 1)
    }

    @Test func tooManyAdvertisementsSwitchDiscoveryOffForACoolDown() async throws {
        let mock = try await BlueZMock()
        let adapter = try await mock.addAdapter()
        var configuration = BlueZConfiguration(busAddress: mock.busAddress)
        configuration.limits.maxAdvertisementsPerWindow = 3
        configuration.limits.advertisementWindow = .seconds(30)
        configuration.limits.discoveryCoolDown = .milliseconds(300)
        let client = try BlueZClient(configuration: configuration)
        defer { client.close() }
        _ = try await client.scan()
        let device = try await mock.addDevice("7A:11:22:33:44:56")
        for index in 0..<5 {
            try await mock.updateProperties(device, interface: "org.bluez.Device1", [
                ("ServiceData", serviceData(thaliUUID, [UInt8(index)] + peerAddress.octets)),
            ])
        }
        #expect(await eventually { client.scanCounters.rate.coolDowns == 1 })
        #expect(client.scanCounters.rate.accepted == 3)
        #expect(await eventuallyAsync { (try? await mock.calls(adapter, "StopDiscovery").count) == 1 } )
        // After the cool-down discovery starts again.
        #expect(await eventuallyAsync { (try? await mock.calls(adapter, "StartDiscovery").count) == 2 })
    }

    @Test func rememberedAdvertisersAreBounded() async throws {
        let mock = try await BlueZMock()
        try await mock.addAdapter()
        var configuration = BlueZConfiguration(busAddress: mock.busAddress)
        configuration.limits.maxTrackedPeers = 2
        let client = try BlueZClient(configuration: configuration)
        defer { client.close() }
        let stream = try await client.scan()
        let box = UncheckedSendable(stream.makeAsyncIterator())
        var iterator = box.value
        var devices: [String] = []
        for index in 1...3 {
            let device = try await mock.addDevice("7A:00:00:00:00:0\(index)")
            devices.append(device)
            try await mock.updateProperties(device, interface: "org.bluez.Device1", [
                ("ServiceData", serviceData(thaliUUID, [0] + peerAddress.octets)),
            ])
            #expect(try await iterator.next()?.advertiserAddress == BluetoothAddress("7A:00:00:00:00:0\(index)"))
        }
        // The first advertiser was forgotten (only two are kept), so the same data is news again;
        // the third is still remembered and its repeat is not.
        try await mock.updateProperties(devices[2], interface: "org.bluez.Device1", [
            ("ServiceData", serviceData(thaliUUID, [0] + peerAddress.octets)),
        ])
        try await mock.updateProperties(devices[0], interface: "org.bluez.Device1", [
            ("ServiceData", serviceData(thaliUUID, [0] + peerAddress.octets)),
        ])
        #expect(try await iterator.next()?.advertiserAddress == BluetoothAddress("7A:00:00:00:00:01"))
        #expect(client.scanCounters.thaliReports == 5)
    }

    @Test func missingAdapterIsAnError() async throws {
        let mock = try await BlueZMock()
        let client = try makeClient(mock)
        defer { client.close() }
        await #expect(throws: BlueZError.noAdapter(named: nil)) { _ = try await client.adapter() }
        try await mock.addAdapter("hci0")
        let named = try makeClient(mock, adapter: "hci7")
        defer { named.close() }
        await #expect(throws: BlueZError.noAdapter(named: "hci7")) {
            try await named.advertise(ThaliAdvertisement(payload: .iOSDevice))
        }
        #expect(try await client.adapter().address == BluetoothAddress("00:01:02:03:04:05"))
    }

    /// A node turns `Discoverable` on to get page scan, and off again when it stops.
    @Test func discoverableIsSetOnTheChosenAdapter() async throws {
        let mock = try await BlueZMock()
        let adapter = try await mock.addAdapter("hci0")
        let client = try makeClient(mock, adapter: "hci0")
        defer { client.close() }
        func discoverable() async throws -> Bool? {
            try await mock.bluez(adapter, "org.freedesktop.DBus.Properties", "Get",
                                 [.string("org.bluez.Adapter1"), .string("Discoverable")]).first?.unwrapped.bool
        }
        #expect(try await discoverable() == false)
        #expect(try await client.adapter().index == 0)
        try await client.setDiscoverable(true)
        #expect(try await discoverable() == true)
        try await client.setDiscoverable(false)
        #expect(try await discoverable() == false)
    }

    @Test func poweredOffAdapterIsAnError() async throws {
        let mock = try await BlueZMock()
        let adapter = try await mock.addAdapter()
        try await mock.updateProperties(adapter, interface: "org.bluez.Adapter1", [("Powered", .boolean(false))])
        let client = try makeClient(mock)
        defer { client.close() }
        await #expect(throws: BlueZError.adapterPoweredOff(adapter: adapter)) { _ = try await client.scan() }
        // Unnamed, the first powered adapter is the one; named, a powered-off one is still an error.
        let second = try await mock.addAdapter("hci1")
        #expect(try await client.adapter().path == second)
        let named = try makeClient(mock, adapter: "hci0")
        defer { named.close() }
        await #expect(throws: BlueZError.adapterPoweredOff(adapter: adapter)) { _ = try await named.adapter() }
    }

    @Test func noBluetoothdIsAnError() async throws {
        let mock = try await BlueZMock(startBlueZ: false)
        let client = try makeClient(mock)
        defer { client.close() }
        await #expect(throws: BlueZError.bluezNotRunning) { _ = try await client.adapter() }
    }

    @Test func vanishingBluetoothdEndsTheScanWithAnError() async throws {
        let mock = try await BlueZMock()
        try await mock.addAdapter()
        let client = try makeClient(mock)
        defer { client.close() }
        let stream = try await client.scan()
        mock.killMock()
        await #expect(throws: BlueZError.bluezVanished) { _ = try await first(stream) }
        await #expect(throws: BlueZError.bluezNotRunning) {
            try await client.advertise(ThaliAdvertisement(payload: .iOSDevice))
        }
    }

    @Test func aHungBluetoothdTimesOut() async throws {
        let mock = try await BlueZMock()
        try await mock.addAdapter()
        let client = try makeClient(mock, timeout: .milliseconds(300))
        defer { client.close() }
        let pid = try #require(mock.mock?.pid)
        kill(pid, SIGSTOP)
        defer { kill(pid, SIGCONT) }
        let started = ContinuousClock.now
        await #expect(throws: BlueZError.timedOut(method: "org.freedesktop.DBus.ObjectManager.GetManagedObjects")) {
            _ = try await client.adapter()
        }
        #expect(ContinuousClock.now - started < .seconds(3))
    }

    @Test func theBusGoingAwayIsAnError() async throws {
        let mock = try await BlueZMock()
        try await mock.addAdapter()
        let client = try makeClient(mock)
        defer { client.close() }
        let stream = try await client.scan()
        mock.daemon.terminate(signal: SIGKILL)
        await #expect(throws: BlueZError.busDisconnected) { _ = try await first(stream) }
        await #expect(throws: BlueZError.busDisconnected) { _ = try await client.adapter() }
    }

    /// The RFCOMM server profile: registered with ProfileManager1; a connection handed over by "BlueZ"
    /// (a Python peer passing one end of a socket pair through `NewConnection`) goes through the
    /// handshake and the relay to the app.
    @Test func profileConnectionsReachTheRelay() async throws {
        let mock = try await BlueZMock()
        try await mock.addAdapter()
        let client = try makeClient(mock)
        defer { client.close() }
        let group = MultiThreadedEventLoopGroup.singleton
        let app = try await EchoApp(group: group)
        let server = BluetoothRelayServer(transport: InProcessBluetoothAir().transport(for: peerAddress), group: group,
                                          appPort: app.port)
        let log = EventLog(server.events)
        try await client.registerProfile(channel: 7) { socket in server.handle(socket) }

        let registrations = try await mock.calls("/org/bluez", "RegisterProfile")
        #expect(registrations.count == 1)
        let registration = try #require(registrations.first)
        #expect(registration.first == .objectPath(client.profilePath))
        #expect(registration.dropFirst().first == .string(thaliUUID))
        let options = try #require(registration.last?.stringKeyedDictionary)
        #expect(options["Channel"]?.unwrapped == .uint16(7))
        #expect(options["Role"]?.string == "server")
        #expect(options["RequireAuthentication"]?.bool == false)

        let script = """
            mine, theirs = socket.socketpair()
            profile = bus.get_object(argv[0], argv[1], introspect=False)
            profile.NewConnection(dbus.ObjectPath('/org/bluez/hci0/dev_00_1A_7D_DA_71_99'), dbus.types.UnixFd(theirs), \
            dbus.Dictionary({}, signature='sv'), dbus_interface='org.bluez.Profile1')
            theirs.close()
            mine.settimeout(5)
            mine.sendall(b'\\x00')
            ack = mine.recv(1)
            mine.sendall(b'ping')
            echoed = b''
            while len(echoed) < 4: echoed += mine.recv(4 - len(echoed))
            print('ACK', ack.hex(), 'ECHO', echoed.decode())
            """
        let output = try await mock.python(script, [client.uniqueBusName, client.profilePath])
        #expect(output.contains("ACK 00 ECHO ping"))
        let caller = BluetoothAddress("00:1A:7D:DA:71:99")!
        #expect(await log.waitFor(.discoveredByConnection(caller)))
        #expect(await log.waitFor(.relayed(caller, .hasNotifications)))
        await app.stop()
    }
}
