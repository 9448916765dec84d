import Crypto
import Foundation
import ThaliSupport
import _CryptoExtras

/// The key that opens every beacon flag of one announcement for one receiver. It depends only on
/// Sey and the expiration, so a receiver derives it once per stream, not once per beacon.
struct FlagKey {
    enum Cipher {
        /// `spec`: AES-128-GCM with HKey = KM[16..<32] and nonce KM[0..<12].
        case gcm(SymmetricKey, AES.GCM.Nonce)
        /// `cordova`: AES-128-CBC with OpenSSL's EVP_BytesToKey(MD5) key and IV from a 16-byte HKey.
        case cbc(SymmetricKey, AES._CBC.IV)
    }

    let cipher: Cipher

    /// `spec` only: the keystream block GCM XORs onto the 16-byte KeyId (the encryption of counter
    /// block 2), found by sealing 16 zero bytes. A flag's first 16 bytes XOR this give the KeyId the
    /// flag carries if its tag verifies, so a receiver can look the KeyId up before paying for the
    /// tag check. `nil` for `cordova`, whose CBC flags have no such shortcut.
    func gcmKeystream() -> (high: UInt64, low: UInt64)? {
        guard case .gcm(let key, let nonce) = cipher,
              let box = try? AES.GCM.seal([UInt8](repeating: 0, count: 16), using: key, nonce: nonce)
        else { return nil }
        let block = Array(box.ciphertext)
        return (block[0..<8].reduce(0) { $0 << 8 | UInt64($1) }, block[8..<16].reduce(0) { $0 << 8 | UInt64($1) })
    }
}

/// HKDF with one side fixed to an announcement's expiration, as in the flag key (with Sey) and the
/// beacon HMAC key (with Sxy) of every beacon. `spec` salts with the expiration, which is therefore
/// keyed once for a whole announcement; `cordova` salts with the secret.
struct ExpirationDerivation {
    let profile: BeaconProfile
    /// The 8 big-endian bytes of the expiration.
    let expiration: ArraySlice<UInt8>
    /// `spec`: HMAC keyed with the expiration, HKDF's salt.
    private let expirationSalt: HMACSHA256.Key?

    init(profile: BeaconProfile, expiration: ArraySlice<UInt8>) {
        self.profile = profile
        self.expiration = expiration
        expirationSalt = profile == .spec ? HMACSHA256.Key(expiration) : nil
    }

    /// HKDF(secret, expiration) in this profile's order, `count` ≤ 32 bytes.
    func derive(secret: [UInt8], count: Int) -> [UInt8] {
        withDerivedKey(secret: secret) { Array($0.prefix(count)) }
    }

    /// Hands the 32 bytes of HKDF(secret, expiration) to `body` from the stack, zeroed afterwards (a
    /// generator derives two per beacon and keeps neither).
    func withDerivedKey<Result>(secret: [UInt8], _ body: (UnsafeRawBufferPointer) -> Result) -> Result {
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: HMACSHA256.digestSize) { key in
            defer { key.initialize(repeating: 0) }
            if let expirationSalt {
                secret.withUnsafeBytes { expirationSalt.deriveKey(inputKeyMaterial: $0, into: key.baseAddress!) }  // capacity 32
            } else {
                _ = key.initialize(from: profile.derive(secret: secret, other: expiration, count: HMACSHA256.digestSize))
            }
            return body(UnsafeRawBufferPointer(key))
        }
    }
}

/// The cryptographic steps of both profiles. Where the profiles differ only in the order of HKDF's
/// arguments, one function (`derive`) takes the order from the profile.
extension BeaconProfile {
    /// HKDF-SHA256 with empty info. `spec` uses the secret as input key material and `other` as salt
    /// (RFC 5869 as the presence spec names them); `cordova` swaps the two, as deployed.
    func derive(secret: some ContiguousBytes, other: some ContiguousBytes, count: Int) -> [UInt8] {
        switch self {
        case .spec: HMACSHA256.deriveKey(inputKeyMaterial: secret, salt: other, count: count)
        case .cordova: HMACSHA256.deriveKey(inputKeyMaterial: other, salt: secret, count: count)
        }
    }

    /// The ephemeral key as written at the start of a stream.
    func encodeEphemeralKey(_ key: PublicKey) -> [UInt8] {
        switch self {
        case .spec: key.subjectPublicKeyInfo
        case .cordova: key.uncompressed
        }
    }

    /// The ephemeral key of a stream, or `nil` when it is not an uncompressed point on the curve in
    /// this profile's encoding.
    func decodeEphemeralKey(_ bytes: ArraySlice<UInt8>) -> PublicKey? {
        switch self {
        case .spec: try? PublicKey(subjectPublicKeyInfo: bytes)
        case .cordova: bytes.first == 0x04 ? try? PublicKey(sec1: bytes) : nil
        }
    }

    /// The flag key for one (Sey, expiration).
    func flagKey(sey: [UInt8], derivation: ExpirationDerivation) -> FlagKey {
        switch self {
        case .spec:
            // The spec slices a 16-byte IV; GCM's nonce is 12 bytes, so we take KM[0..<12].
            return derivation.withDerivedKey(secret: sey) { material in
                // Cannot fire: `Nonce(data:)` throws only for fewer than 12 bytes, and `material` is always the
                // 32-byte HMAC-SHA256 output (`withDerivedKey`), so this slice is 12 bytes whatever a peer sent.
                let nonce = try! AES.GCM.Nonce(data: UnsafeRawBufferPointer(rebasing: material[0..<12]))
                return FlagKey(cipher: .gcm(SymmetricKey(data: UnsafeRawBufferPointer(rebasing: material[16..<32])), nonce))
            }
        case .cordova:
            let (key, iv) = cbcKeyAndIV(sey: sey, derivation: derivation)
            return FlagKey(cipher: .cbc(key, iv))
        }
    }

    /// `cordova`'s flag key: crypto.createCipher('aes128', hkey), OpenSSL's EVP_BytesToKey(MD5, no salt,
    /// 1 round) of a 16-byte HKey.
    private func cbcKeyAndIV(sey: [UInt8], derivation: ExpirationDerivation) -> (SymmetricKey, AES._CBC.IV) {
        let hkey = derivation.derive(secret: sey, count: 16)
        let key = Array(Insecure.MD5.hash(data: hkey))
        let iv = Array(Insecure.MD5.hash(data: key + hkey))
        // Cannot fire: `IV(ivBytes:)` throws only when given other than 16 bytes, and an MD5 digest is 16.
        return (SymmetricKey(data: key), try! AES._CBC.IV(ivBytes: iv))
    }

    /// Appends the 32-byte flag that encrypts `keyId` (16 bytes) for the receiver of `sey` to `stream`:
    /// the key `flagKey(sey:derivation:)` gives, without making one (`spec` seals with `sealer`, its
    /// key material on the stack).
    func sealFlag(_ keyId: [UInt8], sey: [UInt8], derivation: ExpirationDerivation, using sealer: GCMFlagSealer,
                  into stream: inout [UInt8]) throws(BeaconGenerationError) {
        switch self {
        case .spec:
            derivation.withDerivedKey(secret: sey) { material in
                sealer.seal(keyId, key: UnsafeRawBufferPointer(rebasing: material[16..<32]),
                            nonce: UnsafeRawBufferPointer(rebasing: material[0..<12]), into: &stream)
            }
        case .cordova:
            let (key, iv) = cbcKeyAndIV(sey: sey, derivation: derivation)
            // The key is an MD5 digest (16 bytes), but the cipher context can still fail to be made.
            do {
                stream.append(contentsOf: try AES._CBC.encrypt(keyId, using: key, iv: iv))
            } catch {
                throw BeaconGenerationError("AES-128-CBC of a flag failed: \(error)")
            }
        }
    }

    /// Decrypts a 32-byte flag; `nil` unless it yields a 16-byte KeyId (GCM: the tag verifies;
    /// CBC: the second block decrypts to a full PKCS#7 padding block).
    func openFlag(_ flag: ArraySlice<UInt8>, with flagKey: FlagKey) -> KeyId? {
        switch flagKey.cipher {
        case .gcm(let key, let nonce):
            guard let box = try? AES.GCM.SealedBox(nonce: nonce, ciphertext: flag.prefix(16), tag: flag.dropFirst(16)),
                  let plaintext = try? AES.GCM.open(box, using: key)
            else { return nil }
            return KeyId(bytes: plaintext)
        case .cbc(let key, let iv):
            // Upstream passes any well-padded plaintext to its address book, whose lookup can only
            // succeed for 16 bytes; asking for exactly one data block plus a full pad block is the
            // same test without a lookup of garbage.
            guard let plaintext = try? AES._CBC.decrypt(flag, using: key, iv: iv, noPadding: true),
                  plaintext.count == 32, plaintext.suffix(16).allSatisfy({ $0 == 16 })
            else { return nil }
            return KeyId(bytes: plaintext.prefix(16))
        }
    }

    /// The 16-byte beacon HMAC: HMAC-SHA256(HKxy, expiration)[0..<16], HKxy = HKDF(Sxy, expiration).
    func beaconHmac(sxy: [UInt8], derivation: ExpirationDerivation) -> [UInt8] {
        var hmac: [UInt8] = []
        appendBeaconHmac(sxy: sxy, derivation: derivation, to: &hmac)
        return hmac
    }

    /// Appends the 16-byte beacon HMAC to `stream`.
    func appendBeaconHmac(sxy: [UInt8], derivation: ExpirationDerivation, to stream: inout [UInt8]) {
        derivation.withDerivedKey(secret: sxy) { hkxy in
            withUnsafeTemporaryAllocation(of: UInt8.self, capacity: HMACSHA256.digestSize) { mac in
                derivation.expiration.withUnsafeBytes { HMACSHA256.Key(hkxy).authenticate($0, into: mac.baseAddress!) }  // capacity 32
                stream.append(contentsOf: mac.prefix(16))
            }
        }
    }

    /// The TLS PSK identity for a beacon: base64 of preamble ‖ beacon (`spec`, 192 characters) or
    /// unpadded URL-safe base64 of SHA-256(preamble ‖ beacon) (`cordova`, 43 characters).
    package func pskIdentity(preamble: ArraySlice<UInt8>, beacon: ArraySlice<UInt8>) -> String {
        switch self {
        case .spec:
            return Base64.encode(preamble, beacon)
        case .cordova:
            var hash = SHA256()
            preamble.withUnsafeBytes { hash.update(bufferPointer: $0) }
            beacon.withUnsafeBytes { hash.update(bufferPointer: $0) }
            return Base64.encode(ArraySlice(hash.finalize()), urlSafe: true)
        }
    }

    /// The TLS pre-shared key for a PSK identity: HKDF(Sxy, identity), 16 bytes (`spec`) or 32 (`cordova`).
    func psk(sxy: [UInt8], identity: String) -> [UInt8] {
        derive(secret: sxy, other: Array(identity.utf8), count: self == .spec ? 16 : 32)
    }
}

/// Compares two byte sequences in time that depends only on their length.
func constantTimeEqual(_ lhs: some Collection<UInt8>, _ rhs: some Collection<UInt8>) -> Bool {
    guard lhs.count == rhs.count else { return false }
    var difference: UInt8 = 0
    for (left, right) in zip(lhs, rhs) { difference |= left ^ right }
    return difference == 0
}

extension UInt64 {
    /// The 8 big-endian bytes of the value.
    var bigEndianBytes: [UInt8] { (0..<8).map { UInt8(truncatingIfNeeded: self >> (56 - 8 * $0)) } }

    /// Reads 8 big-endian bytes.
    init(bigEndianBytes bytes: ArraySlice<UInt8>) {
        self = bytes.reduce(0) { $0 << 8 | UInt64($1) }
    }
}
