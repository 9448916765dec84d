import ThaliSSDP

extension PeerConfiguration {
    /// What a caller (`thali-node run`'s flags, an app) sets on top of a node's `config.json`; nil or
    /// false keeps the configuration's value.
    public struct NodeOverrides: Sendable, Hashable {
        /// The interface to use by name (instead of the configuration's `interface`).
        public var interface: String?
        /// An IPv4 address to pin to instead of an interface (`127.0.0.1` for loopback).
        public var address: String?
        /// The SSDP port (instead of `ssdpPort`).
        public var ssdpPort: Int?
        /// The SSDP group (instead of `ssdpMulticastAddress`).
        public var ssdpGroup: String?
        /// The one port for beacons and PSK-TLS (instead of `deliveryPort`/`beaconPort`; 0: any).
        public var port: Int?
        /// The SSDP max-age announced, in seconds.
        public var maxAge: Int?
        /// Relay mode: the app's local port.
        public var appPort: Int?
        /// Testing aid: each sending stream's bytes per second.
        public var sendThrottleBytesPerSecond: Int?
        /// Connections admitted per source address per window.
        public var maxConnectionsPerSource: Int?
        /// Use Bluetooth even if `config.json` does not.
        public var bluetooth = false
        /// Run without Wi-Fi (Bluetooth alone) even if `config.json` has `wifi`.
        public var noWiFi = false
        /// The Bluetooth adapter (instead of `bluetoothAdapter`).
        public var bluetoothAdapter: String?

        /// No overrides.
        public init() {}
    }

    /// What a node's `config.json` and overrides ask of Bluetooth, for the module that makes the binding
    /// (ThaliNodeBluetooth: `BluetoothPeerConfiguration.init(_:)`).
    public struct NodeBluetoothRequest: Sendable, Hashable {
        /// The adapter (`--adapter`, else `bluetoothAdapter`), or nil for the first powered one.
        public var adapter: String?
        /// `bluetoothMakeConnectable`: whether to turn the adapter's page scan on when it is off.
        public var makeConnectable: Bool

        /// A request for `adapter` (nil: the first powered one).
        public init(adapter: String?, makeConnectable: Bool) {
            self.adapter = adapter
            self.makeConnectable = makeConnectable
        }
    }

    /// A node configuration and overrides that do not make a peer.
    public struct NodeResolutionError: Error, CustomStringConvertible, Hashable {
        public let description: String
    }

    /// The peer configuration of a node: `node`'s values (read from `configurationPath`, named in
    /// errors) with `overrides` on top, the interface resolved (the named one, else the configuration's,
    /// else the first up with IPv4, whose address the peer then follows: ``followsInterface``; an address
    /// given stays fixed; Bluetooth alone pins to 127.0.0.1), and the one-port rule: beacons
    /// and PSK-TLS share one port, which `deliveryPort` or `beaconPort` may name, not two different ones.
    /// With Bluetooth asked for too, an interface that is missing, down or without IPv4 (Wi-Fi off, no
    /// network) does not stop the node: Wi-Fi is left out with the reason in ``wifiUnavailableReason``
    /// and Bluetooth runs alone, on 127.0.0.1.
    ///
    /// Bluetooth, when asked for, is the binding `makeBluetooth` makes from the request, appended to
    /// ``extraBindings``: the caller that links ThaliNodeBluetooth passes `BluetoothPeerConfiguration.init`.
    ///
    /// Throws ``NodeResolutionError`` for contradictions (no binding, an adapter without Bluetooth,
    /// Bluetooth asked for without `makeBluetooth`, two ports), and `NodeError` when the address is not
    /// usable, or the interface is not and Wi-Fi is the only binding.
    public init(node: NodeConfiguration, configurationPath: String, overrides: NodeOverrides = NodeOverrides(),
                bluetooth makeBluetooth: ((NodeBluetoothRequest) -> any PeerBindingFactory)? = nil) throws {
        let useBluetooth = overrides.bluetooth || node.bluetooth
        let useWiFi = !overrides.noWiFi && node.wifi
        if !useWiFi && !useBluetooth {
            throw NodeResolutionError(description: "--no-wifi needs --bluetooth (or \"bluetooth\": true in config.json)")
        }
        if overrides.bluetoothAdapter != nil && !useBluetooth {
            throw NodeResolutionError(description: "--adapter needs --bluetooth")
        }
        if useBluetooth && makeBluetooth == nil {
            throw NodeResolutionError(description: "Bluetooth is asked for (--bluetooth, or \"bluetooth\": true in \(configurationPath)), but this program has no Bluetooth binding (ThaliNodeBluetooth)")
        }
        var interfaceAddress = overrides.address ?? "127.0.0.1"
        var wifiUnavailableReason: String?
        var followed: String?
        if useWiFi {
            if let address = overrides.address {
                try NodeInterface.validateLocalAddress(address)
            } else {
                do {
                    let selected = try NodeInterface.select(configured: overrides.interface ?? node.interface)
                    (interfaceAddress, followed) = (selected.ipv4Address, selected.name)
                } catch let error as NodeError where useBluetooth {
                    guard case .noUsableInterface = error else { throw error }
                    wifiUnavailableReason = "\(error)"
                }
            }
        }
        self.init(interfaceAddress: interfaceAddress)
        self.wifiUnavailableReason = wifiUnavailableReason
        // An interface chosen by name (or by default) is followed; an address given is kept.
        followsInterface = followed
        ssdpGroup = overrides.ssdpGroup ?? node.ssdpMulticastAddress
        ssdpPort = overrides.ssdpPort ?? node.ssdpPort
        let (delivery, beacon) = (node.deliveryPort, node.beaconPort)
        if overrides.port == nil, delivery != 0, beacon != 0, delivery != beacon {
            throw NodeResolutionError(description: "\(configurationPath): deliveryPort \(delivery) and beaconPort \(beacon) differ, but the peer serves beacons and PSK-TLS on one port")
        }
        port = overrides.port ?? (delivery != 0 ? delivery : beacon)
        if let maxAge = overrides.maxAge { self.maxAge = maxAge }
        beaconValidity = node.beaconValidity
        beaconProfile = node.beaconProfile
        deliveryLimits = node.limits
        tls.dhGroup = node.dhGroup
        appPort = overrides.appPort
        sendThrottleBytesPerSecond = overrides.sendThrottleBytesPerSecond
        if let perSource = overrides.maxConnectionsPerSource { admission.maxConnectionsPerSource = perSource }
        wifi = useWiFi && wifiUnavailableReason == nil
        if useBluetooth, let makeBluetooth {
            extraBindings.append(makeBluetooth(NodeBluetoothRequest(adapter: overrides.bluetoothAdapter ?? node.bluetoothAdapter,
                                                                    makeConnectable: node.bluetoothMakeConnectable)))
        }
    }
}
