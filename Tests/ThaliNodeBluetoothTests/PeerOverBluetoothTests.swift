import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing
import ThaliBeacons
import ThaliNodeBluetooth
import ThaliNodeCore
import ThaliSSDP
import ThaliBluetoothTestSupport
import ThaliNodeTestSupport
@testable import ThaliBLEBinding

/// Two `ThaliPeer`s with only the Bluetooth binding, on python-dbusmock's BlueZ (two adapters on one
/// private bus) and the in-process Bluetooth air: what the radio would carry (our advertisement's service
/// data) the test reports to the other adapter as a device, as bluetoothd would. Everything else is the
/// node's real code: advertising through D-Bus, scanning, the RFCOMM relay and multiplexer, PSK-TLS and
/// delivery.
@Suite(.serialized, .enabled(if: BlueZMock.peersPresent), .timeLimit(.minutes(2))) struct PeerOverBluetoothTests {
    struct Person {
        let name: String
        let key: PrivateKey
        let store: NodeStore
        let directory: String
    }

    static func person(_ name: String) throws -> Person {
        let directory = NSTemporaryDirectory() + "thali-bt-peer-\(name)-\(UInt32.random(in: 0...UInt32.max))"
        let home = NodeHome(path: directory)
        try home.create()
        return Person(name: name, key: try NodeIdentity.create(in: home), store: try NodeStore(home: home), directory: directory)
    }

    static func peer(_ person: Person, adapter: String, mock: BlueZMock, air: InProcessBluetoothAir,
                     ssdpPort: Int? = nil, events: @escaping PeerEventHandler = { _ in },
                     configure: (inout PeerConfiguration) -> Void = { _ in }) throws -> ThaliPeer {
        var configuration = PeerConfiguration(interfaceAddress: "127.0.0.1")
        // With an SSDP port: Wi-Fi (SSDP on loopback) as well.
        configuration.wifi = ssdpPort != nil
        if let ssdpPort { configuration.ssdpPort = ssdpPort }
        var bluetooth = BluetoothPeerConfiguration(adapter: adapter)
        bluetooth.busAddress = mock.busAddress
        bluetooth.transport = { air.transport(for: $0) }
        bluetooth.beaconRefetchInterval = .milliseconds(500)
        bluetooth.reconnectDelay = .milliseconds(200)
        bluetooth.yieldToLowerAddress = .seconds(5)
        configuration.bluetooth = bluetooth
        configure(&configuration)
        var logger = Logger(label: "test.bluetooth.\(person.name)")
        logger.logLevel = .critical
        return try ThaliPeer(store: person.store, identity: person.key, configuration: configuration, logger: logger,
                             events: events)
    }

    /// The mock bluetoothd with adapters hci0 and hci1.
    static func twoAdapters() async throws -> BlueZMock {
        let mock = try await BlueZMock()
        try await mock.addAdapter("hci0")
        try await mock.addAdapter("hci1")
        return mock
    }

    /// Alice and Bob, each the other's contact.
    static func contacts() throws -> (Person, Person) {
        let alice = try person("alice"), bob = try person("bob")
        try alice.store.addContact(name: "bob", publicKey: bob.key.publicKey.hexString(compressed: true))
        try bob.store.addContact(name: "alice", publicKey: alice.key.publicKey.hexString(compressed: true))
        return (alice, bob)
    }

    /// Plays the air: `advertiser`'s advertisement, as registered, reaches `scanner`'s adapter.
    static func carry(advertiser: String, to scanner: String, mock: BlueZMock) async throws {
        let address = try await mock.address(of: advertiser)
        let device = try await mock.addDevice(address.description, adapter: scanner)
        try await mock.updateProperties(device, interface: "org.bluez.Device1", [
            ("ServiceData", serviceData(ThaliAdvertisement.serviceUUIDString,
                                        ThaliAdvertisement(payload: .bluetoothAddress(address)).serviceDataValue)),
        ])
    }

    static func waitUntil(_ what: String, timeout: Duration = .seconds(30), _ condition: () throws -> Bool) async throws {
        if try await ThaliTestSupport.waitUntil(timeout: timeout, every: .milliseconds(100), condition) { return }
        Issue.record("timed out waiting for \(what)")
    }

    @Test func twoPeersFindEachOtherAndDeliverBothWays() async throws {
        let (mock, air) = (try await Self.twoAdapters(), InProcessBluetoothAir())
        let (alice, bob) = try Self.contacts()
        defer { for person in [alice, bob] { try? FileManager.default.removeItem(atPath: person.directory) } }
        let later = Date().addingTimeInterval(3600)
        _ = try alice.store.enqueueText("to bob over Bluetooth", to: "bob", expiresAt: later)
        _ = try bob.store.enqueueText("to alice over Bluetooth", to: "alice", expiresAt: later)

        let sessions = NIOLockedValueBox<[String]>([])
        func recorder(_ who: String) -> PeerEventHandler {
            { event in
                if case .connected(_, let role, let binding, _) = event { sessions.withLockedValue { $0.append("\(who) \(role.rawValue) \(binding.rawValue)") } }
            }
        }
        let alicePeer = try Self.peer(alice, adapter: "hci0", mock: mock, air: air, events: recorder("alice"))
        let bobPeer = try Self.peer(bob, adapter: "hci1", mock: mock, air: air, events: recorder("bob"))
        try await alicePeer.start()
        try await bobPeer.start()
        // Each holds an item, so each advertises through BlueZ on its own adapter.
        // start() announces what the outbox holds before it returns.
        #expect(try await mock.calls("/org/bluez/hci0", "RegisterAdvertisement").count >= 1)
        #expect(try await mock.calls("/org/bluez/hci1", "RegisterAdvertisement").count >= 1)
        // Bob hears Alice first and connects; Alice, hearing Bob once that link is up, reaches him over it.
        try await Self.carry(advertiser: "hci0", to: "hci1", mock: mock)
        try await Self.waitUntil("Bob's item from Alice") { try bob.store.inbox().count == 1 }
        try await Self.carry(advertiser: "hci1", to: "hci0", mock: mock)

        try await Self.waitUntil("both inboxes") {
            try alice.store.inbox().count == 1 && bob.store.inbox().count == 1
        }
        await alicePeer.stop()
        await bobPeer.stop()
        #expect(try alice.store.inbox().map(\.text) == ["to alice over Bluetooth"])
        #expect(try bob.store.inbox().map(\.text) == ["to bob over Bluetooth"])
        #expect(try alice.store.outbox().isEmpty && bob.store.outbox().isEmpty)
        // Each advertised and each pursued the other, yet one link served both directions: Alice found
        // the link Bob made and reached Bob's node over it.
        #expect(air.connectionCount == 1)
        // Every session, on either side, is named as Bluetooth.
        #expect(Set(sessions.withLockedValue { $0 }) == ["alice connecting bluetooth", "alice accepting bluetooth",
                                                         "bob connecting bluetooth", "bob accepting bluetooth"])
    }

    /// Both advertise and see each other at once, and a connect takes longer than the higher address's
    /// short pause: the higher one waits for the lower one's link instead of crossing it (crossing pages
    /// collide on real controllers), so one link carries both directions.
    @Test func theHigherAddressWaitsForTheLowerOnesLinkInsteadOfCrossingIt() async throws {
        let (mock, air) = (try await Self.twoAdapters(), InProcessBluetoothAir(connectLatency: .seconds(1)))
        let (alice, bob) = try Self.contacts()
        defer { for person in [alice, bob] { try? FileManager.default.removeItem(atPath: person.directory) } }
        let later = Date().addingTimeInterval(3600)
        _ = try alice.store.enqueueText("to bob", to: "bob", expiresAt: later)
        _ = try bob.store.enqueueText("to alice", to: "alice", expiresAt: later)
        let alicePeer = try Self.peer(alice, adapter: "hci0", mock: mock, air: air)
        let bobPeer = try Self.peer(bob, adapter: "hci1", mock: mock, air: air)
        try await alicePeer.start()
        try await bobPeer.start()
        try await Self.carry(advertiser: "hci0", to: "hci1", mock: mock)
        try await Self.carry(advertiser: "hci1", to: "hci0", mock: mock)
        try await Self.waitUntil("both inboxes") { try alice.store.inbox().count == 1 && bob.store.inbox().count == 1 }
        await alicePeer.stop()
        await bobPeer.stop()
        #expect(air.connectionCount == 1)
    }

    /// Both bindings reach the same contact: each side matches its contact's beacons over SSDP and over
    /// Bluetooth, links race, and still every item arrives exactly once.
    @Test func aPairReachableOverBothBindingsGetsEveryItemOnce() async throws {
        let (mock, air) = (try await Self.twoAdapters(), InProcessBluetoothAir())
        let (alice, bob) = try Self.contacts()
        defer { for person in [alice, bob] { try? FileManager.default.removeItem(atPath: person.directory) } }
        let later = Date().addingTimeInterval(3600)
        for index in 0..<3 {
            _ = try alice.store.enqueueText("alice \(index)", to: "bob", expiresAt: later)
            _ = try bob.store.enqueueText("bob \(index)", to: "alice", expiresAt: later)
        }
        let matches = NIOLockedValueBox<[PeerLocation]>([])
        let sessions = NIOLockedValueBox<[String: Int]>([:])
        func record(_ who: String) -> PeerEventHandler {
            { event in
                if case .beaconMatched(_, let location) = event { matches.withLockedValue { $0.append(location) } }
                if case .connected(_, let role, let binding, _) = event {
                    sessions.withLockedValue { $0["\(who) \(role.rawValue) \(binding.rawValue)", default: 0] += 1 }
                }
            }
        }
        let ssdpPort = Int.random(in: 20000...60000)
        let alicePeer = try Self.peer(alice, adapter: "hci0", mock: mock, air: air, ssdpPort: ssdpPort, events: record("alice"))
        let bobPeer = try Self.peer(bob, adapter: "hci1", mock: mock, air: air, ssdpPort: ssdpPort, events: record("bob"))
        try await alicePeer.start()
        try await bobPeer.start()
        try await Self.carry(advertiser: "hci0", to: "hci1", mock: mock)
        try await Self.carry(advertiser: "hci1", to: "hci0", mock: mock)

        try await Self.waitUntil("every item, and matches over both bindings") {
            let locations = matches.withLockedValue { $0 }
            return try alice.store.inbox().count >= 3 && bob.store.inbox().count >= 3
                && locations.contains { $0.binding == .bluetooth } && locations.contains { $0.binding == .wifi }
        }
        // A link racing on the other binding is seen from both sides before counting: every connection
        // one side made, the other accepted, and both outboxes are empty.
        func balanced() -> Bool {
            let counted = sessions.withLockedValue { $0 }
            return ["wifi", "bluetooth"].allSatisfy {
                counted["alice connecting \($0)"] == counted["bob accepting \($0)"]
                    && counted["bob connecting \($0)"] == counted["alice accepting \($0)"]
            }
        }
        try await Self.waitUntil("both sides' view of every connection, and empty outboxes") {
            try balanced() && alice.store.outbox().isEmpty && bob.store.outbox().isEmpty
        }
        await alicePeer.stop()
        await bobPeer.stop()
        #expect(try alice.store.inbox().compactMap(\.text).sorted() == ["bob 0", "bob 1", "bob 2"])
        #expect(try bob.store.inbox().compactMap(\.text).sorted() == ["alice 0", "alice 1", "alice 2"])
        #expect(try alice.store.outbox().isEmpty && bob.store.outbox().isEmpty)
        // Each session is named by the same binding on both sides: the accepting side tells a relayed
        // Bluetooth connection (from the peer's loopback source) from a Wi-Fi one.
        let counted = sessions.withLockedValue { $0 }
        for binding in ["wifi", "bluetooth"] {
            #expect(counted["alice connecting \(binding)"] == counted["bob accepting \(binding)"], "\(counted)")
            #expect(counted["bob connecting \(binding)"] == counted["alice accepting \(binding)"], "\(counted)")
        }
    }

    /// More advertisers in range than link slots (a crowd): Alice may hold one link. Bob, whose beacons
    /// are for someone else, is heard first and takes it; Carol, whose beacons are for Alice, is heard
    /// while it is taken and waits. Bob's idle link gives way to her, and Bob, queued again, gets his turn
    /// back: an item he queues for Alice later arrives too. Each appears once, however many turns.
    @Test func aCrowdLargerThanTheLinkSlotsIsServedInTurn() async throws {
        let mock = try await BlueZMock()
        for adapter in ["hci0", "hci1", "hci2"] { try await mock.addAdapter(adapter) }
        let air = InProcessBluetoothAir()
        let (alice, bob, carol) = (try Self.person("alice"), try Self.person("bob"), try Self.person("carol"))
        defer { for person in [alice, bob, carol] { try? FileManager.default.removeItem(atPath: person.directory) } }
        let dave = PrivateKey().publicKey.hexString(compressed: true)
        for (person, contacts) in [(alice, [bob, carol]), (bob, [alice]), (carol, [alice])] {
            for contact in contacts { try person.store.addContact(name: contact.name, publicKey: contact.key.publicKey.hexString(compressed: true)) }
        }
        try bob.store.addContact(name: "dave", publicKey: dave)
        let later = Date().addingTimeInterval(3600)
        _ = try bob.store.enqueueText("bob to dave", to: "dave", expiresAt: later)
        _ = try carol.store.enqueueText("carol to alice", to: "alice", expiresAt: later)

        let appeared = NIOLockedValueBox<[PeerLocation]>([])
        let alicePeer = try Self.peer(alice, adapter: "hci0", mock: mock, air: air, events: { event in
            if case .peerAppeared(let location) = event { appeared.withLockedValue { $0.append(location) } }
        }, configure: { $0.bluetooth?.maxConnectedPeers = 1 })
        let bobPeer = try Self.peer(bob, adapter: "hci1", mock: mock, air: air, configure: { $0.outboxPollInterval = .milliseconds(200) })
        let carolPeer = try Self.peer(carol, adapter: "hci2", mock: mock, air: air)
        for peer in [alicePeer, bobPeer, carolPeer] { try await peer.start() }
        try await Self.carry(advertiser: "hci1", to: "hci0", mock: mock)
        try await Self.waitUntil("Alice's link to Bob") { air.connectionCount == 1 }
        try await Self.carry(advertiser: "hci2", to: "hci0", mock: mock)
        try await Self.waitUntil("Carol's item, over the slot Bob's idle link gave up") { try alice.store.inbox().count == 1 }
        #expect(try alice.store.inbox().map(\.text) == ["carol to alice"])

        _ = try bob.store.enqueueText("bob to alice", to: "alice", expiresAt: later)
        try await Self.waitUntil("Bob's item, on his next turn") { try alice.store.inbox().count == 2 }
        for peer in [alicePeer, bobPeer, carolPeer] { await peer.stop() }
        #expect(try alice.store.inbox().compactMap(\.text).sorted() == ["bob to alice", "carol to alice"])
        #expect(try carol.store.outbox().isEmpty)
        #expect(try bob.store.outbox().map(\.text) == ["bob to dave"])
        let (bobAddress, carolAddress) = (try await mock.address(of: "hci1"), try await mock.address(of: "hci2"))
        #expect(Set(appeared.withLockedValue { $0 }) == [.bluetooth(bobAddress), .bluetooth(carolAddress)])
    }

    /// The faster binding fails while the other holds a route: a host on the LAN re-serves a copy of
    /// Bob's announcement over SSDP and then stalls the handshakes it accepts, so Alice's Wi-Fi attempt
    /// hangs while she matches Bob over Bluetooth, and fails when that host drops it. Her link falls back
    /// to Bluetooth at once (no backoff) and Bob's items arrive there, once.
    @Test func aFailedWiFiAttemptFallsBackToBluetoothAtOnce() async throws {
        let (mock, air) = (try await Self.twoAdapters(), InProcessBluetoothAir())
        let (alice, bob) = try Self.contacts()
        defer { for person in [alice, bob] { try? FileManager.default.removeItem(atPath: person.directory) } }
        let later = Date().addingTimeInterval(3600)
        for index in 0..<2 { _ = try bob.store.enqueueText("bob \(index)", to: "alice", expiresAt: later) }

        // The hostile host: Bob's beacons for Alice served from its own port, its TLS connections held
        // open and silent until the test lets them go.
        let copy = try BeaconGenerator(identity: bob.key).makeAnnouncement(for: [alice.key.publicKey], validity: .seconds(600)).stream
        let held = NIOLockedValueBox<[Channel]>([])
        let hostilePort = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(ConnectionKindSniffer(
                        http: { try BeaconHTTPServer.configureRequestHandling(on: $0) { copy } },
                        secure: { channel in
                            held.withLockedValue { $0.append(channel) }
                            return channel.eventLoop.makeSucceededVoidFuture()
                        }))
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        defer { hostilePort.close(promise: nil) }
        let ssdpPort = Int.random(in: 20000...60000)
        var ssdp = SSDPDiscoveryConfiguration(interfaceAddress: "127.0.0.1")
        ssdp.port = ssdpPort
        ssdp.beaconServer = .external(port: try #require(hostilePort.localAddress?.port))
        let hostile = SSDPDiscoveryService(configuration: ssdp, group: MultiThreadedEventLoopGroup.singleton,
                                           logger: Logger(label: "test.hostile")) { _, _ in }
        try await hostile.start(advertising: copy)
        let hostileLocation = PeerLocation.wifi(await hostile.location())

        let events = NIOLockedValueBox<[PeerEvent]>([])
        // Bob: Bluetooth only. Alice: Wi-Fi on the hostile host's SSDP group, and Bluetooth.
        let bobPeer = try Self.peer(bob, adapter: "hci1", mock: mock, air: air)
        let alicePeer = try Self.peer(alice, adapter: "hci0", mock: mock, air: air, ssdpPort: ssdpPort,
                                      events: { event in events.withLockedValue { $0.append(event) } })
        try await bobPeer.start()
        try await alicePeer.start()
        func contains(_ predicate: (PeerEvent) -> Bool) -> Bool { events.withLockedValue { $0.contains(where: predicate) } }

        // Alice tries the faster binding first and hangs in the hostile host's handshake.
        try await Self.waitUntil("Alice connecting to the hostile host") {
            contains { if case .connecting("bob", hostileLocation, 1) = $0 { true } else { false } }
        }
        try await Self.waitUntil("Alice holding a connection at the hostile host") { !held.withLockedValue { $0 }.isEmpty }
        // Meanwhile she hears Bob over Bluetooth and matches him there.
        try await Self.carry(advertiser: "hci1", to: "hci0", mock: mock)
        try await Self.waitUntil("Alice matching Bob over Bluetooth") {
            contains { if case .beaconMatched("bob", let location) = $0 { location.binding == .bluetooth } else { false } }
        }
        // One attempt at a time: nothing has gone over Bluetooth yet.
        #expect(!contains { if case .connecting(_, let location, _) = $0 { location.binding == .bluetooth } else { false } })
        // The hostile host drops the handshake: the attempt fails, and the link falls back at once.
        for channel in held.withLockedValue({ $0 }) { channel.close(promise: nil) }
        try await Self.waitUntil("Bob's items in Alice's inbox") { try alice.store.inbox().count == 2 }
        await alicePeer.stop()
        await bobPeer.stop()
        await hostile.stop()

        let linkEvents = events.withLockedValue { $0 }.compactMap { event -> String? in
            switch event {
            case .connecting("bob", let location, let attempt):
                "connecting \(location.binding == .bluetooth ? "bluetooth" : location == hostileLocation ? "hostile" : "\(location)") \(attempt)"
            case .connectionFailed("bob", _, let retryIn):
                "failed, retry in \(retryIn.map { "\($0)" } ?? "never")"
            case .connected("bob", .connecting, let binding, _):
                "connected \(binding.rawValue)"
            default:
                nil
            }
        }
        #expect(Array(linkEvents.prefix(4)) == ["connecting hostile 1", "failed, retry in 0.0 seconds", "connecting bluetooth 2",
                                                "connected bluetooth"], "\(linkEvents)")
        #expect(try alice.store.inbox().compactMap(\.text).sorted() == ["bob 0", "bob 1"])
        #expect(try bob.store.outbox().isEmpty)
    }

    @Test func withoutBlueZBluetoothAloneFailsInOneLine() async throws {
        let mock = try await BlueZMock(startBlueZ: false)
        let air = InProcessBluetoothAir()
        let alice = try Self.person("alice")
        defer { try? FileManager.default.removeItem(atPath: alice.directory) }
        let peer = try Self.peer(alice, adapter: "hci0", mock: mock, air: air)
        await #expect {
            try await peer.start()
        } throws: { error in
            "\(error)" == "Bluetooth cannot run: bluetoothd is not running (nobody owns org.bluez on the bus)"
        }
    }
}
