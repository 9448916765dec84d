import ThaliMutants
import ThaliSupport

/// Why a generator refused to make an announcement.
public struct BeaconGenerationError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What was wrong with the request.
    public var detail: String

    /// Creates an error.
    public init(_ detail: String) { self.detail = detail }

    public var description: String { detail }
}

/// Makes announcements: one beacon per receiver, encrypted so that only that receiver learns who
/// sent it. Thread-safe; it caches each contact's ECDH secret with our identity (Sxy), which never
/// changes, so a warm generation costs one ECDH per receiver plus one ephemeral key.
public final class BeaconGenerator: Sendable {
    /// Our identity key (Kx).
    public let identity: PrivateKey
    /// The wire profile of every announcement.
    public let profile: BeaconProfile
    /// Bounds on receivers per announcement and on the Sxy cache.
    public let limits: BeaconLimits

    private let clock: BeaconClock
    private let entropy: BeaconEntropy
    private let ourKeyId: [UInt8]
    private let secrets: Locked<[PublicKey: [UInt8]]>

    /// A generator for `identity`. Production leaves `clock` and `entropy` at the system defaults;
    /// tests inject them to make output deterministic.
    public init(
        identity: PrivateKey, profile: BeaconProfile = .spec, limits: BeaconLimits = BeaconLimits(),
        clock: BeaconClock = .system, entropy: BeaconEntropy = .system
    ) {
        self.identity = identity
        self.profile = profile
        self.limits = limits
        self.clock = clock
        self.entropy = entropy
        self.ourKeyId = KeyId(of: identity.publicKey, profile: profile).bytes
        self.secrets = Locked([:])
    }

    /// Number of contacts whose Sxy is cached.
    public var cachedSecretCount: Int { secrets.withLock { $0.count } }

    /// An announcement for `receivers` (in that order; duplicates give identical beacons) that
    /// expires `validity` from now plus a random 0 ... 255 ms, with a fresh ephemeral key.
    /// `validity` must be 1 ms ... 24 h − 255 ms so that receivers accept it at once.
    public func makeAnnouncement(for receivers: [PublicKey], validity: Duration) throws(BeaconGenerationError) -> BeaconAnnouncement {
        let (seconds, attoseconds) = validity.components
        guard seconds >= 0, attoseconds >= 0,
              seconds <= Int64(BeaconWire.maximumValidityMilliseconds / 1000)
        else { throw BeaconGenerationError("validity \(validity) is outside 1 ms ... \(BeaconWire.maximumValidityMilliseconds) ms") }
        let milliseconds = UInt64(seconds) * 1000 + UInt64(attoseconds / 1_000_000_000_000_000)
        guard (1...BeaconWire.maximumValidityMilliseconds).contains(milliseconds) else {
            throw BeaconGenerationError("validity \(milliseconds) ms is outside 1 ... \(BeaconWire.maximumValidityMilliseconds) ms")
        }
        let ahead = Mutant.beaconExpirationBeyondADay.isActive ? 25 * 3_600_000 : milliseconds
        let (expiration, overflow) = clock.now().addingReportingOverflow(ahead + UInt64(entropy.fuzz()))
        guard !overflow else { throw BeaconGenerationError("the clock is too close to the end of UInt64 milliseconds") }
        return try makeAnnouncement(for: receivers, expiration: expiration, ephemeralKey: entropy.ephemeralKey())
    }

    /// The deterministic core: an announcement with exactly this expiration and ephemeral key.
    /// Conformance tests use it; applications use `makeAnnouncement(for:validity:)`, because an
    /// ephemeral key must never be reused.
    public func makeAnnouncement(
        for receivers: [PublicKey], expiration: UInt64, ephemeralKey: PrivateKey
    ) throws(BeaconGenerationError) -> BeaconAnnouncement {
        guard !receivers.isEmpty else { throw BeaconGenerationError("an announcement needs at least one receiver") }
        guard receivers.count <= limits.maximumBeaconsPerAnnouncement else {
            throw BeaconGenerationError("\(receivers.count) receivers, more than the limit of \(limits.maximumBeaconsPerAnnouncement)")
        }
        let expirationBytes = expiration.bigEndianBytes[...]
        var stream = profile.encodeEphemeralKey(ephemeralKey.publicKey)
        stream += expirationBytes
        let preambleLength = stream.count
        stream.reserveCapacity(profile.streamLength(beaconCount: receivers.count))

        let derivation = ExpirationDerivation(profile: profile, expiration: expirationBytes)
        let sealer = try GCMFlagSealer()
        var secretsOfReceivers: [[UInt8]] = []
        secretsOfReceivers.reserveCapacity(receivers.count)
        for receiver in receivers {
            let sey = ephemeralKey.sharedSecret(with: receiver)
            let sxy = sharedSecret(with: receiver)
            try profile.sealFlag(ourKeyId, sey: sey, derivation: derivation, using: sealer, into: &stream)
            profile.appendBeaconHmac(sxy: sxy, derivation: derivation, to: &stream)
            secretsOfReceivers.append(sxy)
        }

        let preamble = stream[0..<preambleLength]
        var beacons: [AdvertisedBeacon] = []
        beacons.reserveCapacity(receivers.count)
        for (index, receiver) in receivers.enumerated() {
            let start = preambleLength + index * BeaconWire.beaconLength
            let identity = profile.pskIdentity(preamble: preamble, beacon: stream[start..<(start + BeaconWire.beaconLength)])
            beacons.append(AdvertisedBeacon(
                receiver: receiver, pskIdentity: identity, key: .derived(profile, sxy: secretsOfReceivers[index], identity: identity)))
        }
        return BeaconAnnouncement(profile: profile, stream: stream, expiration: expiration, beacons: beacons)
    }

    /// Sxy with `contact`, from the cache or computed and cached.
    private func sharedSecret(with contact: PublicKey) -> [UInt8] {
        if let cached = secrets.withLock({ $0[contact] }) { return cached }
        let secret = identity.sharedSecret(with: contact)
        let capacity = limits.generatorSecretCacheCapacity
        secrets.withLock { cache in
            guard capacity > 0 else { return }
            if cache.count >= capacity, cache[contact] == nil { cache.remove(at: cache.startIndex) }
            cache[contact] = secret
        }
        return secret
    }
}
