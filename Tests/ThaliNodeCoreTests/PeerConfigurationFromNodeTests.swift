import Testing
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
        })
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
        let configuration = try PeerConfiguration(node: node, configurationPath: Self.path, overrides: overrides)
        #expect(configuration.interfaceAddress == "127.0.0.1")
        #expect(!configuration.wifi)
        #expect(configuration.bluetooth?.adapter == "hci2")
        #expect(configuration.bluetooth?.makeConnectable == true)
        node.bluetoothMakeConnectable = false
        #expect(try PeerConfiguration(node: node, configurationPath: Self.path, overrides: overrides).bluetooth?.makeConnectable == false)
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
        // An address no interface has.
        #expect(throws: NodeError.self) {
            try PeerConfiguration(node: NodeConfiguration(), configurationPath: Self.path,
                                  overrides: Self.loopback { $0.address = "198.51.100.77" })
        }
    }
}
