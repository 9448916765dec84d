import Crypto
import ThaliSupport

/// The 16-byte identifier a beacon flag carries: the first half of SHA-256 over the sender's public
/// key, encoded as SubjectPublicKeyInfo (`spec`) or as the raw uncompressed point (`cordova`).
public struct KeyId: Hashable, Sendable, CustomStringConvertible {
    // Two words make hashing and comparing in the scan loop cheap.
    private let high: UInt64
    private let low: UInt64

    /// The KeyId of `key` in `profile`.
    public init(of key: PublicKey, profile: BeaconProfile) {
        let encoded = profile == .spec ? key.subjectPublicKeyInfo : key.uncompressed
        self.init(digestPrefix: SHA256.hash(data: encoded))
    }

    /// A KeyId from exactly 16 bytes; `nil` otherwise.
    public init?(bytes: some Collection<UInt8>) {
        guard bytes.count == BeaconWire.keyIdLength else { return nil }
        var high: UInt64 = 0
        var low: UInt64 = 0
        for (index, byte) in bytes.enumerated() {
            if index < 8 { high = high << 8 | UInt64(byte) } else { low = low << 8 | UInt64(byte) }
        }
        self.high = high
        self.low = low
    }

    /// The KeyId that XOR-ing the first 16 bytes of `bytes` with `keystream` gives; no allocation.
    init(bytes: ArraySlice<UInt8>, xoring keystream: (high: UInt64, low: UInt64)) {
        var high: UInt64 = 0
        var low: UInt64 = 0
        var index = bytes.startIndex
        for _ in 0..<8 {
            high = high << 8 | UInt64(bytes[index])
            index += 1
        }
        for _ in 0..<8 {
            low = low << 8 | UInt64(bytes[index])
            index += 1
        }
        self.high = high ^ keystream.high
        self.low = low ^ keystream.low
    }

    private init(digestPrefix digest: SHA256.Digest) {
        var bytes = [UInt8]()
        bytes.reserveCapacity(BeaconWire.keyIdLength)
        for byte in digest.prefix(BeaconWire.keyIdLength) { bytes.append(byte) }
        self.init(bytes: bytes)!  // exactly 16 bytes of a 32-byte digest
    }

    /// The 16 bytes.
    public var bytes: [UInt8] {
        (0..<8).map { UInt8(truncatingIfNeeded: high >> (56 - 8 * $0)) }
            + (0..<8).map { UInt8(truncatingIfNeeded: low >> (56 - 8 * $0)) }
    }

    public var description: String { Hex.encode(bytes) }
}
