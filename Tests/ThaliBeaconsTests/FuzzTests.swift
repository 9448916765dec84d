import Testing
import ThaliBeacons
// SplitMix64: a deterministic generator, so that a failing fuzz input can be reproduced.
import ThaliTestSupport

/// Thousands of random and mutated streams: every one ends in a match or a typed rejection whose
/// reason fits the input, never a crash or a hang.
@Suite struct FuzzTests {
    let now: UInt64 = 1_763_700_000_000

    @Test(arguments: [BeaconProfile.spec, .cordova])
    func randomAndMutatedStreams(_ profile: BeaconProfile) throws {
        var random = SplitMix64(state: profile == .spec ? 0x5eed_0001 : 0x5eed_0002)
        let sender = PrivateKey()
        let me = PrivateKey()
        let others = (0..<3).map { _ in PrivateKey().publicKey }
        let ourIndex = 2
        let valid = try BeaconGenerator(identity: sender, profile: profile).makeAnnouncement(
            for: [others[0], others[1], me.publicKey, others[2]], expiration: now + 30_000, ephemeralKey: PrivateKey())
        // Replay cache off so that every mutation of the same announcement is scanned.
        let receiver = BeaconReceiver(identity: me, profile: profile, limits: BeaconLimits(replayCacheCapacity: 0))
        try receiver.addressBook.add(sender.publicKey)
        try receiver.addressBook.add(contentsOf: others)
        #expect(try receiver.receive(valid.stream, now: now).beaconIndex == ourIndex)

        func lengthIsValid(_ count: Int) -> Bool {
            count >= profile.streamLength(beaconCount: 1) && (count - profile.preambleLength) % 48 == 0
                && (count - profile.preambleLength) / 48 <= receiver.limits.maximumBeaconsPerAnnouncement
        }

        var outcomes: [String: Int] = [:]
        for round in 0..<3000 {
            var stream = valid.stream
            let mutation = round % 6
            switch mutation {
            case 0:  // flip 1...4 random bytes
                for _ in 0..<Int.random(in: 1...4, using: &random) {
                    stream[Int.random(in: 0..<stream.count, using: &random)] ^= UInt8.random(in: 1...255, using: &random)
                }
            case 1:  // truncate
                stream.removeLast(Int.random(in: 1...stream.count, using: &random))
            case 2:  // extend with random bytes
                stream += (0..<Int.random(in: 1...200, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
            case 3:  // entirely random bytes of a random length
                stream = (0..<Int.random(in: 0...1200, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
            case 4:  // random bytes of a valid length behind the real preamble: forces the ECDH and scan
                let count = Int.random(in: 1...30, using: &random)
                stream = Array(stream.prefix(profile.preambleLength))
                    + (0..<(48 * count)).map { _ in UInt8.random(in: 0...255, using: &random) }
            default:  // whole beacons swapped, duplicated or dropped
                let beacons = stride(from: profile.preambleLength, to: stream.count, by: 48).map { Array(stream[$0..<($0 + 48)]) }
                let picked = (0..<Int.random(in: 0...8, using: &random)).map { _ in beacons.randomElement(using: &random)! }
                stream = Array(stream.prefix(profile.preambleLength)) + picked.flatMap { $0 }
            }
            let result = Result { () throws(BeaconRejection) in try receiver.receive(stream, now: now) }
            switch result {
            case .success(let match):
                // A match can only be the real beacon for us, wherever it now sits.
                #expect(match.sender == sender.publicKey)
                let start = profile.preambleLength + match.beaconIndex * 48
                #expect(Array(stream[start..<(start + 48)]) == Array(valid.stream[(profile.preambleLength + ourIndex * 48)...].prefix(48)))
                outcomes["match", default: 0] += 1
            case .failure(let rejection):
                if !lengthIsValid(stream.count) { #expect(rejection.reason == .malformed, "round \(round)") }
                else { #expect(rejection.reason != .malformed && rejection.reason != .replayed, "round \(round): \(rejection)") }
                outcomes[rejection.reason.rawValue, default: 0] += 1
            }
        }
        // The mutations reach every stage of the parser.
        for reason in ["match", "malformed", "invalid-key", "no-match"] {
            #expect(outcomes[reason, default: 0] > 0, "\(outcomes)")
        }
    }

    /// A stream split at every offset: no prefix parses, only the whole stream matches.
    @Test(arguments: [BeaconProfile.spec, .cordova])
    func everyPrefixIsMalformed(_ profile: BeaconProfile) throws {
        let sender = PrivateKey()
        let me = PrivateKey()
        let announcement = try BeaconGenerator(identity: sender, profile: profile)
            .makeAnnouncement(for: [PrivateKey().publicKey, me.publicKey], expiration: now + 1000, ephemeralKey: PrivateKey())
        let receiver = BeaconReceiver(identity: me, profile: profile, limits: BeaconLimits(replayCacheCapacity: 0))
        try receiver.addressBook.add(sender.publicKey)
        for cut in 0..<announcement.stream.count {
            let prefix = Array(announcement.stream.prefix(cut))
            let expected: BeaconRejection.Reason = cut == profile.streamLength(beaconCount: 1) ? .noMatch : .malformed
            #expect(reason { () throws(BeaconRejection) in try receiver.receive(prefix, now: now) } == expected, "cut at \(cut)")
        }
        #expect(try receiver.receive(announcement.stream, now: now).beaconIndex == 1)
    }

    /// Expirations at the edges of the window and of UInt64 never overflow.
    @Test(arguments: [BeaconProfile.spec, .cordova])
    func extremeExpirationsAndClocks(_ profile: BeaconProfile) throws {
        let me = PrivateKey()
        let sender = PrivateKey()
        let receiver = BeaconReceiver(identity: me, profile: profile, limits: BeaconLimits(replayCacheCapacity: 0))
        try receiver.addressBook.add(sender.publicKey)
        for (expiration, clock, expected) in [
            (UInt64.max, UInt64(0), BeaconRejection.Reason?.some(.tooFarInFuture)),
            (UInt64.max, UInt64.max, nil),
            (0, UInt64.max, .expired),
            (0, 0, nil),
            (86_400_000, 0, nil),
            (86_400_001, 0, .tooFarInFuture),
        ] {
            let stream = try BeaconGenerator(identity: sender, profile: profile)
                .makeAnnouncement(for: [me.publicKey], expiration: expiration, ephemeralKey: PrivateKey()).stream
            #expect(reason { () throws(BeaconRejection) in try receiver.receive(stream, now: clock) } == expected)
        }
    }
}
