import Crypto
import Foundation

/// HMAC-SHA-256 (RFC 2104) and HKDF-SHA-256 (RFC 5869, at most 32 output bytes) built directly on
/// swift-crypto's `SHA256`. swift-crypto's `HMAC` and `HKDF` copy keys through `SymmetricKey` byte
/// by byte, which cost more than half of a 20-beacon generation; this does the same arithmetic with
/// one 64-byte stack buffer. Tests compare it with `HMAC<SHA256>` and `HKDF<SHA256>`.
enum HMACSHA256 {
    private static let blockSize = 64

    /// HMAC-SHA-256 of whatever `feed` adds to the inner hash, under `key`.
    static func authenticationCode(
        key: some ContiguousBytes, _ feed: (inout SHA256) -> Void
    ) -> SHA256.Digest {
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: blockSize) { pad in
            pad.initialize(repeating: 0)
            key.withUnsafeBytes { key in
                if key.count > blockSize {
                    var keyHash = SHA256()
                    keyHash.update(bufferPointer: key)
                    keyHash.finalize().withUnsafeBytes { digest in
                        for index in 0..<digest.count { pad[index] = digest[index] }
                    }
                } else {
                    for index in 0..<key.count { pad[index] = key[index] }
                }
            }
            for index in 0..<blockSize { pad[index] ^= 0x36 }
            var inner = SHA256()
            inner.update(bufferPointer: UnsafeRawBufferPointer(pad))
            feed(&inner)
            let innerDigest = inner.finalize()
            for index in 0..<blockSize { pad[index] ^= 0x36 ^ 0x5c }
            var outer = SHA256()
            outer.update(bufferPointer: UnsafeRawBufferPointer(pad))
            innerDigest.withUnsafeBytes { outer.update(bufferPointer: $0) }
            for index in 0..<blockSize { pad[index] = 0 }
            return outer.finalize()
        }
    }

    /// HMAC-SHA-256 of `message` under `key`.
    static func authenticationCode(key: some ContiguousBytes, message: some ContiguousBytes) -> SHA256.Digest {
        authenticationCode(key: key) { hash in message.withUnsafeBytes { hash.update(bufferPointer: $0) } }
    }

    /// HKDF-SHA-256 with empty info and `count` ≤ 32 output bytes (a single expand block).
    static func deriveKey(inputKeyMaterial: some ContiguousBytes, salt: some ContiguousBytes, count: Int) -> [UInt8] {
        precondition((1...32).contains(count), "one HKDF-SHA-256 block gives 1 ... 32 bytes")
        let pseudoRandomKey = authenticationCode(key: salt, message: inputKeyMaterial)
        let block = authenticationCode(key: pseudoRandomKey) { hash in
            withUnsafeBytes(of: UInt8(1)) { hash.update(bufferPointer: $0) }
        }
        return Array(block.prefix(count))
    }
}
