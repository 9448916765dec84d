/// Which wire format of notification beacons to speak. `spec/beacons.md` describes both.
public enum BeaconProfile: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    /// The presence specification as this project resolves its contradictions (the default):
    /// SubjectPublicKeyInfo ephemeral key, AES-128-GCM beacon flags, 192-character PSK identities.
    case spec
    /// Bit-exact with the deployed Thali_CordovaPlugin 2.x: raw ephemeral point, AES-128-CBC beacon
    /// flags, HKDF with salt and key material swapped, hashed 43-character PSK identities.
    case cordova

    public var description: String { rawValue }
}

/// Constants of the beacon wire formats, shared by both profiles.
public enum BeaconWire {
    /// Bytes of the big-endian millisecond expiration that follows the ephemeral key.
    public static let expirationLength = 8
    /// Bytes of one beacon: a 32-byte encrypted flag and a 16-byte truncated HMAC.
    public static let beaconLength = 48
    /// Bytes of the encrypted flag at the start of a beacon.
    public static let flagLength = 32
    /// Bytes of a KeyId (the truncated SHA-256 of a public key).
    public static let keyIdLength = 16
    /// A receiver rejects expirations further than this in its future (`too-far-in-future`).
    public static let maximumFutureMilliseconds: UInt64 = 86_400_000
    /// The random fuzz a generator adds to the expiration is 0 ... this many milliseconds.
    public static let maximumFuzzMilliseconds: UInt64 = 255
    /// The longest validity a generator accepts, so that even with the largest fuzz its own
    /// receivers accept the announcement at the instant it is made.
    public static let maximumValidityMilliseconds: UInt64 = maximumFutureMilliseconds - maximumFuzzMilliseconds
}

extension BeaconProfile {
    /// Bytes of the ephemeral public key at the start of a stream: 88 (SubjectPublicKeyInfo) in
    /// `spec`, 65 (raw uncompressed point) in `cordova`.
    public var ephemeralKeyLength: Int {
        switch self {
        case .spec: 88
        case .cordova: 65
        }
    }

    /// Bytes before the first beacon: ephemeral key and expiration.
    public var preambleLength: Int { ephemeralKeyLength + BeaconWire.expirationLength }

    /// Length of a stream carrying `count` beacons.
    public func streamLength(beaconCount count: Int) -> Int { preambleLength + count * BeaconWire.beaconLength }
}
