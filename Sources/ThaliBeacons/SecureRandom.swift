/// Bytes from the system CSPRNG (`getrandom` on Linux, through `SystemRandomNumberGenerator`).
enum SecureRandom {
    static func bytes(count: Int) -> [UInt8] {
        var generator = SystemRandomNumberGenerator()
        return (0..<count).map { _ in UInt8.random(in: .min ... .max, using: &generator) }
    }

    static func byte() -> UInt8 {
        var generator = SystemRandomNumberGenerator()
        return UInt8.random(in: .min ... .max, using: &generator)
    }
}
