/// The (origin, ephemeral key) pairs a receiver has accepted for scanning, each kept until its
/// announcement expires. Bounded: when full, expired entries are dropped first, then the one expiring soonest
/// (the presence spec allows purging for space). Not thread-safe; the receiver locks it.
struct ReplayCache {
    /// What one entry remembers: an ephemeral key, seen from one origin.
    struct Key: Hashable {
        var origin: String
        var ephemeralKey: [UInt8]
    }

    let capacity: Int
    private var expirations: [Key: UInt64] = [:]
    /// Entries dropped while still unexpired because the cache was full.
    private(set) var evictions = 0

    init(capacity: Int) { self.capacity = capacity }

    var count: Int { expirations.count }

    /// Records `key`; returns `false` if it was already recorded and has not expired at `now`.
    mutating func insert(_ key: Key, expiration: UInt64, now: UInt64) -> Bool {
        if let known = expirations[key], known >= now { return false }
        guard capacity > 0 else { return true }
        if expirations.count >= capacity {
            expirations = expirations.filter { $0.value >= now }
        }
        if expirations.count >= capacity, let soonest = expirations.min(by: { $0.value < $1.value }) {
            expirations.removeValue(forKey: soonest.key)
            evictions += 1
        }
        expirations[key] = expiration
        return true
    }
}
