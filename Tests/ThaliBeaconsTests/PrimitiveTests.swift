import Crypto
import Foundation
import Testing
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
                let ours = Array(HMACSHA256.authenticationCode(key: key, message: message))
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

    @Test func base64MatchesFoundationForEveryLengthAndSplit() {
        var random = SplitMix64(state: 0x6236_3421)
        for length in 0...100 {
            let bytes = (0..<length).map { _ in UInt8.random(in: 0...255, using: &random) }
            let expected = Data(bytes).base64EncodedString()
            let urlSafe = expected.replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
                .replacingOccurrences(of: "=", with: "")
            for split in Set([0, length / 3, length / 2, length]) {
                #expect(Base64.encode(bytes[..<split], bytes[split...]) == expected, "length \(length) split \(split)")
                #expect(Base64.encode(bytes[..<split], bytes[split...], urlSafe: true) == urlSafe)
            }
        }
    }

    @Test func constantTimeComparison() {
        #expect(constantTimeEqual([1, 2, 3], [1, 2, 3]))
        #expect(!constantTimeEqual([1, 2, 3], [1, 2, 4]))
        #expect(!constantTimeEqual([1, 2, 3], [1, 2]))
        #expect(constantTimeEqual([UInt8](), [UInt8]()))
    }
}
