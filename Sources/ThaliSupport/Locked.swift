import Foundation

/// A mutex around a value; the only way to reach the value is inside `withLock`. Sendable when the value
/// is: the lock guards access, not what a non-Sendable value shares with the code that made it.
public final class Locked<Value> {
    private let lock = NSLock()
    private var value: Value

    /// A lock around `value`.
    public init(_ value: Value) { self.value = value }

    /// Runs `body` on the value with the lock held and returns what it returns.
    public func withLock<Result>(_ body: (inout Value) throws -> Result) rethrows -> Result {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}

extension Locked: @unchecked Sendable where Value: Sendable {}
