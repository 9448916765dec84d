/// Bytes from the system CSPRNG (`getrandom` on Linux, through `SystemRandomNumberGenerator`).
enum SecureRandom {
    /// `count` random bytes, drawn eight at a time.
    static func bytes(count: Int) -> [UInt8] {
        var generator = SystemRandomNumberGenerator()
        var output = [UInt8]()
        output.reserveCapacity(count + 7)
        while output.count < count {
            let word = generator.next()
            for shift in stride(from: 0, to: 64, by: 8) { output.append(UInt8(truncatingIfNeeded: word >> UInt64(shift))) }
        }
        output.removeLast(output.count - count)
        return output
    }

    static func byte() -> UInt8 {
        var generator = SystemRandomNumberGenerator()
        return UInt8.random(in: .min ... .max, using: &generator)
    }
}
