import ThaliBeacons

/// Beacon streams (both profiles) through a receiver whose address book holds the sender and others.
///
/// Input: one byte picks the profile, the rest is the stream. Invariants: a stream of impossible length
/// is `malformed` and one of possible length never is; a match names a contact from the address book
/// and a beacon inside the stream, and its PSK identity is the one the profile derives.
enum BeaconStreamHarness {
    static let name = "beacon-stream"
    /// Fixed keys, so that committed seeds stay valid: the receiver, the contact that sends, and others.
    static let receiverKey = fixedKey(0x11)
    static let senderKey = fixedKey(0x22)
    static let otherKeys = [fixedKey(0x33), fixedKey(0x44), fixedKey(0x55)]
    /// The receiver's clock: the seeds expire an hour after it.
    static let now: UInt64 = 1_763_700_000_000

    struct Receivers: @unchecked Sendable {
        let byProfile: [BeaconProfile: BeaconReceiver]
    }

    static let receivers: Receivers = {
        var byProfile: [BeaconProfile: BeaconReceiver] = [:]
        for profile in BeaconProfile.allCases {
            // No replay cache: every input must be judged on its own, whatever came before.
            let receiver = BeaconReceiver(identity: receiverKey, profile: profile, limits: BeaconLimits(replayCacheCapacity: 0))
            try? receiver.addressBook.add(senderKey.publicKey)
            try? receiver.addressBook.add(contentsOf: otherKeys.map(\.publicKey))
            byProfile[profile] = receiver
        }
        return Receivers(byProfile: byProfile)
    }()

    static let harness = FuzzHarness(name: name, summary: "beacon streams, both profiles, against an address book", seeds: seeds) {
        (input: inout FuzzInput) throws(FuzzInvariantViolation) in
        let profile: BeaconProfile = input.bool() ? .cordova : .spec
        let stream = input.rest()
        guard let receiver = receivers.byProfile[profile] else { return }
        let beacons = (stream.count - profile.preambleLength) / BeaconWire.beaconLength
        let lengthIsPossible = stream.count >= profile.streamLength(beaconCount: 1)
            && (stream.count - profile.preambleLength) % BeaconWire.beaconLength == 0
            && beacons <= receiver.limits.maximumBeaconsPerAnnouncement
        let result = Result { () throws(BeaconRejection) in try receiver.receive(stream, now: now) }
        switch result {
        case .success(let match):
            try check(lengthIsPossible, name, "matched a stream of impossible length \(stream.count)")
            try check(receiver.addressBook.contains(match.sender), name, "matched a sender outside the address book")
            try check(match.beaconIndex >= 0 && match.beaconIndex < beacons, name, "beacon index \(match.beaconIndex) of \(beacons)")
            let start = profile.preambleLength + match.beaconIndex * BeaconWire.beaconLength
            let identity = profile.pskIdentity(
                preamble: stream[0..<profile.preambleLength], beacon: stream[start..<(start + BeaconWire.beaconLength)])
            try check(identity == match.pskIdentity, name, "PSK identity differs from the profile's derivation")
        case .failure(let rejection):
            try check((rejection.reason == .malformed) == !lengthIsPossible, name,
                      "\(rejection.reason.rawValue) for a stream of \(stream.count) bytes (length possible: \(lengthIsPossible))")
        }
    }

    /// Announcements for the receiver from the sender, among other receivers, in both profiles.
    static func seeds() -> [[UInt8]] {
        var seeds: [[UInt8]] = []
        for (index, profile) in BeaconProfile.allCases.enumerated() {
            let generator = BeaconGenerator(identity: senderKey, profile: profile)
            let receiverSets = [[receiverKey.publicKey], otherKeys.map(\.publicKey) + [receiverKey.publicKey], otherKeys.map(\.publicKey)]
            for receivers in receiverSets {
                guard let announcement = try? generator.makeAnnouncement(
                    for: receivers, expiration: now + 3_600_000, ephemeralKey: fixedKey(0x66 + UInt8(seeds.count)))
                else { continue }
                seeds.append([UInt8(index)] + announcement.stream)
            }
        }
        return seeds
    }
}

/// A valid secp256k1 key whose 32 bytes are all `byte` (any value from 1 to 0xFE is below the order).
func fixedKey(_ byte: UInt8) -> PrivateKey {
    // Force-unwrap is safe: 0x01…0xFE repeated is a valid scalar; this is never network input.
    try! PrivateKey(rawRepresentation: [UInt8](repeating: byte, count: 32))
}
