import NIOCore

/// The DoS bounds of the Bluetooth binding (seed, "Denial of Service (DOS) Protections"). Every value is
/// configurable; the defaults suit a phone-sized peer.
public struct BluetoothBindingLimits: Sendable, Hashable {
    /// How long a side waits for the peer's handshake octet before closing the stream.
    public var handshakeTimeout: TimeAmount = .seconds(5)
    /// How long the client-side localhost listener waits for the app's one connection before giving up
    /// and closing the Bluetooth stream.
    public var relayAcceptTimeout: TimeAmount = .seconds(30)
    /// How long the server side waits for its localhost connection to the app before closing the
    /// Bluetooth stream.
    public var appConnectTimeout: TimeAmount = .seconds(2)
    /// How long an incoming relay may stay silent after the handshake octet: the client must send its
    /// first bytes (for Thali, a TLS ClientHello) within it, or the relay is closed. A client that says
    /// hello and nothing more cannot hold one of the `maxConcurrentIncomingConnections` slots for long.
    public var relayFirstBytesTimeout: TimeAmount = .seconds(5)
    /// An incoming relay on which no byte moves in either direction for this long is closed.
    public var relayIdleTimeout: TimeAmount = .seconds(120)

    /// Length of the window in which incoming connections are counted.
    public var incomingConnectionWindow: TimeAmount = .seconds(10)
    /// Incoming connections accepted from one Bluetooth address per window; beyond that the address is
    /// refused for `abusiveAddressRefusal`.
    public var maxIncomingConnectionsPerAddress: Int = 8
    /// How long an address that exceeded `maxIncomingConnectionsPerAddress` is refused.
    public var abusiveAddressRefusal: TimeAmount = .seconds(60)
    /// Incoming connections accepted from everyone per window; beyond that the server stops accepting
    /// for `acceptPause`.
    public var maxIncomingConnectionsPerWindow: Int = 64
    /// How long the server refuses everyone after `maxIncomingConnectionsPerWindow` was exceeded.
    public var acceptPause: TimeAmount = .seconds(30)
    /// Incoming relays open at the same time; further connections are refused until one ends.
    public var maxConcurrentIncomingConnections: Int = 16
    /// Distinct addresses remembered for per-address counting; beyond that the oldest entries are
    /// dropped (and the window restarts for them), so the table stays bounded.
    public var maxTrackedAddresses: Int = 1024

    /// Length of the window in which received advertisements are counted.
    public var advertisementWindow: TimeAmount = .seconds(10)
    /// Advertisements (Thali or not) accepted per window; beyond that discovery is switched off for
    /// `discoveryCoolDown`.
    public var maxAdvertisementsPerWindow: Int = 200
    /// How long discovery stays off after too many advertisements.
    public var discoveryCoolDown: TimeAmount = .seconds(60)
    /// Distinct discovered peers remembered (for "new" vs "seen"); the oldest are forgotten beyond it.
    public var maxTrackedPeers: Int = 256

    /// The defaults.
    public init() {}
}

/// Decides whether to accept an incoming Bluetooth connection: per-address and global rate windows,
/// refusal periods, and a cap on concurrent relays. A value type; the server keeps one under its lock.
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

    private struct Window {
        var start: NIODeadline
        var count: Int
    }

    private let limits: BluetoothBindingLimits
    private var perAddress: [BluetoothAddress: Window] = [:]
    private var refusedUntil: [BluetoothAddress: NIODeadline] = [:]
    private var global: Window?
    private var pausedUntil: NIODeadline?
    /// Relays currently open.
    public private(set) var open = 0
    /// Addresses currently remembered (rate windows and refusals), bounded by `maxTrackedAddresses`.
    public var trackedAddresses: Int { perAddress.count + refusedUntil.count }
    /// What the gate has done so far.
    public private(set) var counters = Counters()

    /// A gate with these limits.
    public init(limits: BluetoothBindingLimits) {
        self.limits = limits
    }

    /// Decides about a connection from `address` at `now`; an accepted connection counts as open until
    /// `release()`.
    public mutating func admit(_ address: BluetoothAddress, now: NIODeadline = .now()) -> Decision {
        if let until = pausedUntil {
            if now < until {
                counters.refusedPaused += 1
                return .refusedPaused
            }
            pausedUntil = nil
        }
        if let until = refusedUntil[address] {
            if now < until {
                counters.refusedAddress += 1
                return .refusedAddress(address)
            }
            refusedUntil[address] = nil
        }
        // Global window.
        var globalWindow = global ?? Window(start: now, count: 0)
        if now - globalWindow.start >= limits.incomingConnectionWindow { globalWindow = Window(start: now, count: 0) }
        globalWindow.count += 1
        global = globalWindow
        if globalWindow.count > limits.maxIncomingConnectionsPerWindow {
            pausedUntil = now + limits.acceptPause
            global = nil
            counters.acceptPauses += 1
            counters.refusedPaused += 1
            return .refusedPaused
        }
        // Per-address window.
        var window = perAddress[address] ?? Window(start: now, count: 0)
        if now - window.start >= limits.incomingConnectionWindow { window = Window(start: now, count: 0) }
        window.count += 1
        if window.count > limits.maxIncomingConnectionsPerAddress {
            perAddress[address] = nil
            refusedUntil[address] = now + limits.abusiveAddressRefusal
            trimRefusals(now: now)
            counters.addressesBanned += 1
            counters.refusedAddress += 1
            return .refusedAddress(address)
        }
        perAddress[address] = window
        trimWindows(now: now)
        guard open < limits.maxConcurrentIncomingConnections else {
            counters.refusedBusy += 1
            return .refusedBusy
        }
        open += 1
        counters.accepted += 1
        return .accept
    }

    /// An accepted connection ended.
    public mutating func release() {
        open = max(0, open - 1)
    }

    private mutating func trimWindows(now: NIODeadline) {
        guard perAddress.count > limits.maxTrackedAddresses else { return }
        perAddress = perAddress.filter { now - $0.value.start < limits.incomingConnectionWindow }
        while perAddress.count > limits.maxTrackedAddresses,
              let oldest = perAddress.min(by: { $0.value.start < $1.value.start })
        {
            perAddress[oldest.key] = nil
        }
    }

    private mutating func trimRefusals(now: NIODeadline) {
        guard refusedUntil.count > limits.maxTrackedAddresses else { return }
        refusedUntil = refusedUntil.filter { now < $0.value }
        while refusedUntil.count > limits.maxTrackedAddresses,
              let soonest = refusedUntil.min(by: { $0.value < $1.value })
        {
            refusedUntil[soonest.key] = nil
        }
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
    private var windowStart: NIODeadline?
    private var count = 0
    /// When the current cool-down ends, if one is running.
    public private(set) var coolingDownUntil: NIODeadline?
    /// What the gate has done so far.
    public private(set) var counters = Counters()

    /// A gate with these limits.
    public init(limits: BluetoothBindingLimits) {
        self.limits = limits
    }

    /// Decides about one advertisement received at `now`.
    public mutating func admit(now: NIODeadline = .now()) -> Decision {
        if let until = coolingDownUntil {
            if now < until {
                counters.dropped += 1
                return .coolingDown
            }
            coolingDownUntil = nil
            windowStart = nil
        }
        if let start = windowStart, now - start < limits.advertisementWindow {
            count += 1
        } else {
            windowStart = now
            count = 1
        }
        if count > limits.maxAdvertisementsPerWindow {
            let until = now + limits.discoveryCoolDown
            coolingDownUntil = until
            counters.coolDowns += 1
            counters.dropped += 1
            return .startCoolDown(until: until)
        }
        counters.accepted += 1
        return .accept
    }
}
