/// RFC 4648 base64 encoding into a `String` in one pass (PSK identities are made for every beacon).
public enum Base64 {
    private static let standard = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
    private static let urlSafe = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    /// Encodes the concatenation of `parts`: §4 alphabet with `=` padding, or the §5 URL-safe
    /// alphabet without padding.
    public static func encode(_ parts: ArraySlice<UInt8>..., urlSafe useURLSafe: Bool = false) -> String {
        let total = parts.reduce(0) { $0 + $1.count }
        let alphabet = useURLSafe ? urlSafe : standard
        let padded = (total + 2) / 3 * 4
        let unpaddedTail = total % 3 == 0 ? 0 : 3 - total % 3
        let length = useURLSafe ? padded - unpaddedTail : padded
        return String(unsafeUninitializedCapacity: length) { output in
            var out = 0
            var group: UInt32 = 0
            var filled = 0
            for part in parts {
                for byte in part {
                    group = group << 8 | UInt32(byte)
                    filled += 1
                    if filled == 3 {
                        output[out] = alphabet[Int(group >> 18 & 63)]
                        output[out + 1] = alphabet[Int(group >> 12 & 63)]
                        output[out + 2] = alphabet[Int(group >> 6 & 63)]
                        output[out + 3] = alphabet[Int(group & 63)]
                        out += 4
                        group = 0
                        filled = 0
                    }
                }
            }
            if filled > 0 {
                group <<= UInt32(8 * (3 - filled))
                output[out] = alphabet[Int(group >> 18 & 63)]
                output[out + 1] = alphabet[Int(group >> 12 & 63)]
                out += 2
                if filled == 2 {
                    output[out] = alphabet[Int(group >> 6 & 63)]
                    out += 1
                }
                if !useURLSafe {
                    while out < length {
                        output[out] = UInt8(ascii: "=")
                        out += 1
                    }
                }
            }
            return out
        }
    }
}
