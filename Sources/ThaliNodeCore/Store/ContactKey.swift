import Foundation
import ThaliBeacons
import ThaliSupport

/// Contact public keys as the node stores them: secp256k1 points (validated by ThaliBeacons' strict SEC1
/// parser: on the curve, compressed or uncompressed), accepted as hex or base64 (standard or URL-safe),
/// and stored in one canonical form — compressed, as lowercase hex — so one key always compares equal.
public enum ContactKey {
    /// Parses `text` (hex, with or without `0x`, or base64) as a secp256k1 public key; throws
    /// ``NodeError/invalidPublicKey(_:reason:)`` for anything that is not one, saying which encodings
    /// were tried and why each failed.
    public static func parse(_ text: String) throws -> PublicKey {
        var trimmed = text.trimmingCharacters(in: .whitespacesAndNewlines)
        let prefixed = trimmed.hasPrefix("0x") || trimmed.hasPrefix("0X")
        if prefixed { trimmed.removeFirst(2) }
        var failures: [String] = []
        /// The key in `bytes`, or nil with the reason noted under `encoding`.
        func key(_ bytes: [UInt8], as encoding: String) -> PublicKey? {
            do {
                return try PublicKey(sec1: bytes)
            } catch {
                failures.append("as \(encoding), \(bytes.count) bytes: \(error.detail)")
                return nil
            }
        }
        do throws(Hex.DecodingError) {
            let bytes = try Hex.decoding(trimmed)
            if bytes.isEmpty {
                failures.append("as hex: empty")
            } else if let key = key(bytes, as: "hex") {
                return key
            }
        } catch {
            failures.append("as hex: \(error)")
        }
        // A 0x prefix says hex; base64 is not tried then.
        if !prefixed {
            if let bytes = decodeBase64(trimmed) {
                if let key = key(bytes, as: "base64") { return key }
            } else {
                failures.append("as base64: not base64")
            }
        }
        throw NodeError.invalidPublicKey(text, reason: failures.joined(separator: "; "))
    }

    /// The canonical stored form of `text`: the compressed SEC1 point as lowercase hex.
    public static func normalize(_ text: String) throws -> String {
        try parse(text).hexString(compressed: true)
    }

    /// Hex digits as bytes; nil for empty text or anything that is not hex.
    static func decodeHex(_ text: String) -> [UInt8]? { text.isEmpty ? nil : Hex.decode(text) }

    static func decodeBase64(_ text: String) -> [UInt8]? {
        var standard = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while standard.count % 4 != 0 { standard.append("=") }
        return Data(base64Encoded: standard).map(Array.init)
    }
}

extension Contact {
    /// The contact's public key as ThaliBeacons' `PublicKey` (for the address book and PSK derivation).
    public func identityKey() throws -> PublicKey { try ContactKey.parse(publicKey) }
}

/// Rules for contact names: what the user types to address a contact.
public enum ContactNames {
    /// The longest contact name, in UTF-8 bytes.
    public static let maxBytes = 64

    /// Throws ``NodeError/invalidContactName(_:reason:)`` unless `name` is 1…64 bytes of printable text
    /// without leading or trailing spaces.
    public static func validate(_ name: String) throws {
        if name.isEmpty { throw NodeError.invalidContactName(name, reason: "empty") }
        if name.utf8.count > maxBytes { throw NodeError.invalidContactName(name, reason: "longer than \(maxBytes) bytes") }
        if name.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) {
            throw NodeError.invalidContactName(name, reason: "contains control characters")
        }
        if FileNames.hasBidirectionalControl(name) {
            throw NodeError.invalidContactName(name, reason: "contains a right-to-left or other direction control (U+202A-202E, U+2066-2069, U+200E, U+200F, U+061C), which can make it show as another name")
        }
        if name != name.trimmingCharacters(in: .whitespaces) {
            throw NodeError.invalidContactName(name, reason: "leading or trailing spaces")
        }
    }
}
