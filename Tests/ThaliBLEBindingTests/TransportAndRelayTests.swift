import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOPosix
import Testing
@testable import ThaliBLEBinding

#if canImport(Glibc)
import Glibc
#endif

let serverAddress = BluetoothAddress("00:1A:7D:DA:71:01")!
let clientAddress = BluetoothAddress("00:1A:7D:DA:71:02")!
let channelNumber: UInt8 = 5

@Suite struct RFCOMMTransportTests {
    /// This machine's kernel has no Bluetooth: the real RFCOMM code must say so, by name.
    @Test func reportsMissingKernelSupportClearly() async throws {
        if let fd = try? RFCOMMTransport.openSocket() {
            // A kernel with Bluetooth: nothing to prove here.
            _ = closeDescriptor(fd)
            return
        }
        let transport = RFCOMMTransport()
        let error = await #expect(throws: BluetoothTransportError.bluetoothUnsupported(errno: EAFNOSUPPORT)) {
            _ = try await transport.connect(to: serverAddress, channel: channelNumber)
        }
        #expect(error?.description.contains("EAFNOSUPPORT") == true)
        #expect(error?.description.contains("AF_BLUETOOTH") == true)
        await #expect(throws: BluetoothTransportError.bluetoothUnsupported(errno: EAFNOSUPPORT)) {
            _ = try await transport.listen(channel: channelNumber)
        }
    }

    /// What real BlueZ showed: a blocking connect that outlives the kernel's RFCOMM connect timeout fails
    /// with EINPROGRESS, which must read as a timeout, not as "operation now in progress".
    @Test func connectFailuresAreTyped() {
        #expect(RFCOMMTransport.connectError(errno: EINPROGRESS, address: serverAddress, channel: 9)
            == .connectTimedOut(serverAddress, channel: 9))
        #expect(RFCOMMTransport.connectError(errno: ETIMEDOUT, address: serverAddress, channel: 9)
            == .connectTimedOut(serverAddress, channel: 9))
        #expect(RFCOMMTransport.connectError(errno: ECONNREFUSED, address: serverAddress, channel: 9)
            == .connectionRefused(serverAddress, channel: 9))
        let other = RFCOMMTransport.connectError(errno: EACCES, address: serverAddress, channel: 9)
        #expect(other == .systemCallFailed(call: "connect(RFCOMM \(serverAddress) channel 9)", errno: EACCES))
        #expect(BluetoothTransportError.connectTimedOut(serverAddress, channel: 9).description
            == "connecting to 00:1A:7D:DA:71:01 channel 9 timed out: the device did not answer")
    }
}

/// The two stand-ins for the radio behave alike: the in-process air, and the cross-process transport
/// (abstract UNIX sockets, what `thali-node` processes use in host tests).
@Suite(.timeLimit(.minutes(1))) struct StandInTransportTests {
    enum Kind: CaseIterable, Sendable { case inProcess, crossProcess }

    /// A fresh, empty medium of `kind`: device address → its transport.
    static func medium(_ kind: Kind) -> @Sendable (BluetoothAddress) -> any BluetoothTransport {
        switch kind {
        case .inProcess:
            let air = InProcessBluetoothAir()
            return { air.transport(for: $0) }
        case .crossProcess:
            let scope = "test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
            return { CrossProcessBluetoothTransport(scope: scope, localAddress: $0) }
        }
    }

    @Test(arguments: Kind.allCases) func refusesWhenNobodyListens(_ kind: Kind) async {
        let transport = Self.medium(kind)
        await #expect(throws: BluetoothTransportError.connectionRefused(serverAddress, channel: 3)) {
            _ = try await transport(clientAddress).connect(to: serverAddress, channel: 3)
        }
    }

    @Test(arguments: Kind.allCases) func oneListenerPerChannelAndAddressesSeenByTheListener(_ kind: Kind) async throws {
        let transport = Self.medium(kind)
        let listener = try await transport(serverAddress).listen(channel: 3)
        await #expect(throws: BluetoothTransportError.channelInUse(3)) {
            _ = try await transport(serverAddress).listen(channel: 3)
        }
        let outgoing = try await transport(clientAddress).connect(to: serverAddress, channel: 3)
        let incoming = try await listener.accept()
        #expect(outgoing.remoteAddress == serverAddress)
        #expect(incoming.remoteAddress == clientAddress)
        // The two ends are one real stream.
        let group = MultiThreadedEventLoopGroup.singleton
        let a = try await rawChannel(outgoing, group: group)
        let b = try await rawChannel(incoming, group: group)
        try await a.executeThenClose { _, outbound in
            try await outbound.write(ByteBuffer(bytes: [1, 2, 3]))
            try await b.executeThenClose { inbound, _ in
                let (bytes, _) = try await read(inbound.makeAsyncIterator(), count: 3)
                #expect(bytes == [1, 2, 3])
            }
        }
        listener.close()
        await #expect(throws: BluetoothTransportError.listenerClosed) { _ = try await listener.accept() }
        await #expect(throws: BluetoothTransportError.connectionRefused(serverAddress, channel: 3)) {
            _ = try await transport(clientAddress).connect(to: serverAddress, channel: 3)
        }
    }

    @Test func crossProcessScopesAreApartAndNamesAreBounded() async throws {
        let scope = "test-\(getpid())-scopes"
        let listener = try await CrossProcessBluetoothTransport(scope: scope, localAddress: serverAddress).listen(channel: 4)
        defer { listener.close() }
        await #expect(throws: BluetoothTransportError.connectionRefused(serverAddress, channel: 4)) {
            _ = try await CrossProcessBluetoothTransport(scope: scope + "-other", localAddress: clientAddress)
                .connect(to: serverAddress, channel: 4)
        }
        let tooLong = String(repeating: "s", count: 100)
        await #expect(throws: BluetoothTransportError.systemCallFailed(call: "bind(stand-in channel 4)", errno: ENAMETOOLONG)) {
            _ = try await CrossProcessBluetoothTransport(scope: tooLong, localAddress: serverAddress).listen(channel: 4)
        }
    }
}

/// The relay over the in-process transport with real TCP on both sides.
@Suite(.timeLimit(.minutes(1))) struct RelayTests {
    let group = MultiThreadedEventLoopGroup.singleton

    private func makeServer(_ air: InProcessBluetoothAir, app: EchoApp, limits: BluetoothBindingLimits = .init())
        async throws -> BluetoothRelayServer
    {
        let server = BluetoothRelayServer(transport: air.transport(for: serverAddress), group: group, appPort: app.port,
                                          limits: limits)
        try await server.start(channel: channelNumber)
        return server
    }

    @Test func relaysBothWaysAndReportsTheSurpriseConnection() async throws {
        let air = InProcessBluetoothAir()
        let app = try await EchoApp(group: group)
        let server = try await makeServer(air, app: app)
        let log = EventLog(server.events)
        let client = BluetoothRelayClient(transport: air.transport(for: clientAddress), group: group)
        let relay = try await client.connect(to: serverAddress, channel: channelNumber, hasNotifications: true)
        #expect(relay.localPort > 0)
        #expect(await log.waitFor(.discoveredByConnection(clientAddress)))
        #expect(await log.waitFor(.relayed(clientAddress, .hasNotifications)))

        let tcp = try await connectTCP(port: relay.localPort, group: group)
        // 1 MiB of patterned data through the echo and back, in awkward chunk sizes.
        let payload = (0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) }
        try await tcp.executeThenClose { inbound, outbound in
            async let echoed = read(inbound.makeAsyncIterator(), count: payload.count)
            var offset = 0
            var chunk = 1
            while offset < payload.count {
                let end = min(payload.count, offset + chunk)
                try await outbound.write(ByteBuffer(bytes: payload[offset..<end]))
                offset = end
                chunk = chunk * 3 + 1
            }
            let (bytes, _) = try await echoed
            #expect(bytes == payload)
        }
        // The app-side TCP client closed: the Bluetooth stream and the server's app connection follow.
        try await relay.closeFuture.get()
        #expect(await eventually { app.accepted.withLockedValue { $0.allSatisfy { !$0.isActive } } })
        #expect(server.counters.relayed == 1)
        server.stop()
        await app.stop()
    }

    @Test func listenerAcceptsExactlyOneConnection() async throws {
        let air = InProcessBluetoothAir()
        let app = try await EchoApp(group: group)
        let server = try await makeServer(air, app: app)
        let client = BluetoothRelayClient(transport: air.transport(for: clientAddress), group: group)
        let relay = try await client.connect(to: serverAddress, channel: channelNumber, hasNotifications: false)
        let first = try await connectTCP(port: relay.localPort, group: group)
        // The listener is gone after the first connection: a second one fails or is closed at once.
        do {
            let second = try await connectTCP(port: relay.localPort, group: group)
            try await second.executeThenClose { inbound, outbound in
                try? await outbound.write(ByteBuffer(bytes: [42]))
                #expect(await waitForEnd(inbound.makeAsyncIterator()))
            }
        } catch {
            // ECONNREFUSED: the listener was already closed.
        }
        // The first still works.
        try await first.executeThenClose { inbound, outbound in
            try await outbound.write(ByteBuffer(bytes: [7, 8, 9]))
            let (bytes, _) = try await read(inbound.makeAsyncIterator(), count: 3)
            #expect(bytes == [7, 8, 9])
        }
        #expect(app.connectionCount == 1)
        server.stop()
        await app.stop()
    }

    @Test func appClosingItsEndClosesTheClientsTCPConnection() async throws {
        let air = InProcessBluetoothAir()
        let app = try await EchoApp(group: group)
        let server = try await makeServer(air, app: app)
        let client = BluetoothRelayClient(transport: air.transport(for: clientAddress), group: group)
        let relay = try await client.connect(to: serverAddress, channel: channelNumber, hasNotifications: false)
        let tcp = try await connectTCP(port: relay.localPort, group: group)
        try await tcp.executeThenClose { inbound, outbound in
            try await outbound.write(ByteBuffer(bytes: [1]))
            let (bytes, iterator) = try await read(inbound.makeAsyncIterator(), count: 1)
            #expect(bytes == [1])
            await app.closeConnections()
            #expect(await waitForEnd(iterator))
        }
        try await relay.closeFuture.get()
        server.stop()
        await app.stop()
    }

    @Test func clientGivesUpWhenTheAppNeverConnects() async throws {
        let air = InProcessBluetoothAir()
        let app = try await EchoApp(group: group)
        let server = try await makeServer(air, app: app)
        var limits = BluetoothBindingLimits()
        limits.relayAcceptTimeout = .milliseconds(200)
        let client = BluetoothRelayClient(transport: air.transport(for: clientAddress), group: group, limits: limits)
        let relay = try await client.connect(to: serverAddress, channel: channelNumber, hasNotifications: false)
        try await relay.closeFuture.get()
        // The server's relay to the app closes as well.
        #expect(await eventually { app.connectionCount == 1 && app.accepted.withLockedValue { !$0[0].isActive } })
        server.stop()
        await app.stop()
    }

    @Test func severalSequentialConnections() async throws {
        let air = InProcessBluetoothAir()
        let app = try await EchoApp(group: group)
        let server = try await makeServer(air, app: app)
        let client = BluetoothRelayClient(transport: air.transport(for: clientAddress), group: group)
        for round in 0..<5 {
            let relay = try await client.connect(to: serverAddress, channel: channelNumber, hasNotifications: round % 2 == 0)
            let tcp = try await connectTCP(port: relay.localPort, group: group)
            try await tcp.executeThenClose { inbound, outbound in
                try await outbound.write(ByteBuffer(bytes: [UInt8(round), 0xEE]))
                let (bytes, _) = try await read(inbound.makeAsyncIterator(), count: 2)
                #expect(bytes == [UInt8(round), 0xEE])
            }
            try await relay.closeFuture.get()
        }
        #expect(server.counters.relayed == 5)
        #expect(server.counters.gate.accepted == 5)
        server.stop()
        await app.stop()
    }

    // MARK: Handshake violations end to end

    @Test func serverClosesOnAnInvalidHello() async throws {
        let air = InProcessBluetoothAir()
        let app = try await EchoApp(group: group)
        let server = try await makeServer(air, app: app)
        let log = EventLog(server.events)
        let socket = try await air.transport(for: clientAddress).connect(to: serverAddress, channel: channelNumber)
        let raw = try await rawChannel(socket, group: group)
        try await raw.executeThenClose { inbound, outbound in
            try await outbound.write(ByteBuffer(bytes: [2, 0, 0]))
            let (bytes, _) = try await read(inbound.makeAsyncIterator(), count: 1)
            #expect(bytes.isEmpty, "the server must not acknowledge an invalid hello")
        }
        #expect(await log.waitFor(.handshakeFailed(clientAddress, .invalidClientHello(2))))
        #expect(server.counters.handshakeFailures == 1)
        #expect(app.connectionCount == 0)
        server.stop()
        await app.stop()
    }

    @Test func serverTimesOutASilentClient() async throws {
        let air = InProcessBluetoothAir()
        let app = try await EchoApp(group: group)
        var limits = BluetoothBindingLimits()
        limits.handshakeTimeout = .milliseconds(150)
        let server = try await makeServer(air, app: app, limits: limits)
        let log = EventLog(server.events)
        let socket = try await air.transport(for: clientAddress).connect(to: serverAddress, channel: channelNumber)
        let raw = try await rawChannel(socket, group: group)
        try await raw.executeThenClose { inbound, _ in
            #expect(await waitForEnd(inbound.makeAsyncIterator()))
        }
        #expect(await log.waitFor(.handshakeFailed(clientAddress, .timedOut)))
        #expect(app.connectionCount == 0)
        server.stop()
        await app.stop()
    }

    @Test func clientClosesOnAWrongAcknowledgement() async throws {
        let air = InProcessBluetoothAir()
        let listener = try await air.transport(for: serverAddress).listen(channel: channelNumber)
        let group = self.group
        let fakeServer = Task { () async throws -> ([UInt8], Bool) in
            let socket = try await listener.accept()
            let raw = try await rawChannel(socket, group: group)
            return try await raw.executeThenClose { inbound, outbound in
                let (hello, iterator) = try await read(inbound.makeAsyncIterator(), count: 1)
                try await outbound.write(ByteBuffer(bytes: [9]))
                let ended = await waitForEnd(iterator)
                return (hello, ended)
            }
        }
        let client = BluetoothRelayClient(transport: air.transport(for: clientAddress), group: group)
        await #expect(throws: BluetoothHandshake.Violation.invalidServerAcknowledgement(9)) {
            _ = try await client.connect(to: serverAddress, channel: channelNumber, hasNotifications: false)
        }
        let (hello, ended) = try await fakeServer.value
        #expect(hello == [1])
        #expect(ended, "the client must close the stream")
        listener.close()
    }

    // MARK: Limits

    @Test func refusesAnAbusiveAddress() async throws {
        let air = InProcessBluetoothAir()
        let app = try await EchoApp(group: group)
        var limits = BluetoothBindingLimits()
        limits.maxIncomingConnectionsPerAddress = 2
        let server = try await makeServer(air, app: app, limits: limits)
        let log = EventLog(server.events)
        let client = BluetoothRelayClient(transport: air.transport(for: clientAddress), group: group, limits: limits)
        for _ in 0..<2 {
            let relay = try await client.connect(to: serverAddress, channel: channelNumber, hasNotifications: false)
            await relay.close()
        }
        await #expect(throws: BluetoothHandshake.Violation.closedBeforeHandshake) {
            _ = try await client.connect(to: serverAddress, channel: channelNumber, hasNotifications: false)
        }
        #expect(await log.waitFor(.refused(.refusedAddress(clientAddress))))
        // Another address is still welcome.
        let other = BluetoothRelayClient(transport: air.transport(for: BluetoothAddress("00:1A:7D:DA:71:03")!), group: group)
        try await other.connect(to: serverAddress, channel: channelNumber, hasNotifications: false).close()
        #expect(server.counters.gate.addressesBanned == 1)
        #expect(server.counters.gate.refusedAddress == 1)
        #expect(server.counters.gate.accepted == 3)
        server.stop()
        await app.stop()
    }

    @Test func pausesAcceptingUnderAFlood() async throws {
        let air = InProcessBluetoothAir()
        let app = try await EchoApp(group: group)
        var limits = BluetoothBindingLimits()
        limits.maxIncomingConnectionsPerWindow = 3
        limits.acceptPause = .milliseconds(400)
        let server = try await makeServer(air, app: app, limits: limits)
        let log = EventLog(server.events)
        for index in 0..<3 {
            let address = BluetoothAddress(octets: [0, 0, 0, 0, 1, UInt8(index)])!
            let relay = try await BluetoothRelayClient(transport: air.transport(for: address), group: group)
                .connect(to: serverAddress, channel: channelNumber, hasNotifications: false)
            await relay.close()
        }
        let fresh = BluetoothRelayClient(transport: air.transport(for: BluetoothAddress("00:00:00:00:02:00")!), group: group)
        await #expect(throws: BluetoothHandshake.Violation.closedBeforeHandshake) {
            _ = try await fresh.connect(to: serverAddress, channel: channelNumber, hasNotifications: false)
        }
        #expect(await log.waitFor(.refused(.refusedPaused)))
        #expect(server.counters.gate.acceptPauses == 1)
        // After the pause the server accepts again. A sleep, kept: the 400 ms pause runs on the system clock and
        // ends with no event, and a connection tried during it would be refused (and counted) rather than wait.
        try await Task.sleep(for: .milliseconds(450))
        try await fresh.connect(to: serverAddress, channel: channelNumber, hasNotifications: false).close()
        server.stop()
        await app.stop()
    }

    @Test func capsConcurrentRelays() async throws {
        let air = InProcessBluetoothAir()
        let app = try await EchoApp(group: group)
        var limits = BluetoothBindingLimits()
        limits.maxConcurrentIncomingConnections = 1
        let server = try await makeServer(air, app: app, limits: limits)
        let log = EventLog(server.events)
        let first = try await BluetoothRelayClient(transport: air.transport(for: clientAddress), group: group)
            .connect(to: serverAddress, channel: channelNumber, hasNotifications: false)
        let second = BluetoothRelayClient(transport: air.transport(for: BluetoothAddress("00:00:00:00:03:00")!), group: group)
        await #expect(throws: BluetoothHandshake.Violation.closedBeforeHandshake) {
            _ = try await second.connect(to: serverAddress, channel: channelNumber, hasNotifications: false)
        }
        #expect(await log.waitFor(.refused(.refusedBusy)))
        await first.close()
        // Once the first relay is gone, a slot is free again.
        #expect(await eventually { server.openRelays == 0 })
        #expect(server.counters.gate.refusedBusy == 1)
        try await second.connect(to: serverAddress, channel: channelNumber, hasNotifications: false).close()
        server.stop()
        await app.stop()
    }
}

@Suite struct GateTests {
    @Test func addressRefusalExpires() {
        var limits = BluetoothBindingLimits()
        limits.maxIncomingConnectionsPerAddress = 1
        limits.abusiveAddressRefusal = .seconds(60)
        var gate = IncomingConnectionGate(limits: limits)
        let start = NIODeadline.uptimeNanoseconds(1_000_000_000)
        #expect(gate.admit(clientAddress, now: start) == .accept)
        gate.release(clientAddress)
        #expect(gate.admit(clientAddress, now: start + .seconds(1)) == .refusedAddress(clientAddress))
        #expect(gate.admit(clientAddress, now: start + .seconds(59)) == .refusedAddress(clientAddress))
        #expect(gate.admit(clientAddress, now: start + .seconds(62)) == .accept)
        #expect(gate.counters.addressesBanned == 1)
        #expect(gate.counters.refusedAddress == 2)
    }

    @Test func windowsRestart() {
        var limits = BluetoothBindingLimits()
        limits.maxIncomingConnectionsPerWindow = 2
        limits.incomingConnectionWindow = .seconds(10)
        var gate = IncomingConnectionGate(limits: limits)
        let start = NIODeadline.uptimeNanoseconds(1_000_000_000)
        for index in 0..<2 {
            let address = BluetoothAddress(octets: [0, 0, 0, 0, 0, UInt8(index)])!
            #expect(gate.admit(address, now: start) == .accept)
            gate.release(address)
        }
        // Spread over two windows, four connections are fine.
        for index in 2..<4 {
            let address = BluetoothAddress(octets: [0, 0, 0, 0, 0, UInt8(index)])!
            #expect(gate.admit(address, now: start + .seconds(11)) == .accept)
            gate.release(address)
        }
        #expect(gate.admit(clientAddress, now: start + .seconds(12)) == .refusedPaused)
        #expect(gate.counters.acceptPauses == 1)
    }

    @Test func advertisementFloodCoolsDownThenRecovers() {
        var limits = BluetoothBindingLimits()
        limits.maxAdvertisementsPerWindow = 3
        limits.advertisementWindow = .seconds(1)
        limits.discoveryCoolDown = .seconds(30)
        var gate = AdvertisementRateGate(limits: limits)
        let start = NIODeadline.uptimeNanoseconds(1_000_000_000)
        for _ in 0..<3 { #expect(gate.admit(now: start) == .accept) }
        #expect(gate.admit(now: start) == .startCoolDown(until: start + .seconds(30)))
        #expect(gate.admit(now: start + .seconds(29)) == .coolingDown)
        #expect(gate.admit(now: start + .seconds(30)) == .accept)
        #expect(gate.counters == AdvertisementRateGate.Counters(accepted: 4, dropped: 2, coolDowns: 1))
    }
}

@Suite(.timeLimit(.minutes(1))) struct MoreLimitTests {
    @Test func perAddressTablesStayBounded() {
        var limits = BluetoothBindingLimits()
        limits.maxTrackedAddresses = 8
        limits.maxIncomingConnectionsPerWindow = .max
        limits.maxConcurrentIncomingConnections = 8
        var gate = IncomingConnectionGate(limits: limits)
        let now = NIODeadline.uptimeNanoseconds(1_000_000_000)
        for index in 0..<1000 {
            let address = BluetoothAddress(octets: [0, 0, 0, 0, UInt8(index >> 8), UInt8(index & 0xFF)])!
            #expect(gate.admit(address, now: now) == .accept)
            gate.release(address)
        }
        #expect(gate.trackedAddresses <= 8)
    }

    /// The server closes the Bluetooth stream as soon as its app port refuses, which can be before the
    /// client has read its listener's port: the client still hands back its relay (already closing),
    /// never "no port". Run many times, since the two race.
    @Test func unreachableAppClosesTheStream() async throws {
        let group = MultiThreadedEventLoopGroup.singleton
        // A port that was just free: nothing listens there.
        let probe = try await ServerBootstrap(group: group).bind(host: "127.0.0.1", port: 0).get()
        let port = try #require(probe.localAddress?.port)
        try await probe.close()
        for _ in 0..<100 {
            let air = InProcessBluetoothAir()
            let server = BluetoothRelayServer(transport: air.transport(for: serverAddress), group: group, appPort: port)
            let log = EventLog(server.events)
            try await server.start(channel: channelNumber)
            let relay = try await BluetoothRelayClient(transport: air.transport(for: clientAddress), group: group)
                .connect(to: serverAddress, channel: channelNumber, hasNotifications: false)
            #expect(relay.localPort > 0)
            try await relay.closeFuture.get()
            #expect(await log.waitFor(.appUnreachable(clientAddress)))
            #expect(server.counters.appConnectFailures == 1)
            server.stop()
        }
    }

    @Test func clientHandshakeTimesOut() throws {
        let channel = EmbeddedChannel()
        let promise = channel.eventLoop.makePromise(of: BluetoothHandshake.Outcome.self)
        try channel.pipeline.syncOperations.addHandler(
            BluetoothHandshakeHandler(role: .client(.hasNoNotifications), timeout: .seconds(1), outcome: promise))
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        channel.embeddedEventLoop.advanceTime(by: .seconds(1))
        let box = NIOLockedValueBox<Result<BluetoothHandshake.Outcome, any Error>?>(nil)
        promise.futureResult.whenComplete { result in box.withLockedValue { $0 = result } }
        #expect(throws: BluetoothHandshake.Violation.timedOut) { try box.withLockedValue { $0 }?.get() }
        #expect(!channel.isActive)
    }
}
