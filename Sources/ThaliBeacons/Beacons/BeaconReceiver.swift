import ThaliMutants
import ThaliSupport

/// Reads announcements and finds the beacon addressed to us, if any.
///
/// Checks, in order: length (`malformed`), ephemeral key (`invalid-key`), expiration (`expired`,
/// `too-far-in-future`), replay of the ephemeral key from the same origin (`replayed`), then one ECDH (Sey) and a scan of
/// the beacons (`no-match` if none is ours from a known contact). Every check before the ECDH is
/// cheap, and a stream carries at most `BeaconLimits.maximumBeaconsPerAnnouncement` beacons, so the
/// cost of any input is bounded. Thread-safe.
public final class BeaconReceiver: Sendable {
    /// Counts of outcomes since creation, for logs and tests.
    public struct Statistics: Sendable, Hashable {
        /// Streams that matched.
        public var matches = 0
        /// Streams rejected, by reason.
        public var rejections: [BeaconRejection.Reason: Int] = [:]
        /// Replay-cache entries dropped before expiring because the cache was full.
        public var replayCacheEvictions = 0
        /// Ephemeral keys currently in the replay cache.
        public var replayCacheCount = 0
    }

    private struct State {
        var replayCache: ReplayCache
        var statistics = Statistics()
    }

    /// Our identity key (Ky).
    public let identity: PrivateKey
    /// The wire profile we read.
    public let profile: BeaconProfile
    /// The bounds in force.
    public let limits: BeaconLimits
    /// The contacts we accept announcements from.
    public let addressBook: AddressBook

    private let clock: BeaconClock
    private let state: Locked<State>

    /// A receiver for `identity`, with an empty address book.
    public init(
        identity: PrivateKey, profile: BeaconProfile = .spec, limits: BeaconLimits = BeaconLimits(),
        clock: BeaconClock = .system
    ) {
        self.identity = identity
        self.profile = profile
        self.limits = limits
        self.clock = clock
        self.addressBook = AddressBook(profile: profile, capacity: limits.addressBookCapacity)
        self.state = Locked(State(replayCache: ReplayCache(capacity: limits.replayCacheCapacity)))
    }

    /// Counts of outcomes so far.
    public var statistics: Statistics {
        state.withLock { state in
            var statistics = state.statistics
            statistics.replayCacheEvictions = state.replayCache.evictions
            statistics.replayCacheCount = state.replayCache.count
            return statistics
        }
    }

    /// Parses `stream`, fetched from `origin`, at the receiver's clock's current time.
    ///
    /// `origin` is where the stream came from (the SSDP `LOCATION` it was fetched at, a Bluetooth
    /// address): the replay cache is keyed by origin and ephemeral key, because nothing before the TLS
    /// handshake authenticates a location. Anyone can re-serve a peer's announcement; keyed by key alone,
    /// a copy fetched first would make the genuine announcement `replayed`. Keyed by origin, a copy only
    /// burns its own origin's entry, and the genuine announcement still matches where it really is.
    /// Callers with a single source may leave it empty.
    public func receive(_ stream: [UInt8], from origin: String = "") throws(BeaconRejection) -> BeaconMatch {
        try receive(stream, from: origin, now: clock.now())
    }

    /// Parses `stream`, fetched from `origin`, as if the time were `now` (milliseconds since the epoch).
    public func receive(_ stream: [UInt8], from origin: String = "", now: UInt64) throws(BeaconRejection) -> BeaconMatch {
        do throws(BeaconRejection) {
            let match = try scan(stream, origin: origin, now: now)
            state.withLock { $0.statistics.matches += 1 }
            return match
        } catch {
            state.withLock { $0.statistics.rejections[error.reason, default: 0] += 1 }
            throw error
        }
    }

    private func scan(_ stream: [UInt8], origin: String, now: UInt64) throws(BeaconRejection) -> BeaconMatch {
        let preambleLength = profile.preambleLength
        let beaconBytes = stream.count - preambleLength
        guard beaconBytes >= BeaconWire.beaconLength, beaconBytes % BeaconWire.beaconLength == 0 else {
            throw BeaconRejection(.malformed, "\(stream.count) bytes is not \(preambleLength) + 48·N with N ≥ 1 (\(profile) profile)")
        }
        let beaconCount = beaconBytes / BeaconWire.beaconLength
        guard beaconCount <= limits.maximumBeaconsPerAnnouncement else {
            throw BeaconRejection(.malformed, "\(beaconCount) beacons, more than the limit of \(limits.maximumBeaconsPerAnnouncement)")
        }

        let keyBytes = stream[0..<profile.ephemeralKeyLength]
        guard let ephemeralKey = profile.decodeEphemeralKey(keyBytes) else {
            throw BeaconRejection(.invalidKey, "the ephemeral key is not an uncompressed secp256k1 point in the \(profile) encoding")
        }

        let expirationBytes = stream[profile.ephemeralKeyLength..<preambleLength]
        let expiration = UInt64(bigEndianBytes: expirationBytes)
        guard expiration >= now else {
            throw BeaconRejection(.expired, "expired at \(expiration) ms, now is \(now) ms")
        }
        guard expiration - now <= BeaconWire.maximumFutureMilliseconds else {
            throw BeaconRejection(.tooFarInFuture, "expires at \(expiration) ms, more than 24 h after now (\(now) ms)")
        }

        let replayKey = ReplayCache.Key(origin: origin, ephemeralKey: ephemeralKey.uncompressed)
        let fresh = state.withLock { $0.replayCache.insert(replayKey, expiration: expiration, now: now) }
        guard fresh || Mutant.beaconNoReplayCache.isActive else {
            throw BeaconRejection(.replayed, "ephemeral key seen before from this origin in an announcement that has not expired")
        }

        let derivation = ExpirationDerivation(profile: profile, expiration: expirationBytes)
        let flagKey = profile.flagKey(sey: identity.sharedSecret(with: ephemeralKey), derivation: derivation)
        func authenticatedKeyId(_ index: Int) -> KeyId? {
            let start = preambleLength + index * BeaconWire.beaconLength
            return profile.openFlag(stream[start..<(start + BeaconWire.flagLength)], with: flagKey)
        }
        let keystream = flagKey.gcmKeystream()
        // spec: beacons before this index are known not to be an authenticated flag from a stranger.
        var checkedBefore = 0
        for index in 0..<beaconCount {
            let start = preambleLength + index * BeaconWire.beaconLength
            let flagEnd = start + BeaconWire.flagLength
            let keyId: KeyId
            let contact: AddressBook.Entry
            if let keystream {
                // spec: only a flag naming a contact can lead to a match, so the dictionary lookup of the
                // KeyId the flag would carry comes first and the GCM tag is verified for those alone.
                let candidate = KeyId(bytes: stream[start..<flagEnd], xoring: keystream)
                guard let known = addressBook.entry(for: candidate),
                      Mutant.beaconIgnoresFlagTag.isActive || authenticatedKeyId(index) == candidate else { continue }
                // The spec's scan ends at the first authenticated flag whose sender is not a contact (such a
                // flag is certainly ours). Flags skipped above could be one; only now does that matter.
                for earlier in checkedBefore..<index {
                    if let stranger = authenticatedKeyId(earlier), addressBook.entry(for: stranger) == nil,
                       !Mutant.beaconSkipsStrangerFlag.isActive {
                        throw BeaconRejection(.noMatch, "beacon \(earlier) is for us but its sender is not in the address book")
                    }
                }
                checkedBefore = index + 1
                (keyId, contact) = (candidate, known)
            } else {
                // cordova: a CBC decrypt with good padding proves nothing, so an unknown KeyId is skipped.
                guard let decrypted = authenticatedKeyId(index), let known = addressBook.entry(for: decrypted) else { continue }
                (keyId, contact) = (decrypted, known)
            }
            let sxy: [UInt8]
            if let cached = contact.sharedSecret {
                sxy = cached
            } else {
                sxy = identity.sharedSecret(with: contact.key)
                addressBook.cache(sharedSecret: sxy, for: keyId)
            }
            let end = start + BeaconWire.beaconLength
            let expected = profile.beaconHmac(sxy: sxy, derivation: derivation)
            guard constantTimeEqual(expected, stream[flagEnd..<end]) else { continue }
            let identity = profile.pskIdentity(preamble: stream[0..<preambleLength], beacon: stream[start..<end])
            return BeaconMatch(
                sender: contact.key, beaconIndex: index, pskIdentity: identity,
                psk: profile.psk(sxy: sxy, identity: identity), expiration: expiration)
        }
        throw BeaconRejection(.noMatch, "none of the \(beaconCount) beacons is for us from a known contact")
    }
}
