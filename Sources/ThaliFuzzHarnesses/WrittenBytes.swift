#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// What the pair harnesses write and how they check it, done in bulk. Under `-sanitize=fuzzer` every
/// comparison in this module's own code calls into the fuzzer's coverage tracing, so a byte-by-byte loop
/// (building test content, or an `==` on arrays, which Swift specialises into this module) costs one such
/// call per byte: on the multiplexer pair harness that was over half of all the time. Copies from a table
/// and `memcmp` run in uninstrumented code.
enum WrittenBytes {
    /// A prime period, so that the shifts of different streams and directions never coincide.
    static let period = 65_537

    /// Pseudo-random bytes (a 64-bit mix of the position), computed once.
    static let table: [UInt8] = (0..<period).map { offset in
        var x = UInt64(offset) &* 0x9E37_79B9_7F4A_7C15
        x ^= x >> 29
        x &*= 0xBF58_476D_1CE4_E5B9
        x ^= x >> 32
        return UInt8(truncatingIfNeeded: x)
    }

    /// `count` bytes of what `stream` (a stream and direction, numbered from 0) writes from `offset` on:
    /// distinct per stream and position, so that bytes delivered to the wrong stream, twice, or out of
    /// order are seen (unless displaced by an exact multiple of the period).
    static func content(stream: Int, offset: Int, count: Int) -> [UInt8] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(count)
        var position = (offset % period + (stream &* 7919) % period) % period
        var left = count
        while left > 0 {
            let take = min(left, period - position)
            bytes.append(contentsOf: table[position..<(position + take)])
            left -= take
            position = 0
        }
        return bytes
    }

    /// Whether `a` and `b` hold the same bytes.
    static func same(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        a.count == b.count && isPrefix(a, of: b)
    }

    /// Whether `prefix` is where `bytes` starts.
    static func isPrefix(_ prefix: [UInt8], of bytes: [UInt8]) -> Bool {
        guard prefix.count <= bytes.count else { return false }
        guard !prefix.isEmpty else { return true }
        return prefix.withUnsafeBytes { p in
            bytes.withUnsafeBytes { b in
                guard let p = p.baseAddress, let b = b.baseAddress else { return false }
                return memcmp(p, b, prefix.count) == 0
            }
        }
    }
}
