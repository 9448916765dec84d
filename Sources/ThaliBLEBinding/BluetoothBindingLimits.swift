import NIOCore
import ThaliAdmission
import ThaliSupport

/// The DoS bounds of the Bluetooth binding (seed, "Denial of Service (DOS) Protections"). Every value is
/// configurable; the defaults suit a phone-sized peer.
public struct BluetoothBindingLimits: Sendable, Hashable {
    /// How long a side waits for the peer's handshake octet before closing the stream.
    public var handshakeTimeout: Duration = .seconds(5)
    /// How long the client-side localhost listener waits for the app's one connection before giving up
    /// and closing the Bluetooth stream.
    public var relayAcceptTimeout: Duration = .seconds(30)
    /// How long the server side waits for its localhost connection to the app before closing the
    /// Bluetooth stream.
    public var appConnectTimeout: Duration = .seconds(2)
    /// How long an incoming relay may stay silent after the handshake octet: the client must send its
    /// first bytes (for Thali, a TLS ClientHello) within it, or the relay is closed. A client that says
    /// hello and nothing more cannot hold one of the `maxConcurrentIncomingConnections` slots for long.
    public var relayFirstBytesTimeout: Duration = .seconds(5)
    /// An incoming relay on which no byte moves in either direction for this long is closed.
    public var relayIdleTimeout: Duration = .seconds(120)

    /// Length of the window in which incoming connections are counted.
    public var incomingConnectionWindow: Duration = .seconds(10)
    /// Incoming connections accepted from one Bluetooth address per window; beyond that the address is
    /// refused for `abusiveAddressRefusal`.
    public var maxIncomingConnectionsPerAddress: Int = 8
    /// How long an address that exceeded `maxIncomingConnectionsPerAddress` is refused.
    public var abusiveAddressRefusal: Duration = .seconds(60)
    /// Incoming connections accepted from everyone per window; beyond that the server stops accepting
    /// for `acceptPause`.
    public var maxIncomingConnectionsPerWindow: Int = 64
    /// How long the server refuses everyone after `maxIncomingConnectionsPerWindow` was exceeded.
    public var acceptPause: Duration = .seconds(30)
    /// Incoming relays open at the same time; further connections are refused until one ends.
    public var maxConcurrentIncomingConnections: Int = 16
    /// Distinct addresses remembered for per-address counting; beyond that the oldest entries are
    /// dropped (and the window restarts for them), so the table stays bounded.
    public var maxTrackedAddresses: Int = 1024

    /// Length of the window in which received advertisements are counted.
    public var advertisementWindow: Duration = .seconds(10)
    /// Advertisements (Thali or not) accepted per window; beyond that discovery is switched off for
    /// `discoveryCoolDown`.
    public var maxAdvertisementsPerWindow: Int = 200
    /// How long discovery stays off after too many advertisements.
    public var discoveryCoolDown: Duration = .seconds(60)
    /// Distinct discovered peers remembered (for "new" vs "seen"); the oldest are forgotten beyond it.
    public var maxTrackedPeers: Int = 256

    /// The defaults.
    public init() {}
}

/// Decides whether to accept an incoming Bluetooth connection: the suite's one admission mechanism
/// (ThaliAdmission's `AdmissionGate`) keyed by Bluetooth address, per address before global — a rate per
/// address with a refusal period, then the concurrent relays and the global rate whose excess pauses
/// accepting (the last resort). A value type; the server keeps one under its lock.
public struct IncomingConnectionGate: Sendable {
    /// The decision for one connection.
    public enum Decision: Hashable, Sendable {
        /// Accept it.
        case accept
        /// Refused: this address is in its refusal period (it sent too many connections).
        case refusedAddress(BluetoothAddress)
        /// Refused: the server is in an accept pause (too many connections overall).
        case refusedPaused
        /// Refused: `maxConcurrentIncomingConnections` relays are open.
        case refusedBusy
    }

    /// What the gate has done so far (read by tests and the node's status).
    public struct Counters: Hashable, Sendable {
        /// Connections accepted.
        public var accepted = 0
        /// Connections refused because their address was being refused.
        public var refusedAddress = 0
        /// Connections refused during an accept pause.
        public var refusedPaused = 0
        /// Connections refused because too many relays were open.
        public var refusedBusy = 0
        /// Times an address was put into a refusal period.
        public var addressesBanned = 0
        /// Times the server paused accepting.
        public var acceptPauses = 0
    }

    private var gate: AdmissionGate<BluetoothAddress>

    /// A gate with these limits.
    public init(limits: BluetoothBindingLimits) {
        gate = AdmissionGate(limits: Self.admissionLimits(limits))
    }

    /// The Bluetooth limits as admission limits: per address the rate (`maxIncomingConnectionsPerAddress`
    /// per `incomingConnectionWindow`, then refused for `abusiveAddressRefusal`); in all, the concurrent
    /// relays and the global rate (`maxIncomingConnectionsPerWindow`, then an `acceptPause`).
    static func admissionLimits(_ limits: BluetoothBindingLimits) -> AdmissionLimits {
        var admission = AdmissionLimits()
        admission.maxConnectionsPerSource = limits.maxIncomingConnectionsPerAddress
        admission.sourceWindow = limits.incomingConnectionWindow
        admission.sourceRefusalPeriod = limits.abusiveAddressRefusal
        admission.maxUnauthenticatedPerSource = limits.maxConcurrentIncomingConnections
        admission.maxOpenPerSource = limits.maxConcurrentIncomingConnections
        admission.maxUnauthenticatedGlobal = limits.maxConcurrentIncomingConnections
        admission.maxOpenGlobal = limits.maxConcurrentIncomingConnections
        admission.maxConnectionsGlobal = limits.maxIncomingConnectionsPerWindow
        admission.globalWindow = limits.incomingConnectionWindow
        admission.overloadClosePeriod = limits.acceptPause
        admission.maxTrackedSources = max(limits.maxTrackedAddresses, limits.maxConcurrentIncomingConnections)
        return admission
    }

    /// Relays currently open.
    public var open: Int { gate.open }
    /// Addresses currently remembered, bounded by `maxTrackedAddresses` (addresses with open relays are
    /// never forgotten; there are at most `maxConcurrentIncomingConnections` of them).
    public var trackedAddresses: Int { gate.trackedSources }

    /// What the gate has done so far.
    public var counters: Counters {
        let admission = gate.counters
        return Counters(accepted: admission.admitted, refusedAddress: admission.refusedSourceRate,
                        refusedPaused: admission.refusedOverload,
                        refusedBusy: admission.refusedSourceUnauthenticated + admission.refusedSourceOpen
                            + admission.refusedGlobalUnauthenticated + admission.refusedGlobalOpen,
                        addressesBanned: admission.sourcesRefused, acceptPauses: admission.overloads)
    }

    /// Decides about a connection from `address` at `now`; an accepted connection counts as open until
    /// `release(_:)`.
    public mutating func admit(_ address: BluetoothAddress, now: NIODeadline = .now()) -> Decision {
        switch gate.admit(address, now: now) {
        case .admitted: return .accept
        case .refused(.sourceRate): return .refusedAddress(address)
        case .refused(.overloaded), .refused(.closedForOverload): return .refusedPaused
        case .refused: return .refusedBusy
        }
    }

    /// An accepted connection from `address` ended.
    public mutating func release(_ address: BluetoothAddress) {
        gate.closed(address, authenticated: false)
    }
}

/// Counts received advertisements; too many in a window switch discovery off for a cool-down.
public struct AdvertisementRateGate: Sendable {
    /// The decision for one advertisement.
    public enum Decision: Hashable, Sendable {
        /// Process it.
        case accept
        /// This one tipped the rate over the limit: stop discovery until `until`.
        case startCoolDown(until: NIODeadline)
        /// Discovery is cooling down; drop it.
        case coolingDown
    }

    /// What the gate has done so far.
    public struct Counters: Hashable, Sendable {
        /// Advertisements processed.
        public var accepted = 0
        /// Advertisements dropped (the one that tripped the limit and those during cool-downs).
        public var dropped = 0
        /// Cool-downs started.
        public var coolDowns = 0
    }

    private let limits: BluetoothBindingLimits
    private var window: RateWindow
    /// When the current cool-down ends, if one is running.
    public private(set) var coolingDownUntil: NIODeadline?
    /// What the gate has done so far.
    public private(set) var counters = Counters()

    /// A gate with these limits.
    public init(limits: BluetoothBindingLimits) {
        self.limits = limits
        window = RateWindow(limit: limits.maxAdvertisementsPerWindow, length: limits.advertisementWindow)
    }

    /// Decides about one advertisement received at `now`.
    public mutating func admit(now: NIODeadline = .now()) -> Decision {
        if let until = coolingDownUntil {
            if now < until {
                counters.dropped += 1
                return .coolingDown
            }
            coolingDownUntil = nil
            window.restart()
        }
        if !window.record(now: now) {
            let until = now + TimeAmount(limits.discoveryCoolDown)
            coolingDownUntil = until
            counters.coolDowns += 1
            counters.dropped += 1
            return .startCoolDown(until: until)
        }
        counters.accepted += 1
        return .accept
    }
}
