import CSecp256k1
import Foundation
import ThaliSupport

/// A point on secp256k1: a contact's identity key or an ephemeral beacon key.
///
/// Parsing is strict: only SEC1 compressed (`02`/`03` ‖ X, 33 bytes) or uncompressed (`04` ‖ X ‖ Y,
/// 65 bytes) encodings of points on the curve are accepted (no hybrid `06`/`07` forms). Two values are
/// equal when they are the same point, whatever encoding they were imported from.
public struct PublicKey: Hashable, Sendable, CustomStringConvertible {
    /// The parsed point, kept so that ECDH does not parse again.
    let point: secp256k1_pubkey
    /// The 65-byte uncompressed SEC1 encoding `04 ‖ X ‖ Y`.
    public let uncompressed: [UInt8]

    /// The DER prefix of a SubjectPublicKeyInfo (RFC 5480) for an uncompressed secp256k1 point:
    /// SEQUENCE { SEQUENCE { id-ecPublicKey, secp256k1 }, BIT STRING (0 unused bits) }.
    static let subjectPublicKeyInfoPrefix: [UInt8] = [
        0x30, 0x56, 0x30, 0x10, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x05, 0x2b,
        0x81, 0x04, 0x00, 0x0a, 0x03, 0x42, 0x00,
    ]

    /// Imports a SEC1 point: 33 bytes compressed or 65 bytes uncompressed.
    public init(sec1 bytes: some Collection<UInt8>) throws(KeyError) {
        let bytes = Array(bytes)
        switch (bytes.count, bytes.first) {
        case (33, 0x02?), (33, 0x03?), (65, 0x04?):
            break
        default:
            throw KeyError(.invalidEncoding, "expected a 33-byte compressed (02/03) or 65-byte uncompressed (04) SEC1 point, got \(bytes.count) bytes")
        }
        let context = Secp256k1Context.shared
        guard let point = bytes.withUnsafeBufferPointer({ context.parsePublicKey($0) }) else {
            throw KeyError(.notOnCurve, "the point is not on secp256k1")
        }
        self.point = point
        self.uncompressed = bytes.count == 65 ? bytes : context.serialize(point, compressed: false)
    }

    /// Imports a SEC1 point written in hex (compressed or uncompressed).
    public init(hex: some StringProtocol) throws(KeyError) {
        guard let bytes = Hex.decode(hex) else {
            throw KeyError(.invalidEncoding, "not a hex string")
        }
        try self.init(sec1: bytes)
    }

    /// Imports a SEC1 point written in standard base64 (compressed or uncompressed).
    public init(base64: String) throws(KeyError) {
        guard let data = Data(base64Encoded: base64) else {
            throw KeyError(.invalidEncoding, "not a base64 string")
        }
        try self.init(sec1: data)
    }

    /// Imports the 88-byte DER SubjectPublicKeyInfo of an uncompressed secp256k1 point.
    public init(subjectPublicKeyInfo bytes: some Collection<UInt8>) throws(KeyError) {
        let bytes = Array(bytes)
        guard bytes.count == 88, bytes.starts(with: Self.subjectPublicKeyInfoPrefix) else {
            throw KeyError(.invalidEncoding, "not the 88-byte SubjectPublicKeyInfo of an uncompressed secp256k1 point")
        }
        try self.init(sec1: bytes[23...])
    }

    init(point: secp256k1_pubkey) {
        self.point = point
        self.uncompressed = Secp256k1Context.shared.serialize(point, compressed: false)
    }

    /// The 33-byte compressed SEC1 encoding `02|03 ‖ X`.
    public var compressed: [UInt8] { Secp256k1Context.shared.serialize(point, compressed: true) }

    /// The 88-byte DER SubjectPublicKeyInfo (RFC 5480) of the uncompressed point.
    public var subjectPublicKeyInfo: [UInt8] { Self.subjectPublicKeyInfoPrefix + uncompressed }

    /// Hex of the SEC1 encoding (uncompressed unless `compressed`).
    public func hexString(compressed: Bool = false) -> String {
        Hex.encode(compressed ? self.compressed : uncompressed)
    }

    /// Standard padded base64 of the SEC1 encoding (uncompressed unless `compressed`).
    public func base64String(compressed: Bool = false) -> String {
        Data(compressed ? self.compressed : uncompressed).base64EncodedString()
    }

    public var description: String { hexString(compressed: true) }

    public static func == (lhs: PublicKey, rhs: PublicKey) -> Bool { lhs.uncompressed == rhs.uncompressed }

    // The 65 bytes at once: hashing the array feeds them to the hasher one at a time, which cost a
    // generator's Sxy cache lookup as much as an HMAC.
    public func hash(into hasher: inout Hasher) { uncompressed.withUnsafeBytes { hasher.combine(bytes: $0) } }
}
