import Logging
import NIOCore
import NIOPosix
import ThaliNodeCore

extension BluetoothPeerConfiguration: PeerBindingFactory {
    /// Bluetooth.
    public var kind: PeerBindingKind { .bluetooth }

    /// The Bluetooth binding of a peer, not started.
    public func makeBinding(logger: Logger) -> any PeerBindingService {
        PeerBluetoothBinding(configuration: self, group: MultiThreadedEventLoopGroup.singleton, logger: logger)
    }

    /// Bluetooth as a node's `config.json` and overrides ask for it (`PeerConfiguration.init(node:configurationPath:overrides:bluetooth:)`
    /// takes this initializer), defaults elsewhere.
    public init(_ request: PeerConfiguration.NodeBluetoothRequest) {
        self.init(adapter: request.adapter)
        makeConnectable = request.makeConnectable
    }
}

/// Bluetooth among a peer's bindings.
extension PeerConfiguration {
    /// The Bluetooth binding among `extraBindings`, or nil for none; setting it replaces that one
    /// (nil removes it), and a new one starts after the bindings already there.
    public var bluetooth: BluetoothPeerConfiguration? {
        get { extraBindings.lazy.compactMap { $0 as? BluetoothPeerConfiguration }.first }
        set {
            if let index = extraBindings.firstIndex(where: { $0 is BluetoothPeerConfiguration }) {
                extraBindings.remove(at: index)
                if let newValue { extraBindings.insert(newValue, at: index) }
            } else if let newValue {
                extraBindings.append(newValue)
            }
        }
    }
}
