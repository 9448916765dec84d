import NIOCore
import ThaliSSDP

/// What a binding reports to the peer.
public enum PeerBindingEvent: Sendable {
    /// A peer was heard (`origin`: its SSDP location, or its Bluetooth address).
    case peerAppeared(origin: PeerLocation)
    /// A peer left.
    case peerLeft(origin: PeerLocation, reason: PeerDepartureReason)
    /// A peer's beacons, fetched from `origin`; its one port is reached at `location`, a TCP address the
    /// peer connects to (a binding whose radio is not IP relays it, as Bluetooth does on 127.0.0.1).
    case beaconsFetched(origin: PeerLocation, location: BeaconLocation, bytes: [UInt8])
    /// Fetching the beacons of the peer at `origin` failed (or was not tried: its source is ignored).
    case beaconFetchFailed(origin: PeerLocation, kind: BeaconFetchFailure.Kind)
    /// A DoS limit of the binding fired and switched something off for a while.
    case limitTriggered(PeerLimitReport)
}

/// A binding as the peer sees it: it discovers peers and hands their beacon streams to the one beacon
/// receiver, makes the node's one port reachable to peers, and announces what the node advertises.
/// Matching, PSK-TLS, the multiplexer and delivery are the peer's, the same over every binding
/// (`PeerWiFiBinding`: SSDP, built in; ThaliNodeBluetooth's `PeerBluetoothBinding`: BLE and RFCOMM). A
/// binding beside Wi-Fi comes to the peer through a ``PeerBindingFactory`` in
/// ``PeerConfiguration/extraBindings``; the peer calls these methods from its own tasks.
public protocol PeerBindingService: AnyObject, Sendable {
    /// Which binding this is.
    var kind: PeerBindingKind { get }

    /// Starts discovery and makes `nodeHost:nodePort` (the node's one port) reachable; reports to
    /// `events`. Throws, with a description naming the cause, when the binding cannot run.
    func start(nodeHost: String, nodePort: Int, events: @escaping @Sendable (PeerBindingEvent) -> Void) async throws

    /// Announces that the node serves `announcement` on its port (nil: nothing). `isRotation`: the same
    /// contacts, the next of several announcements served in turn.
    func advertise(_ announcement: [UInt8]?, isRotation: Bool) async

    /// The port was closed for an overload: stop inviting connections for `period`.
    func pauseAnnouncing(for period: Duration)

    /// Where peers find this node over the binding, once started.
    func location() async -> PeerLocation?

    /// Whether `location`, a route this binding handed out (the caller asks the route's binding only),
    /// can never answer again.
    func hasEnded(_ location: BeaconLocation) -> Bool

    /// Whether a connection to the node's port from `remoteHost` came over this binding.
    func carries(remoteHost: String) -> Bool

    /// Beacons this binding fetched from `location` matched a contact: a binding that narrows keeps it
    /// ahead of strangers.
    func contactMatched(at location: BeaconLocation)

    /// Stops: announcements withdrawn, connections closed.
    func stop() async

    /// The node's address moved to `host` (the followed interface lost the old one) and its one port
    /// listens there on `nodePort`: a binding that uses the address moves to it (Wi-Fi: SSDP's sockets
    /// and LOCATION).
    func interfaceAddressChanged(to host: String, nodePort: Int) async

    /// SSDP discovery's health, for ``PeerStatus`` (the Wi-Fi binding's; nil for others).
    func ssdpHealth() async -> PeerSSDPHealth?
}

extension PeerBindingService {
    /// Nothing to move: a binding that does not use the node's address ignores it.
    public func interfaceAddressChanged(to host: String, nodePort: Int) async {}

    /// Nothing to keep: a binding that does not narrow ignores it.
    public func contactMatched(at location: BeaconLocation) {}

    /// No SSDP: nil.
    public func ssdpHealth() async -> PeerSSDPHealth? { nil }
}
