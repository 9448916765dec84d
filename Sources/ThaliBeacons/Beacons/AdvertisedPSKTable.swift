import ThaliSupport

/// The PSK a sender's TLS server accepts for one identity.
public struct AdvertisedPSK: Sendable, Hashable {
    /// The contact the beacon was addressed to; the peer that presents the identity is this contact.
    public let contact: PublicKey
    let key: PSKSource
    /// When the announcement that carries the beacon expires (milliseconds since the epoch).
    public let expiration: UInt64

    /// The pre-shared key, derived when asked for (once per handshake that presents the identity).
    public var psk: [UInt8] { key.psk }
}

/// The sender's map from PSK identity to (contact, PSK) for the beacons it currently advertises.
/// Entries expire with their announcement. Thread-safe (the TLS server calls `lookup` from its PSK
/// callback) and bounded: when full, expired entries go first, then those that expire soonest.
public final class AdvertisedPSKTable: Sendable {
    private struct State {
        var entries: [String: AdvertisedPSK] = [:]
        var evictions = 0
    }

    /// Most identities held.
    public let capacity: Int
    private let clock: BeaconClock
    private let state = Locked(State())

    /// An empty table holding at most `capacity` identities.
    public init(capacity: Int = BeaconLimits().pskTableCapacity, clock: BeaconClock = .system) {
        self.capacity = capacity
        self.clock = clock
    }

    /// Adds every beacon of `announcement` (identical identities, from a receiver listed twice,
    /// collapse into one). If the announcement alone has more beacons than `capacity`, only the
    /// first `capacity` are kept.
    public func register(_ announcement: BeaconAnnouncement) {
        let now = clock.now()
        let capacity = capacity
        state.withLock { state in
            state.entries = state.entries.filter { $0.value.expiration >= now }
            guard announcement.expiration >= now else { return }
            var fresh: [String: AdvertisedPSK] = [:]
            for beacon in announcement.beacons where fresh.count < capacity {
                fresh[beacon.pskIdentity] = AdvertisedPSK(
                    contact: beacon.receiver, key: beacon.key, expiration: announcement.expiration)
            }
            for identity in fresh.keys { state.entries.removeValue(forKey: identity) }
            let excess = state.entries.count + fresh.count - capacity
            if excess > 0 {
                let soonest = state.entries.sorted { $0.value.expiration < $1.value.expiration }.prefix(excess)
                for (identity, _) in soonest { state.entries.removeValue(forKey: identity) }
                state.evictions += soonest.count
            }
            state.entries.merge(fresh) { _, new in new }
        }
    }

    /// The contact and PSK for `identity`, or `nil` if unknown or expired.
    public func lookup(identity: String) -> AdvertisedPSK? {
        let now = clock.now()
        return state.withLock { state in
            guard let entry = state.entries[identity] else { return nil }
            guard entry.expiration >= now else {
                state.entries.removeValue(forKey: identity)
                return nil
            }
            return entry
        }
    }

    /// Number of identities held (expired ones may still count until the next `register`).
    public var count: Int { state.withLock { $0.entries.count } }

    /// Identities dropped before expiring because the table was full.
    public var evictions: Int { state.withLock { $0.evictions } }

    /// Forgets every identity.
    public func removeAll() { state.withLock { $0.entries.removeAll() } }
}
