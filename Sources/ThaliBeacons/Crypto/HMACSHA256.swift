import COpenSSL
import Foundation

/// HMAC-SHA-256 (RFC 2104) and HKDF-SHA-256 (RFC 5869, at most 32 output bytes) on OpenSSL's
/// block-level SHA-256, whose context is a plain struct: nothing is allocated but the output.
///
/// A ``Key`` holds the two hash states after the padded key, so each MAC under it costs two
/// compressions and a copy. Every beacon of an announcement derives keys with the same salt, its
/// expiration (``ExpirationDerivation``), which is keyed once for all of them. swift-crypto's `SHA256`
/// allocates a context per hash, and a 20-beacon announcement made about 300 of them. Tests compare
/// this with swift-crypto's `HMAC<SHA256>` and `HKDF<SHA256>`.
enum HMACSHA256 {
    static let blockSize = 64
    static let digestSize = 32

    /// An HMAC-SHA-256 key, hashed into its inner and outer states.
    struct Key {
        private var inner = SHA256_CTX()
        private var outer = SHA256_CTX()

        /// Keys HMAC with `key` (hashed first when longer than a block, as RFC 2104 says).
        init(_ key: UnsafeRawBufferPointer) {
            withUnsafeTemporaryAllocation(of: UInt8.self, capacity: HMACSHA256.blockSize) { pad in
                pad.initialize(repeating: 0)
                if key.count > HMACSHA256.blockSize {
                    var hash = SHA256_CTX()
                    thali_SHA256_Init(&hash)
                    thali_SHA256_Update(&hash, key.baseAddress, key.count)
                    thali_SHA256_Final(pad.baseAddress, &hash)
                } else if let base = key.baseAddress {
                    pad.baseAddress?.update(from: base.assumingMemoryBound(to: UInt8.self), count: key.count)
                }
                for index in pad.indices { pad[index] ^= 0x36 }
                thali_SHA256_Init(&inner)
                thali_SHA256_Update(&inner, pad.baseAddress, pad.count)
                for index in pad.indices { pad[index] ^= 0x36 ^ 0x5c }
                thali_SHA256_Init(&outer)
                thali_SHA256_Update(&outer, pad.baseAddress, pad.count)
                pad.initialize(repeating: 0)  // the key, xored: not left on the stack
            }
        }

        /// Keys HMAC with `key`.
        init(_ key: some ContiguousBytes) {
            self = key.withUnsafeBytes { Key($0) }
        }

        /// Writes the 32-byte MAC of `message` to `output`.
        func authenticate(_ message: UnsafeRawBufferPointer, into output: UnsafeMutablePointer<UInt8>) {
            var hash = inner
            thali_SHA256_Update(&hash, message.baseAddress, message.count)
            thali_SHA256_Final(output, &hash)
            hash = outer
            thali_SHA256_Update(&hash, output, HMACSHA256.digestSize)
            thali_SHA256_Final(output, &hash)
        }

        /// The 32-byte MAC of `message`.
        func authenticationCode(_ message: some ContiguousBytes) -> [UInt8] {
            [UInt8](unsafeUninitializedCapacity: HMACSHA256.digestSize) { output, count in
                message.withUnsafeBytes { authenticate($0, into: output.baseAddress!) }  // capacity 32: never nil
                count = HMACSHA256.digestSize
            }
        }

        /// HKDF-SHA-256 with this key as the salt, empty info and `count` ≤ 32 output bytes (a single
        /// expand block).
        func deriveKey(inputKeyMaterial: some ContiguousBytes, count: Int) -> [UInt8] {
            precondition((1...HMACSHA256.digestSize).contains(count), "one HKDF-SHA-256 block gives 1 ... 32 bytes")
            return [UInt8](unsafeUninitializedCapacity: HMACSHA256.digestSize) { output, written in
                inputKeyMaterial.withUnsafeBytes { deriveKey(inputKeyMaterial: $0, into: output.baseAddress!) }  // capacity 32
                written = count
            }
        }

        /// Writes the 32 bytes of HKDF-SHA-256 (this key as the salt, empty info) to `output`.
        func deriveKey(inputKeyMaterial: UnsafeRawBufferPointer, into output: UnsafeMutablePointer<UInt8>) {
            authenticate(inputKeyMaterial, into: output)  // the pseudorandom key, expanded in place
            let expandKey = Key(UnsafeRawBufferPointer(start: output, count: HMACSHA256.digestSize))
            withUnsafeBytes(of: UInt8(1)) { expandKey.authenticate($0, into: output) }
        }
    }

    /// HKDF-SHA-256 with empty info and `count` ≤ 32 output bytes (a single expand block).
    static func deriveKey(inputKeyMaterial: some ContiguousBytes, salt: some ContiguousBytes, count: Int) -> [UInt8] {
        Key(salt).deriveKey(inputKeyMaterial: inputKeyMaterial, count: count)
    }
}
