import Foundation
import NIOConcurrencyHelpers
import Testing
import ThaliNodeCore
import ThaliTestSupport
@testable import ThaliBLEBinding

/// What the radio would carry between the mock's adapters: while an adapter has an advertisement
/// registered (bluetoothd's view: more `RegisterAdvertisement` than `UnregisterAdvertisement` calls),
/// every other adapter keeps reporting it as a device with our service data, as a scanning controller
/// reports an advertiser it keeps hearing.
private final class MockAir: Sendable {
    private let mock: BlueZMock
    private let adapters: [String]
    private let devices = NIOLockedValueBox<[String: String]>([:])  // "scanner advertiser" → device path
    private let task = NIOLockedValueBox<Task<Void, Never>?>(nil)

    init(mock: BlueZMock, adapters: [String]) {
        self.mock = mock
        self.adapters = adapters
    }

    deinit { task.withLockedValue { $0?.cancel() } }

    func start(every interval: Duration = .milliseconds(500)) {
        let body = Task { [self] in
            while !Task.isCancelled {
                try? await carryOnce()
                // Paces the simulated radio's repeated reports (as a scanner keeps hearing an advertiser);
                // nothing waits for a result.
                try? await Task.sleep(for: interval)
            }
        }
        task.withLockedValue { $0 = body }
    }

    func stop() { task.withLockedValue { $0?.cancel() } }

    private func carryOnce() async throws {
        for advertiser in adapters {
            let path = "/org/bluez/\(advertiser)"
            let registered = try await mock.calls(path, "RegisterAdvertisement").count
            let unregistered = try await mock.calls(path, "UnregisterAdvertisement").count
            guard registered > unregistered else { continue }
            let address = try await mock.address(of: advertiser)
            for scanner in adapters where scanner != advertiser {
                let key = "\(scanner) \(advertiser)"
                var device = devices.withLockedValue { $0[key] }
                if device == nil {
                    let added = try await mock.addDevice(address.description, adapter: scanner)
                    devices.withLockedValue { $0[key] = added }
                    device = added
                }
                guard let device else { continue }
                try await mock.updateProperties(device, interface: "org.bluez.Device1", [
                    ("RSSI", .int16(Int16.random(in: -70 ... -40))),
                    ("ServiceData", serviceData(ThaliAdvertisement.serviceUUIDString,
                                                ThaliAdvertisement(payload: .bluetoothAddress(address)).serviceDataValue)),
                ])
            }
        }
    }
}

/// Three real `thali-node run` processes on the host with Bluetooth played by python-dbusmock's BlueZ
/// (one adapter each on one mock bluetoothd) and the RFCOMM link by ``CrossProcessBluetoothTransport``
/// (selected by `THALI_BLUETOOTH_STANDIN`; the node's code is otherwise what runs over a radio). Alice
/// and Bob also share Wi-Fi (SSDP on loopback), so they reach each other over both bindings; Carol has
/// only Bluetooth, and is killed with SIGKILL while Alice's file reaches her.
@Suite(.serialized, .enabled(if: BlueZMock.peersPresent), .timeLimit(.minutes(3)))
struct NodeProcessesOverBluetoothTests {
    @Test func threeNodesOverBothBindingsAndAReceiverKilledMidFileOverBluetooth() async throws {
        let executable = try #require(PackagePaths.thaliNode(), "thali-node is not built")
        let mock = try await BlueZMock()
        let adapters = ["hci0", "hci1", "hci2"]
        for adapter in adapters { try await mock.addAdapter(adapter) }
        let air = MockAir(mock: mock, adapters: adapters)
        air.start()
        defer { air.stop() }

        let people = try TestPeople(["alice", "bob", "carol"], label: "bt-nodes").people
        let (alice, bob, carol) = (people[0], people[1], people[2])
        let expiry = Date().addingTimeInterval(600)
        // About 3 s at the throttle below, so the kill lands mid-transfer.
        let fileSize = 1_000_000, throttle = 300_000
        let file = Data((0..<fileSize).map { _ in UInt8.random(in: 0...255) })
        let filePath = alice.home.path + "/photo.jpg"
        try file.write(to: URL(fileURLWithPath: filePath))
        var expected: [String: Set<UUID>] = ["alice": [], "bob": [], "carol": []]
        var files: [UUID: Data] = [:]
        // Alice and Bob each send the other a text and a file: each advertises for the other for seconds,
        // long enough to be matched over both bindings.
        for (from, to) in [(alice, bob), (bob, alice)] {
            expected[to.name]!.insert(try from.store.enqueueText("\(from.name) to \(to.name)", to: to.name, expiresAt: expiry).id)
            let content = Data((0..<fileSize).map { _ in UInt8.random(in: 0...255) })
            let path = from.home.path + "/report.pdf"
            try content.write(to: URL(fileURLWithPath: path))
            let item = try from.store.enqueueFile(at: path, to: to.name, expiresAt: expiry)
            expected[to.name]!.insert(item.id)
            files[item.id] = content
        }
        let photo = try alice.store.enqueueFile(at: filePath, to: "carol", expiresAt: expiry)
        expected["carol"]!.insert(photo.id)
        files[photo.id] = file
        expected["alice"]!.insert(try carol.store.enqueueText("carol to alice", to: "alice", expiresAt: expiry).id)

        let scope = "nodes-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        let environment = ["DBUS_SYSTEM_BUS_ADDRESS": mock.busAddress, "THALI_BLUETOOTH_STANDIN": scope]
        let ssdpPort = String(Int.random(in: 20000...60000))
        func start(_ index: Int, wifi: Bool, label: String) throws -> RunningPeer {
            // Both spellings of the adapter: `--bluetooth --adapter hciN`, and Carol's `--bluetooth hciN`
            // (were it ignored, she would take the first adapter, Alice's).
            let bindings = wifi ? ["--address", "127.0.0.1", "--ssdp-port", ssdpPort, "--bluetooth", "--adapter", adapters[index]]
                : ["--bluetooth", adapters[index], "--no-wifi"]
            return try RunningPeer(label, executable, [
                "run", "--home", people[index].home.path, "--json", "--max-age", "5", "--throttle", String(throttle),
            ] + bindings, environment: environment)
        }
        let alicePeer = try start(0, wifi: true, label: "alice")
        let bobPeer = try start(1, wifi: true, label: "bob")
        var carolPeer = try start(2, wifi: false, label: "carol")
        var logs: [RunningPeer] { [alicePeer, bobPeer, carolPeer] }

        // Carol, over Bluetooth only, is partway through the photo: SIGKILL her, then start her again.
        try await carolPeer.waitFor("photo progress", timeout: .seconds(40)) {
            guard let progress = $0.progress, progress.id == photo.id else { return false }
            return progress.bytes > 0 && progress.bytes < UInt64(fileSize / 2)
        }
        carolPeer.kill(signal: SIGKILL)
        #expect(try !carol.store.inbox().contains { $0.itemID == photo.id })
        carolPeer = try start(2, wifi: false, label: "carol (restarted)")
        do {
            try await carolPeer.waitFor("the photo", timeout: .seconds(40)) { $0.receivedItem?.id == photo.id }
        } catch {
            Issue.record("alice's events:\n\(alicePeer.output.suffix(8000))")
            throw error
        }
        // It resumed where her durable bytes ended, not from zero.
        #expect(carolPeer.events.contains {
            if case .delivery(_, .transferStarted(photo.id, let offset, _)) = $0 { offset > 0 } else { false }
        }, "\(carolPeer.output)")

        // Everything else arrives; Alice and Bob have matched each other over both bindings.
        func matched(_ peer: RunningPeer, _ contact: String, _ prefix: String) -> Bool {
            peer.events.contains {
                if case .beaconMatched(contact, let location) = $0 { location.description.hasPrefix(prefix) } else { false }
            }
        }
        // A peer matches a contact only while that contact advertises for it, that is while the contact
        // holds items for it; the first items can all arrive over one binding before the other finds the
        // contact (a loaded machine, a late scan). Until a receiver has matched its sender over both
        // bindings, the test tops the sender's outbox up with a text (`run` reads the store every second).
        var topUps = 0
        let settled = try await waitUntil(timeout: .seconds(40), every: .milliseconds(200)) {
            for (receiver, sender) in [(alice, bob), (bob, alice)] {
                let receiverPeer = receiver.name == "alice" ? alicePeer : bobPeer
                guard !(matched(receiverPeer, sender.name, "bluetooth:") && matched(receiverPeer, sender.name, "http://")),
                      try !sender.store.contactsWithPendingItems().contains(where: { $0.name == receiver.name }) else { continue }
                topUps += 1
                let item = try sender.store.enqueueText("\(sender.name) to \(receiver.name), \(topUps)", to: receiver.name, expiresAt: expiry)
                expected[receiver.name]!.insert(item.id)
            }
            return try people.allSatisfy { Set(try $0.store.inbox().map(\.itemID)) == expected[$0.name] }
                && people.allSatisfy { try $0.store.outbox().isEmpty }
                && [(alicePeer, "bob"), (bobPeer, "alice")].allSatisfy { matched($0, $1, "bluetooth:") && matched($0, $1, "http://") }
        }
        // A sleep, kept: what is counted next is that no item arrived twice, and a link racing on the other
        // binding would bring the duplicate within this second; no event says that none is coming.
        try await Task.sleep(for: .seconds(1))
        for peer in logs { #expect(peer.kill(signal: SIGTERM) == 0, "\(peer.label): \(peer.output.suffix(4000))") }
        if !settled {
            let outputs = logs.map { "--- \($0.label)\n" + String($0.output.suffix(6000)) }
            Issue.record("deliveries did not finish (\(topUps) top-up texts); events:\n\(outputs.joined(separator: "\n"))")
        }
        for person in people {
            let inbox = try person.store.inbox()
            #expect(Set(inbox.map(\.itemID)) == expected[person.name], "\(person.name): \(inbox)")
            #expect(inbox.count == expected[person.name]!.count, "\(person.name) holds a duplicate: \(inbox)")
        }
        for person in people {
            for item in try person.store.inbox() where item.filePath != nil {
                #expect(try Data(contentsOf: URL(fileURLWithPath: item.filePath!)) == files[item.itemID], "\(person.name)")
            }
        }
    }

    /// A device on no network at all (a namespace with only loopback): `run --bluetooth`, without
    /// `--no-wifi`, reports Wi-Fi unavailable in one event and goes on with Bluetooth alone; two such
    /// nodes deliver to each other over it.
    @Test(.enabled(if: TestEnvironment.available(TestEnvironment.canUseNetworkNamespaces)))
    func withNoNetworkRunBluetoothGoesOnAlone() async throws {
        let executable = try #require(PackagePaths.thaliNode(), "thali-node is not built")
        let ip = try #require(ChildProcess.which("ip"))
        let namespace = "tnonet\(getpid())"
        _ = try? ChildProcess.run(ip, ["netns", "del", namespace], timeout: .seconds(10))  // a crashed run's leftover
        #expect(try ChildProcess.run(ip, ["netns", "add", namespace], timeout: .seconds(10)).status == 0)
        defer { _ = try? ChildProcess.run(ip, ["netns", "del", namespace], timeout: .seconds(10)) }
        #expect(try ChildProcess.run(ip, ["netns", "exec", namespace, ip, "link", "set", "lo", "up"], timeout: .seconds(10)).status == 0)

        let mock = try await BlueZMock()
        let adapters = ["hci0", "hci1"]
        for adapter in adapters { try await mock.addAdapter(adapter) }
        let air = MockAir(mock: mock, adapters: adapters)
        air.start()
        defer { air.stop() }
        let pair = try TestPeople(["alice", "bob"], label: "bt-nonet")
        let (alice, bob) = (try pair["alice"], try pair["bob"])
        let expiry = Date().addingTimeInterval(600)
        let toBob = try alice.store.enqueueText("alice to bob, no network", to: "bob", expiresAt: expiry).id
        let toAlice = try bob.store.enqueueText("bob to alice, no network", to: "alice", expiresAt: expiry).id

        // The stand-in radio's sockets are abstract UNIX sockets, which belong to a network namespace:
        // both nodes share this one, as two devices share the air.
        let environment = ["DBUS_SYSTEM_BUS_ADDRESS": mock.busAddress, "THALI_BLUETOOTH_STANDIN": "nonet-\(getpid())"]
        let peers = try [(alice, "hci0"), (bob, "hci1")].map { person, adapter in
            try RunningPeer(person.name, ip, ["netns", "exec", namespace, executable, "run", "--home", person.home.path, "--json",
                                             "--bluetooth", adapter], environment: environment)
        }
        for peer in peers {
            let unavailable = try await peer.waitFor("Wi-Fi unavailable") {
                if case .bindingUnavailable(.wifi, _) = $0 { true } else { false }
            }
            #expect(unavailable == .bindingUnavailable(binding: .wifi, reason: "no usable network interface (up, with an IPv4 address)"),
                    "\(unavailable)")
            let started = try await peer.waitFor("started") { $0.isStarted }
            #expect(started.startedLocation?.binding == .bluetooth, "\(started)")
        }
        try await peers[1].waitFor("Alice's text") { $0.receivedItem?.id == toBob }
        try await peers[0].waitFor("Bob's text") { $0.receivedItem?.id == toAlice }
        for peer in peers { #expect(peer.kill(signal: SIGTERM) == 0, "\(peer.label): \(peer.output.suffix(4000))") }
        #expect(try alice.store.inbox().map(\.itemID) == [toAlice])
        #expect(try bob.store.inbox().map(\.itemID) == [toBob])
        #expect(try alice.store.outbox().isEmpty && bob.store.outbox().isEmpty)
    }
}
