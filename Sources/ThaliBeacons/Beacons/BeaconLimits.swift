/// Bounds on every collection the beacon layer keeps or accepts. Each is configurable; the defaults
/// suit a phone or a small node with a few thousand contacts.
public struct BeaconLimits: Sendable, Hashable {
    /// Most beacons one announcement may carry, generated or accepted. A longer stream is rejected
    /// as `malformed` before any ECDH, bounding the work a stranger can cause per announcement.
    /// Default 64 (upstream notifies at most 15 peers; the benchmarks use 20).
    public var maximumBeaconsPerAnnouncement: Int = 64
    /// Most contacts an `AddressBook` holds. Default 16,384.
    public var addressBookCapacity: Int = 16_384
    /// Most ephemeral keys a receiver remembers to reject replays. When full, expired entries go
    /// first, then the entry that expires soonest. 0 turns replay protection off. Default 4,096.
    public var replayCacheCapacity: Int = 4_096
    /// Most PSK identities an `AdvertisedPSKTable` holds. When full, expired entries go first, then
    /// those that expire soonest. Default 1,024.
    public var pskTableCapacity: Int = 1_024
    /// Most contacts whose ECDH secret (Sxy) a `BeaconGenerator` caches. When full, an arbitrary
    /// entry is dropped (it is only a cache); 0 turns the cache off. Default 16,384.
    public var generatorSecretCacheCapacity: Int = 16_384

    /// The defaults documented on each property.
    public init() {}

    /// Limits with the given values; omitted ones keep their defaults.
    public init(
        maximumBeaconsPerAnnouncement: Int = 64, addressBookCapacity: Int = 16_384,
        replayCacheCapacity: Int = 4_096, pskTableCapacity: Int = 1_024,
        generatorSecretCacheCapacity: Int = 16_384
    ) {
        self.maximumBeaconsPerAnnouncement = maximumBeaconsPerAnnouncement
        self.addressBookCapacity = addressBookCapacity
        self.replayCacheCapacity = replayCacheCapacity
        self.pskTableCapacity = pskTableCapacity
        self.generatorSecretCacheCapacity = generatorSecretCacheCapacity
    }
}
