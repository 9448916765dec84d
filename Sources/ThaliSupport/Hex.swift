/// Hexadecimal encoding and strict decoding of bytes: the suite's one hex codec (keys, beacon streams,
/// digests, addresses).
public enum Hex {
    /// Why text is not hex.
    public enum DecodingError: Error, Sendable, Hashable, CustomStringConvertible {
        /// `character`, at `position` (1-based, in characters), is not a hex digit.
        case notADigit(Character, position: Int)
        /// The text has this many digits, an odd number: the last byte is half there.
        case oddDigitCount(Int)

        /// In words, as a person fixing the input wants it.
        public var description: String {
            switch self {
            case .notADigit(let character, let position): "'\(character)' at position \(position) is not a hex digit"
            case .oddDigitCount(let count): "\(count) digits, an odd number"
            }
        }
    }

    private static let lowerDigits = Array("0123456789abcdef".utf8)
    private static let upperDigits = Array("0123456789ABCDEF".utf8)

    /// Encodes bytes as hex, lower case unless `uppercase`, with no separators.
    public static func encode(_ bytes: some Sequence<UInt8>, uppercase: Bool = false) -> String {
        let digits = uppercase ? upperDigits : lowerDigits
        var out: [UInt8] = []
        out.reserveCapacity(bytes.underestimatedCount * 2)
        for byte in bytes {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0x0f)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Decodes hex (either case, no separators; empty text is no bytes), or says what is wrong with it:
    /// the first character that is not a digit, else an odd count.
    public static func decoding(_ string: some StringProtocol) throws(DecodingError) -> [UInt8] {
        let utf8 = Array(string.utf8)
        var out = [UInt8]()
        out.reserveCapacity(utf8.count / 2)
        var high: UInt8?
        for unit in utf8 {
            guard let nibble = value(unit) else { throw firstNonDigit(in: string) }
            if let first = high {
                out.append(first << 4 | nibble)
                high = nil
            } else {
                high = nibble
            }
        }
        guard high == nil else { throw .oddDigitCount(utf8.count) }
        return out
    }

    /// Decodes hex (either case, no separators); `nil` for odd length or any other character.
    public static func decode(_ string: some StringProtocol) -> [UInt8]? {
        try? decoding(string)
    }

    /// The first character of `string` that is not an ASCII hex digit, counted in characters so the
    /// position matches what a person typed (only called when there is one).
    private static func firstNonDigit(in string: some StringProtocol) -> DecodingError {
        for (offset, character) in string.enumerated() where !(character.isASCII && character.isHexDigit) {
            return .notADigit(character, position: offset + 1)
        }
        return .oddDigitCount(string.utf8.count)
    }

    private static func value(_ digit: UInt8) -> UInt8? {
        switch digit {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): digit - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): digit - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): digit - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}
