import Logging
import NIOCore

/// A binding beside Wi-Fi as ``PeerConfiguration/extraBindings`` carries it: its settings, and the making
/// of the binding from them when the peer starts. ThaliNodeBluetooth's `BluetoothPeerConfiguration` is one.
public protocol PeerBindingFactory: Sendable {
    /// Which binding this makes.
    var kind: PeerBindingKind { get }

    /// A new binding, not started, whose network work runs on `group` and which logs to `logger`.
    func makeBinding(group: any EventLoopGroup, logger: Logger) -> any PeerBindingService
}
