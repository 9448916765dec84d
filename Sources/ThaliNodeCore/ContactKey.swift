import Foundation

/// Contact public keys as the node stores them: SEC1-encoded secp256k1 points, accepted compressed (33
/// bytes) or uncompressed (65 bytes), as hex or base64, and stored in one canonical form — compressed, as
/// lowercase hex — so the same key always compares equal.
public enum ContactKey {
    /// Decodes `text` (hex, or standard/URL-safe base64) into SEC1 bytes and returns the compressed form
    /// as lowercase hex; throws ``NodeError/invalidPublicKey(_:reason:)`` for anything that cannot be such
    /// a key.
    public static func normalize(_ text: String) throws -> String {
        let trimmed = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard let bytes = decodeHex(trimmed) ?? decodeBase64(trimmed) else {
            throw NodeError.invalidPublicKey(text, reason: "neither hex nor base64")
        }
        switch (bytes.count, bytes.first) {
        case (33, 0x02?), (33, 0x03?):
            return hex(bytes)
        case (65, 0x04?):
            // Compressed form: the parity of y selects 02 (even) or 03 (odd), followed by x.
            return hex([bytes[64] & 1 == 0 ? 0x02 : 0x03] + bytes[1..<33])
        default:
            throw NodeError.invalidPublicKey(
                text, reason: "not a SEC1 public key (33 bytes starting 02/03, or 65 bytes starting 04); got \(bytes.count) bytes")
        }
    }

    static func hex(_ bytes: some Sequence<UInt8>) -> String {
        bytes.map { String(format: "%02x", $0) }.joined()
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
