import Foundation

/// One announcement a sender advertises: the stream to publish and, per beacon, the TLS PSK its
/// server must accept from that receiver.
public struct BeaconAnnouncement: Sendable, Hashable {
    /// The profile the stream is written in.
    public let profile: BeaconProfile
    /// The bytes to publish: ephemeral key ‖ expiration ‖ beacons.
    public let stream: [UInt8]
    /// The expiration written in the stream, in milliseconds since the epoch (fuzz included).
    public let expiration: UInt64
    /// One entry per beacon, in stream order.
    public let beacons: [AdvertisedBeacon]

    /// Creates an announcement from its parts (the generator is the usual source).
    public init(profile: BeaconProfile, stream: [UInt8], expiration: UInt64, beacons: [AdvertisedBeacon]) {
        self.profile = profile
        self.stream = stream
        self.expiration = expiration
        self.beacons = beacons
    }
}

/// The sender's view of one beacon: who it is for and the PSK that receiver will present.
public struct AdvertisedBeacon: Sendable, Hashable {
    /// The contact the beacon is addressed to.
    public let receiver: PublicKey
    /// The TLS PSK identity the receiver will send.
    public let pskIdentity: String
    let key: PSKSource

    /// The TLS pre-shared key for that identity. A generator's beacons derive it here, when asked (an
    /// HKDF), not for every beacon of every announcement: most receivers of a crowded announcement
    /// never connect.
    public var psk: [UInt8] { key.psk }

    /// Creates an entry.
    public init(receiver: PublicKey, pskIdentity: String, psk: [UInt8]) {
        self.init(receiver: receiver, pskIdentity: pskIdentity, key: .given(psk))
    }

    init(receiver: PublicKey, pskIdentity: String, key: PSKSource) {
        self.receiver = receiver
        self.pskIdentity = pskIdentity
        self.key = key
    }

    public static func == (lhs: AdvertisedBeacon, rhs: AdvertisedBeacon) -> Bool {
        lhs.receiver == rhs.receiver && lhs.pskIdentity == rhs.pskIdentity && lhs.psk == rhs.psk
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(receiver)
        hasher.combine(pskIdentity)
    }
}

/// Where a sender's PSK comes from: given, or derived from Sxy and the identity when first needed.
enum PSKSource: Sendable, Hashable {
    case given([UInt8])
    case derived(BeaconProfile, sxy: [UInt8], identity: String)

    var psk: [UInt8] {
        switch self {
        case .given(let psk): psk
        case .derived(let profile, let sxy, let identity): profile.psk(sxy: sxy, identity: identity)
        }
    }
}

/// Where a generator or receiver gets "now" from: milliseconds since the epoch.
public struct BeaconClock: Sendable {
    /// Returns the current time in milliseconds since 1970-01-01T00:00:00Z.
    public let now: @Sendable () -> UInt64

    /// A clock that returns `now()`.
    public init(_ now: @escaping @Sendable () -> UInt64) { self.now = now }

    /// The system's wall clock.
    public static let system = BeaconClock {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        return UInt64(max(time.tv_sec, 0)) * 1000 + UInt64(max(time.tv_nsec, 0)) / 1_000_000
    }

    /// A clock stopped at `milliseconds` (for tests and conformance).
    public static func fixed(_ milliseconds: UInt64) -> BeaconClock { BeaconClock { milliseconds } }
}

/// Where a generator gets its randomness: the expiration fuzz byte and the ephemeral key.
public struct BeaconEntropy: Sendable {
    /// Returns the 0 ... 255 ms added to each expiration.
    public let fuzz: @Sendable () -> UInt8
    /// Returns a fresh ephemeral key for each announcement.
    public let ephemeralKey: @Sendable () -> PrivateKey

    /// Entropy from the given sources.
    public init(fuzz: @escaping @Sendable () -> UInt8, ephemeralKey: @escaping @Sendable () -> PrivateKey) {
        self.fuzz = fuzz
        self.ephemeralKey = ephemeralKey
    }

    /// The system CSPRNG; what production uses.
    public static let system = BeaconEntropy(fuzz: { SecureRandom.byte() }, ephemeralKey: { PrivateKey() })
}
