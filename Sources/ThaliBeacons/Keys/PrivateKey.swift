import ThaliSupport

/// A secp256k1 secret scalar with its public point: a device identity or an ephemeral beacon key.
public struct PrivateKey: Sendable {
    /// The 32-byte big-endian secret scalar.
    public let rawRepresentation: [UInt8]
    /// The public point of this key.
    public let publicKey: PublicKey

    /// A fresh key from the system CSPRNG.
    public init() {
        let context = Secp256k1Context.shared
        var secret = SecureRandom.bytes(count: 32)
        // A random 256-bit string is out of range with probability ~2^-128; draw again if it is.
        while !context.isValidSecretKey(secret) { secret = SecureRandom.bytes(count: 32) }
        self.rawRepresentation = secret
        self.publicKey = PublicKey(point: context.publicKey(forSecretKey: secret))
    }

    /// Imports 32 raw big-endian bytes; the scalar must be in 1 ..< n.
    public init(rawRepresentation bytes: some Collection<UInt8>) throws(KeyError) {
        let bytes = Array(bytes)
        let context = Secp256k1Context.shared
        guard context.isValidSecretKey(bytes) else {
            throw KeyError(.invalidPrivateKey, "a private key is 32 bytes in 1 ..< n, got \(bytes.count) bytes")
        }
        self.rawRepresentation = bytes
        self.publicKey = PublicKey(point: context.publicKey(forSecretKey: bytes))
    }

    /// Imports 32 bytes written in hex.
    public init(hex: some StringProtocol) throws(KeyError) {
        guard let bytes = Hex.decode(hex) else { throw KeyError(.invalidPrivateKey, "not a hex string") }
        try self.init(rawRepresentation: bytes)
    }

    /// ECDH with `publicKey`: the 32-byte x-coordinate of the shared point.
    public func sharedSecret(with publicKey: PublicKey) -> [UInt8] {
        Secp256k1Context.shared.sharedSecret(secretKey: rawRepresentation, publicKey: publicKey.point)
    }
}
