import Logging

/// A binding beside Wi-Fi as ``PeerConfiguration/extraBindings`` carries it: its settings, and the making
/// of the binding from them when the peer starts. ThaliNodeBluetooth's `BluetoothPeerConfiguration` is one.
public protocol PeerBindingFactory: Sendable {
    /// Which binding this makes.
    var kind: PeerBindingKind { get }

    /// A new binding, not started, which logs to `logger`. Its network work runs on NIO's shared event
    /// loops (`MultiThreadedEventLoopGroup.singleton`), as the peer's does.
    func makeBinding(logger: Logger) -> any PeerBindingService
}
