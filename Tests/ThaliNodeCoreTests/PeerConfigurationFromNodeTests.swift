import Testing
import ThaliNodeBluetooth
import ThaliSSDP
@testable import ThaliNodeCore

/// The one configuration path: `config.json`'s values, a caller's overrides on top, the interface
/// resolved and the one-port rule, in the library (what `thali-node run` and apps both use).
@Suite struct PeerConfigurationFromNodeTests {
    static let path = "/home/node/config.json"

    static func loopback(_ configure: (inout PeerConfiguration.NodeOverrides) -> Void = { _ in }) -> PeerConfiguration.NodeOverrides {
        var overrides = PeerConfiguration.NodeOverrides()
        overrides.address = "127.0.0.1"
        configure(&overrides)
        return overrides
    }

    @Test func configurationValuesWithOverridesOnTop() throws {
        var node = NodeConfiguration()
        node.deliveryPort = 4000
        node.ssdpPort = 41900
        node.beaconValiditySeconds = 120
        let plain = try PeerConfiguration(node: node, configurationPath: Self.path, overrides: Self.loopback())
        #expect(plain.interfaceAddress == "127.0.0.1")
        #expect(plain.port == 4000)
        #expect(plain.ssdpPort == 41900)
        #expect(plain.ssdpGroup == SSDPDiscoveryConfiguration.defaultGroupAddress)
        #expect(plain.beaconValidity == .seconds(120))
        #expect(plain.wifi && plain.bluetooth == nil)

        let overridden = try PeerConfiguration(node: node, configurationPath: Self.path, overrides: Self.loopback {
            $0.port = 0
            $0.ssdpPort = 42000
            $0.maxConnectionsPerSource = 3
            $0.bluetooth = true
            $0.bluetoothAdapter = "hci1"
        }, bluetooth: BluetoothPeerConfiguration.init)
        #expect(overridden.port == 0)
        #expect(overridden.ssdpPort == 42000)
        #expect(overridden.admission.maxConnectionsPerSource == 3)
        #expect(overridden.wifi && overridden.bluetooth?.adapter == "hci1")
    }

    @Test func bluetoothAlonePinsToLoopbackAndTakesTheConfiguredAdapter() throws {
        var node = NodeConfiguration()
        node.bluetooth = true
        node.bluetoothAdapter = "hci2"
        var overrides = PeerConfiguration.NodeOverrides()
        overrides.noWiFi = true
        let configuration = try PeerConfiguration(node: node, configurationPath: Self.path, overrides: overrides,
                                                  bluetooth: BluetoothPeerConfiguration.init)
        #expect(configuration.interfaceAddress == "127.0.0.1")
        #expect(!configuration.wifi)
        #expect(configuration.bluetooth?.adapter == "hci2")
        #expect(configuration.bluetooth?.makeConnectable == true)
        node.bluetoothMakeConnectable = false
        #expect(try PeerConfiguration(node: node, configurationPath: Self.path, overrides: overrides,
                                      bluetooth: BluetoothPeerConfiguration.init).bluetooth?.makeConnectable == false)
    }

    /// A device whose Wi-Fi is off, or that is on no network, still runs Bluetooth: with Bluetooth asked
    /// for, an unusable interface leaves Wi-Fi out with its reason; with Wi-Fi alone it is the error.
    @Test func anUnusableInterfaceLeavesWiFiOutWhenBluetoothRuns() throws {
        var node = NodeConfiguration()
        node.interface = "nosuch0"
        #expect(throws: NodeError.noUsableInterface(name: "nosuch0")) {
            try PeerConfiguration(node: node, configurationPath: Self.path)
        }
        var overrides = PeerConfiguration.NodeOverrides()
        overrides.bluetooth = true
        let configuration = try PeerConfiguration(node: node, configurationPath: Self.path, overrides: overrides,
                                                  bluetooth: BluetoothPeerConfiguration.init)
        #expect(!configuration.wifi)
        #expect(configuration.bluetooth != nil)
        #expect(configuration.interfaceAddress == "127.0.0.1")
        #expect(configuration.wifiUnavailableReason == "network interface \"nosuch0\" is missing, down or has no IPv4 address")
        // An address to pin to is explicit: one that no interface has stays an error.
        overrides.address = "192.0.2.77"
        #expect(throws: NodeError.self) {
            try PeerConfiguration(node: node, configurationPath: Self.path, overrides: overrides, bluetooth: BluetoothPeerConfiguration.init)
        }
        // A usable interface: Wi-Fi runs beside Bluetooth, nothing to report.
        overrides.address = "127.0.0.1"
        let both = try PeerConfiguration(node: node, configurationPath: Self.path, overrides: overrides,
                                         bluetooth: BluetoothPeerConfiguration.init)
        #expect(both.wifi && both.wifiUnavailableReason == nil)
    }

    @Test func contradictionsAreNamed() throws {
        var node = NodeConfiguration()
        node.deliveryPort = 4000
        node.beaconPort = 4001
        #expect(throws: PeerConfiguration.NodeResolutionError(description: "\(Self.path): deliveryPort 4000 and beaconPort 4001 differ, but the peer serves beacons and PSK-TLS on one port")) {
            try PeerConfiguration(node: node, configurationPath: Self.path, overrides: Self.loopback())
        }
        // A port given outright settles it.
        #expect(try PeerConfiguration(node: node, configurationPath: Self.path, overrides: Self.loopback { $0.port = 5000 }).port == 5000)
        #expect(throws: PeerConfiguration.NodeResolutionError.self) {
            try PeerConfiguration(node: NodeConfiguration(), configurationPath: Self.path, overrides: Self.loopback { $0.noWiFi = true })
        }
        #expect(throws: PeerConfiguration.NodeResolutionError(description: "--adapter needs --bluetooth")) {
            try PeerConfiguration(node: NodeConfiguration(), configurationPath: Self.path, overrides: Self.loopback { $0.bluetoothAdapter = "hci0" })
        }
        // Bluetooth asked for by a program that links no Bluetooth binding (ThaliNodeCore alone).
        #expect(throws: PeerConfiguration.NodeResolutionError.self) {
            try PeerConfiguration(node: NodeConfiguration(), configurationPath: Self.path, overrides: Self.loopback { $0.bluetooth = true })
        }
        // An address no interface has.
        #expect(throws: NodeError.self) {
            try PeerConfiguration(node: NodeConfiguration(), configurationPath: Self.path,
                                  overrides: Self.loopback { $0.address = "198.51.100.77" })
        }
    }
}
