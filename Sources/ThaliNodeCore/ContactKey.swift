import Foundation
import ThaliBeacons

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
        switch hexDiagnosis(trimmed) {
        case .success(let bytes):
            do {
                return try PublicKey(sec1: bytes)
            } catch {
                failures.append("as hex, \(bytes.count) bytes: \(error.detail)")
            }
        case .failure(let reason):
            failures.append("as hex: \(reason)")
        }
        // A 0x prefix says hex; base64 is not tried then.
        if !prefixed {
            if let bytes = decodeBase64(trimmed) {
                do {
                    return try PublicKey(sec1: bytes)
                } catch {
                    failures.append("as base64, \(bytes.count) bytes: \(error.detail)")
                }
            } else {
                failures.append("as base64: not base64")
            }
        }
        throw NodeError.invalidPublicKey(text, reason: failures.joined(separator: "; "))
    }

    private struct HexProblem: Error, CustomStringConvertible {
        let description: String
    }

    /// Decodes hex digits, or says what is wrong with them (the first non-digit, or an odd count).
    private static func hexDiagnosis(_ text: String) -> Result<[UInt8], HexProblem> {
        if text.isEmpty { return .failure(HexProblem(description: "empty")) }
        for (offset, character) in text.enumerated() where !character.isHexDigit {
            return .failure(HexProblem(description: "'\(character)' at position \(offset + 1) is not a hex digit"))
        }
        guard let bytes = decodeHex(text) else {
            return .failure(HexProblem(description: "\(text.count) digits, an odd number"))
        }
        return .success(bytes)
    }

    /// The canonical stored form of `text`: the compressed SEC1 point as lowercase hex.
    public static func normalize(_ text: String) throws -> String {
        try parse(text).hexString(compressed: true)
    }

    static func decodeHex(_ text: String) -> [UInt8]? {
        let digits = Array(text.utf8)
        guard !digits.isEmpty, digits.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(digits.count / 2)
        var index = 0
        while index < digits.count {
            guard let high = hexValue(digits[index]), let low = hexValue(digits[index + 1]) else { return nil }
            bytes.append(high << 4 | low)
            index += 2
        }
        return bytes
    }

    private static func hexValue(_ digit: UInt8) -> UInt8? {
        switch digit {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): digit - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): digit - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): digit - UInt8(ascii: "A") + 10
        default: nil
        }
    }

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
        if name != name.trimmingCharacters(in: .whitespaces) {
            throw NodeError.invalidContactName(name, reason: "leading or trailing spaces")
        }
    }
}
