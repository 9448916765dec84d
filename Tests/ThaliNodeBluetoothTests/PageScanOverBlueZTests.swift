import Logging
import NIOConcurrencyHelpers
import NIOPosix
import Testing
import ThaliNodeBluetooth
import ThaliNodeCore
import ThaliBluetoothTestSupport
@testable import ThaliBLEBinding

/// The controller's page scan as the test sets it, and how often the node read it.
final class PageScanSwitch: Sendable {
    private let state = NIOLockedValueBox((on: false, reads: 0))

    var reads: Int { state.withLockedValue { $0.reads } }

    func turnOn() { state.withLockedValue { $0.on = true } }

    /// One read by the node.
    func read() -> Bool {
        state.withLockedValue { state in
            state.reads += 1
            return state.on
        }
    }
}

/// The in-process stand-in radio, except that the controller's page scan is off until the test turns it on.
struct PageScanGatedTransport: BluetoothTransport {
    let air: any BluetoothTransport
    let pageScan: PageScanSwitch

    func connect(to address: BluetoothAddress, channel: UInt8) async throws -> BluetoothSocket {
        try await air.connect(to: address, channel: channel)
    }

    func listen(channel: UInt8) async throws -> any BluetoothListener {
        try await air.listen(channel: channel)
    }

    func acceptsIncomingStreams(adapterIndex: Int) -> Bool? { pageScan.read() }
}

/// A node whose adapter has page scan off (python-dbusmock's BlueZ, the stand-in radio with page scan
/// under the test's control): it turns `Discoverable` on, advertises only once page scan is on or its
/// bounded wait ran out, and turns `Discoverable` off when it stops.
@Suite(.serialized, .enabled(if: BlueZMock.peersPresent), .timeLimit(.minutes(2))) struct PageScanOverBlueZTests {
    static let adapter = "/org/bluez/hci0"

    /// A started binding on a new mock's hci0, reading page scan from `pageScan`.
    static func binding(_ pageScan: PageScanSwitch, wait: PageScanWait,
                        makeConnectable: Bool = true) async throws -> (any PeerBindingService, BlueZMock) {
        let mock = try await BlueZMock()
        try await mock.addAdapter("hci0")
        let air = InProcessBluetoothAir()
        var configuration = BluetoothPeerConfiguration(adapter: "hci0")
        configuration.busAddress = mock.busAddress
        configuration.transport = { PageScanGatedTransport(air: air.transport(for: $0), pageScan: pageScan) }
        configuration.pageScanWait = wait
        configuration.makeConnectable = makeConnectable
        var logger = Logger(label: "test.page-scan")
        logger.logLevel = .critical
        let binding = configuration.makeBinding(logger: logger)
        try await binding.start(nodeHost: "127.0.0.1", nodePort: 9, events: { _ in })
        return (binding, mock)
    }

    /// The values the node set `Discoverable` to, in order, from the mock's log (the mock's own scan
    /// also changes the property, so reading it would not tell).
    static func discoverableSets(_ mock: BlueZMock) -> [Bool] {
        (mock.mock?.output ?? "").split(separator: "\n").filter { $0.contains("Set \(adapter) org.bluez.Adapter1.Discoverable") }
            .map { $0.hasSuffix("True") }
    }

    static func registrations(_ mock: BlueZMock) async throws -> Int {
        try await mock.calls(adapter, "RegisterAdvertisement").count
    }

    static func waitUntil(_ what: String, _ condition: () async throws -> Bool) async throws {
        if try await ThaliTestSupport.waitUntil(timeout: .seconds(30), condition) { return }
        Issue.record("timed out waiting for \(what)")
    }

    @Test func withPageScanOffTheNodeTurnsDiscoverableOnAndAdvertisesOnceItComesOn() async throws {
        let pageScan = PageScanSwitch()
        let (binding, mock) = try await Self.binding(pageScan, wait: PageScanWait(timeout: .seconds(60), interval: .milliseconds(10)))
        let advertising = Task { await binding.advertise([1, 2, 3], isRotation: false) }
        try await Self.waitUntil("Discoverable set") { Self.discoverableSets(mock) == [true] }
        // The first read found it off; further reads are the wait for it.
        try await Self.waitUntil("a read after Discoverable") { pageScan.reads >= 3 }
        #expect(try await Self.registrations(mock) == 0)
        pageScan.turnOn()
        await advertising.value
        #expect(try await Self.registrations(mock) == 1)
        await binding.stop()
        try await Self.waitUntil("Discoverable reset") { Self.discoverableSets(mock) == [true, false] }
    }

    @Test func pageScanThatNeverComesOnIsWaitedForOnlyUpToItsBound() async throws {
        let pageScan = PageScanSwitch()
        let (binding, mock) = try await Self.binding(pageScan, wait: PageScanWait(timeout: .milliseconds(200), interval: .milliseconds(20)))
        // Advertising goes ahead once the bound ran out (peers may still connect once page scan comes on).
        await binding.advertise([1, 2, 3], isRotation: false)
        #expect(try await Self.registrations(mock) == 1)
        try await Self.waitUntil("Discoverable set") { Self.discoverableSets(mock) == [true] }
        // The first read, then at most one after each interval of the bound (sleeps never end early).
        #expect(pageScan.reads >= 3 && pageScan.reads <= 2 + 200 / 20)
        await binding.stop()
        try await Self.waitUntil("Discoverable reset") { Self.discoverableSets(mock) == [true, false] }
    }

    @Test func pageScanAlreadyOnOrNotOursToTurnOnIsReadOnce() async throws {
        for makeConnectable in [true, false] {
            let pageScan = PageScanSwitch()
            if makeConnectable { pageScan.turnOn() }
            let (binding, mock) = try await Self.binding(pageScan, wait: PageScanWait(), makeConnectable: makeConnectable)
            await binding.advertise([1, 2, 3], isRotation: false)
            #expect(try await Self.registrations(mock) == 1)
            // One read, and no more: on already, or not ours to turn on (nothing set Discoverable).
            #expect(pageScan.reads == 1)
            await binding.stop()
        }
    }
}
