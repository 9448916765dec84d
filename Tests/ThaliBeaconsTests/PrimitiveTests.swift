import Crypto
import Foundation
import Testing
import ThaliSupport
import ThaliTestSupport
@testable import ThaliBeacons

/// The module's own HMAC/HKDF helper against swift-crypto's `HMAC` and `HKDF`, and RFC test vectors.
@Suite struct PrimitiveTests {
    @Test func hmacMatchesSwiftCryptoForAllKeyLengths() {
        var random = SplitMix64(state: 0x4d41_4321)
        for keyLength in [0, 1, 8, 31, 32, 63, 64, 65, 100, 192, 300] {
            for messageLength in [0, 1, 8, 55, 56, 64, 65, 200] {
                let key = (0..<keyLength).map { _ in UInt8.random(in: 0...255, using: &random) }
                let message = (0..<messageLength).map { _ in UInt8.random(in: 0...255, using: &random) }
                let ours = HMACSHA256.Key(key).authenticationCode(message)
                let theirs = Array(HMAC<SHA256>.authenticationCode(for: message, using: SymmetricKey(data: key)))
                #expect(ours == theirs, "key \(keyLength) message \(messageLength)")
            }
        }
    }

    @Test func hkdfMatchesSwiftCryptoAndRFC5869() {
        var random = SplitMix64(state: 0x484b_4446)
        for count in [1, 16, 32] {
            for saltLength in [0, 8, 32, 192] {
                let ikm = (0..<32).map { _ in UInt8.random(in: 0...255, using: &random) }
                let salt = (0..<saltLength).map { _ in UInt8.random(in: 0...255, using: &random) }
                let ours = HMACSHA256.deriveKey(inputKeyMaterial: ikm, salt: salt, count: count)
                let theirs = HKDF<SHA256>.deriveKey(
                    inputKeyMaterial: SymmetricKey(data: ikm), salt: salt, info: [UInt8](), outputByteCount: count
                ).withUnsafeBytes { Array($0) }
                #expect(ours == theirs)
            }
        }
        // RFC 5869 test case 3 (empty salt and info), first 32 of its 42 bytes.
        let okm = HMACSHA256.deriveKey(inputKeyMaterial: [UInt8](repeating: 0x0b, count: 22), salt: [UInt8](), count: 32)
        #expect(Hex.encode(okm) == "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d")
    }

    /// A key's inner and outer states are copied for each MAC, never consumed: one key, many messages.
    @Test func oneHMACKeyServesManyMessages() {
        var random = SplitMix64(state: 0x4b45_5953)
        for keyLength in [0, 8, 32, 64, 65, 192] {
            let key = (0..<keyLength).map { _ in UInt8.random(in: 0...255, using: &random) }
            let keyed = HMACSHA256.Key(key)
            for messageLength in [0, 1, 32, 64, 200, 32, 0] {
                let message = (0..<messageLength).map { _ in UInt8.random(in: 0...255, using: &random) }
                let theirs = Array(HMAC<SHA256>.authenticationCode(for: message, using: SymmetricKey(data: key)))
                #expect(keyed.authenticationCode(message) == theirs, "key \(keyLength) message \(messageLength)")
                let ikm = (0..<32).map { _ in UInt8.random(in: 0...255, using: &random) }
                let derived = HKDF<SHA256>.deriveKey(inputKeyMaterial: SymmetricKey(data: ikm), salt: key, info: [UInt8](),
                                                     outputByteCount: 32).withUnsafeBytes { Array($0) }
                #expect(keyed.deriveKey(inputKeyMaterial: ikm, count: 32) == derived)
            }
        }
    }

    /// The expiration keyed once (`spec`'s salt) derives what the profile's HKDF order does, in both profiles.
    @Test func expirationDerivationMatchesTheProfilesHKDF() {
        var random = SplitMix64(state: 0x4558_5049)
        for profile in [BeaconProfile.spec, .cordova] {
            let expiration = UInt64.random(in: 0...UInt64.max, using: &random).bigEndianBytes[...]
            let derivation = ExpirationDerivation(profile: profile, expiration: expiration)
            for count in [16, 32] {
                for _ in 0..<8 {
                    let secret = (0..<32).map { _ in UInt8.random(in: 0...255, using: &random) }
                    #expect(derivation.derive(secret: secret, count: count) == profile.derive(secret: secret, other: expiration, count: count))
                }
            }
        }
    }

    /// OpenSSL's GCM, one context re-keyed per flag, seals what swift-crypto's does under the flag key the
    /// receiver derives, and the receiver's path opens it; a flag changed in any byte does not open.
    @Test func gcmFlagSealerMatchesSwiftCryptoAndOpens() throws {
        var random = SplitMix64(state: 0x4743_4d53)
        let sealer = try GCMFlagSealer()
        for _ in 0..<200 {
            let expiration = UInt64.random(in: 0...UInt64.max, using: &random).bigEndianBytes[...]
            let derivation = ExpirationDerivation(profile: .spec, expiration: expiration)
            let sey = (0..<32).map { _ in UInt8.random(in: 0...255, using: &random) }
            let keyId = (0..<16).map { _ in UInt8.random(in: 0...255, using: &random) }
            var flag: [UInt8] = [0xAA]
            try BeaconProfile.spec.sealFlag(keyId, sey: sey, derivation: derivation, using: sealer, into: &flag)
            #expect(flag.first == 0xAA && flag.count == 33, "appended after what the stream held")
            let material = derivation.derive(secret: sey, count: 32)
            let box = try AES.GCM.seal(keyId, using: SymmetricKey(data: material[16..<32]), nonce: AES.GCM.Nonce(data: material[0..<12]))
            #expect(Array(flag.dropFirst()) == Array(box.ciphertext) + Array(box.tag))
            let flagKey = BeaconProfile.spec.flagKey(sey: sey, derivation: derivation)
            #expect(BeaconProfile.spec.openFlag(flag.dropFirst(), with: flagKey)?.bytes == keyId)
            var damaged = flag
            damaged[1 + Int.random(in: 0..<32, using: &random)] ^= 0x01
            #expect(BeaconProfile.spec.openFlag(damaged.dropFirst(), with: flagKey) == nil)
        }
    }

    /// The beacon HMAC appended from the stack is the RFC construction: HMAC(HKDF(Sxy, expiration), expiration)[0..<16].
    @Test func beaconHmacIsHMACOfTheExpirationUnderHKxy() {
        var random = SplitMix64(state: 0x484d_4143)
        for profile in [BeaconProfile.spec, .cordova] {
            let expiration = UInt64.random(in: 0...UInt64.max, using: &random).bigEndianBytes[...]
            let sxy = (0..<32).map { _ in UInt8.random(in: 0...255, using: &random) }
            let hkxy = profile.derive(secret: sxy, other: expiration, count: 32)
            let expected = Array(HMAC<SHA256>.authenticationCode(for: Array(expiration), using: SymmetricKey(data: hkxy)).prefix(16))
            var stream: [UInt8] = [1, 2]
            profile.appendBeaconHmac(sxy: sxy, derivation: ExpirationDerivation(profile: profile, expiration: expiration), to: &stream)
            #expect(stream == [1, 2] + expected)
        }
    }

    @Test func constantTimeComparison() {
        #expect(constantTimeEqual([1, 2, 3], [1, 2, 3]))
        #expect(!constantTimeEqual([1, 2, 3], [1, 2, 4]))
        #expect(!constantTimeEqual([1, 2, 3], [1, 2]))
        #expect(constantTimeEqual([UInt8](), [UInt8]()))
    }
}
