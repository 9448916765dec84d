import Testing
import ThaliBeacons

/// A settable clock for tests.
final class TestClock: @unchecked Sendable {
    private var milliseconds: UInt64
    init(_ start: UInt64) { milliseconds = start }
    var now: UInt64 { milliseconds }
    func advance(_ delta: UInt64) { milliseconds += delta }
    var beaconClock: BeaconClock { BeaconClock { [self] in self.milliseconds } }
}

func reason(_ body: () throws(BeaconRejection) -> BeaconMatch) -> BeaconRejection.Reason? {
    do { _ = try body(); return nil } catch { return error.reason }
}

@Suite struct ReceiverTests {
    let start: UInt64 = 1_763_700_000_000

    @Test(arguments: [BeaconProfile.spec, .cordova])
    func roundTripWithRandomKeysAndSystemEntropy(_ profile: BeaconProfile) throws {
        let sender = PrivateKey()
        let receivers = (0..<5).map { _ in PrivateKey() }
        let generator = BeaconGenerator(identity: sender, profile: profile)
        let announcement = try generator.makeAnnouncement(for: receivers.map(\.publicKey), validity: .seconds(60))
        #expect(announcement.stream.count == profile.streamLength(beaconCount: 5))
        for (index, key) in receivers.enumerated() {
            let receiver = BeaconReceiver(identity: key, profile: profile)
            try receiver.addressBook.add(sender.publicKey)
            let match = try receiver.receive(announcement.stream)
            #expect(match.beaconIndex == index)
            #expect(match.sender == sender.publicKey)
            #expect(match.pskIdentity == announcement.beacons[index].pskIdentity)
            #expect(match.psk == announcement.beacons[index].psk)
            #expect(match.expiration == announcement.expiration)
        }
    }

    @Test func expirationIsNowPlusValidityPlusFuzz() throws {
        let generator = BeaconGenerator(
            identity: PrivateKey(), clock: .fixed(start),
            entropy: BeaconEntropy(fuzz: { 200 }, ephemeralKey: { PrivateKey() }))
        let announcement = try generator.makeAnnouncement(for: [PrivateKey().publicKey], validity: .milliseconds(1500))
        #expect(announcement.expiration == start + 1500 + 200)
        #expect(Array(announcement.stream[88..<96]) == (0..<8).map { UInt8(truncatingIfNeeded: (start + 1700) >> (56 - 8 * $0)) })
    }

    @Test func generatorRejectsBadRequests() throws {
        let generator = BeaconGenerator(identity: PrivateKey(), limits: BeaconLimits(maximumBeaconsPerAnnouncement: 3))
        let contact = PrivateKey().publicKey
        #expect(throws: BeaconGenerationError.self) { try generator.makeAnnouncement(for: [], validity: .seconds(1)) }
        #expect(throws: BeaconGenerationError.self) { try generator.makeAnnouncement(for: [contact], validity: .zero) }
        #expect(throws: BeaconGenerationError.self) { try generator.makeAnnouncement(for: [contact], validity: .milliseconds(-5)) }
        #expect(throws: BeaconGenerationError.self) { try generator.makeAnnouncement(for: [contact], validity: .milliseconds(86_400_000 - 254)) }
        #expect(throws: Never.self) { try generator.makeAnnouncement(for: [contact], validity: .milliseconds(86_400_000 - 255)) }
        #expect(throws: BeaconGenerationError.self) { try generator.makeAnnouncement(for: Array(repeating: contact, count: 4), validity: .seconds(1)) }
        let endOfTime = BeaconGenerator(identity: PrivateKey(), clock: .fixed(.max - 10))
        #expect(throws: BeaconGenerationError.self) { try endOfTime.makeAnnouncement(for: [contact], validity: .seconds(1)) }
    }

    @Test func longestValidityWithLargestFuzzIsAcceptedAtOnce() throws {
        let sender = PrivateKey()
        let me = PrivateKey()
        let generator = BeaconGenerator(
            identity: sender, clock: .fixed(start), entropy: BeaconEntropy(fuzz: { 255 }, ephemeralKey: { PrivateKey() }))
        let announcement = try generator.makeAnnouncement(for: [me.publicKey], validity: .milliseconds(86_400_000 - 255))
        let receiver = BeaconReceiver(identity: me, clock: .fixed(start))
        try receiver.addressBook.add(sender.publicKey)
        #expect(try receiver.receive(announcement.stream).sender == sender.publicKey)
    }

    @Test func generatorCachesEachContactsSecretWithinItsBound() throws {
        let generator = BeaconGenerator(identity: PrivateKey(), limits: BeaconLimits(generatorSecretCacheCapacity: 3))
        let contacts = (0..<5).map { _ in PrivateKey().publicKey }
        _ = try generator.makeAnnouncement(for: Array(contacts.prefix(2)), validity: .seconds(10))
        #expect(generator.cachedSecretCount == 2)
        _ = try generator.makeAnnouncement(for: contacts, validity: .seconds(10))
        #expect(generator.cachedSecretCount == 3)
    }

    @Test func replayedAnnouncementIsRejectedBeforeScanning() throws {
        let clock = TestClock(start)
        let sender = PrivateKey()
        let me = PrivateKey()
        let announcement = try BeaconGenerator(identity: sender, clock: clock.beaconClock)
            .makeAnnouncement(for: [me.publicKey], validity: .seconds(10))
        let receiver = BeaconReceiver(identity: me, clock: clock.beaconClock)
        try receiver.addressBook.add(sender.publicKey)
        #expect(try receiver.receive(announcement.stream).beaconIndex == 0)
        #expect(reason { () throws(BeaconRejection) in try receiver.receive(announcement.stream) } == .replayed)
        // An announcement that did not match is remembered too: repeats cost no ECDH.
        let stranger = try BeaconGenerator(identity: PrivateKey(), clock: clock.beaconClock)
            .makeAnnouncement(for: [PrivateKey().publicKey], validity: .seconds(10))
        #expect(reason { () throws(BeaconRejection) in try receiver.receive(stranger.stream) } == .noMatch)
        #expect(reason { () throws(BeaconRejection) in try receiver.receive(stranger.stream) } == .replayed)
        // Rejected before the replay check: not remembered.
        var garbled = stranger.stream
        garbled[30] ^= 0xff
        #expect(reason { () throws(BeaconRejection) in try receiver.receive(garbled) } == .invalidKey)
        let statistics = receiver.statistics
        #expect(statistics.matches == 1)
        #expect(statistics.rejections[.replayed] == 2)
        #expect(statistics.rejections[.noMatch] == 1)
        #expect(statistics.rejections[.invalidKey] == 1)
        #expect(statistics.replayCacheCount == 2)
        // After expiry the stream is refused as expired, never as a replay.
        clock.advance(20_000)
        #expect(reason { () throws(BeaconRejection) in try receiver.receive(announcement.stream) } == .expired)
    }

    @Test("a copy re-served from another origin first cannot make the genuine announcement a replay")
    func replayIsKeyedByOrigin() throws {
        let clock = TestClock(start)
        let me = PrivateKey()
        let alice = PrivateKey()
        let receiver = BeaconReceiver(identity: me, clock: clock.beaconClock)
        try receiver.addressBook.add(alice.publicKey)
        let announcement = try BeaconGenerator(identity: alice, clock: clock.beaconClock)
            .makeAnnouncement(for: [me.publicKey], validity: .seconds(10))
        let attacker = "http://192.0.2.66:4000/NotificationBeacons"
        let genuine = "http://192.0.2.10:5000/NotificationBeacons"
        // The attacker fetched Alice's announcement and serves it from its own address, and is heard first.
        let copied = try receiver.receive(announcement.stream, from: attacker)
        #expect(copied.sender == alice.publicKey)
        #expect(reason { () throws(BeaconRejection) in try receiver.receive(announcement.stream, from: attacker) } == .replayed)
        // Alice's own location still matches: the copy burned only the attacker's entry.
        let match = try receiver.receive(announcement.stream, from: genuine)
        #expect(match.pskIdentity == copied.pskIdentity)
        #expect(reason { () throws(BeaconRejection) in try receiver.receive(announcement.stream, from: genuine) } == .replayed)
        #expect(receiver.statistics.replayCacheCount == 2)
    }

    @Test func replayCacheIsBoundedAndDropsExpiredFirst() throws {
        let clock = TestClock(start)
        let me = PrivateKey()
        let receiver = BeaconReceiver(identity: me, limits: BeaconLimits(replayCacheCapacity: 4), clock: clock.beaconClock)
        let generator = BeaconGenerator(identity: PrivateKey(), clock: clock.beaconClock)
        // Four short-lived announcements fill the cache.
        let short = try (0..<4).map { _ in try generator.makeAnnouncement(for: [PrivateKey().publicKey], validity: .seconds(1)) }
        for announcement in short { _ = reason { () throws(BeaconRejection) in try receiver.receive(announcement.stream) } }
        #expect(receiver.statistics.replayCacheCount == 4)
        // Once they expired, new entries replace them without counting as evictions.
        clock.advance(2_000)
        let long = try (0..<4).map { _ in try generator.makeAnnouncement(for: [PrivateKey().publicKey], validity: .seconds(100)) }
        for announcement in long { _ = reason { () throws(BeaconRejection) in try receiver.receive(announcement.stream) } }
        #expect(receiver.statistics.replayCacheCount == 4)
        #expect(receiver.statistics.replayCacheEvictions == 0)
        // A fifth live entry evicts the one expiring soonest; the cache never grows past its bound.
        let extra = try generator.makeAnnouncement(for: [PrivateKey().publicKey], validity: .seconds(200))
        _ = reason { () throws(BeaconRejection) in try receiver.receive(extra.stream) }
        #expect(receiver.statistics.replayCacheCount == 4)
        #expect(receiver.statistics.replayCacheEvictions == 1)
        #expect(reason { () throws(BeaconRejection) in try receiver.receive(extra.stream) } == .replayed)
    }

    @Test func addressBookIsBounded() throws {
        let receiver = BeaconReceiver(identity: PrivateKey(), limits: BeaconLimits(addressBookCapacity: 2))
        let contacts = (0..<3).map { _ in PrivateKey().publicKey }
        try receiver.addressBook.add(contacts[0])
        try receiver.addressBook.add(contacts[1])
        try receiver.addressBook.add(contacts[1])  // already present: no error
        #expect(throws: AddressBookError.self) { try receiver.addressBook.add(contacts[2]) }
        #expect(receiver.addressBook.count == 2)
        #expect(receiver.addressBook.contains(contacts[0]))
        #expect(!receiver.addressBook.contains(contacts[2]))
        #expect(receiver.addressBook.remove(contacts[0]))
        try receiver.addressBook.add(contacts[2])
        #expect(Set(receiver.addressBook.contacts) == [contacts[1], contacts[2]])
    }

    @Test func addressBookCachesSxyOnFirstMatch() throws {
        let sender = PrivateKey()
        let me = PrivateKey()
        let receiver = BeaconReceiver(identity: me)
        try receiver.addressBook.add(sender.publicKey)
        try receiver.addressBook.add(PrivateKey().publicKey)
        #expect(receiver.addressBook.cachedSecretCount == 0)
        let generator = BeaconGenerator(identity: sender)
        for _ in 0..<2 {
            _ = try receiver.receive(try generator.makeAnnouncement(for: [me.publicKey], validity: .seconds(5)).stream)
        }
        #expect(receiver.addressBook.cachedSecretCount == 1)
    }

    @Test func tooManyBeaconsIsMalformedBeforeAnyWork() throws {
        let sender = PrivateKey()
        let me = PrivateKey()
        let announcement = try BeaconGenerator(identity: sender)
            .makeAnnouncement(for: (0..<5).map { _ in PrivateKey().publicKey } + [me.publicKey], validity: .seconds(5))
        let strict = BeaconReceiver(identity: me, limits: BeaconLimits(maximumBeaconsPerAnnouncement: 5))
        try strict.addressBook.add(sender.publicKey)
        #expect(reason { () throws(BeaconRejection) in try strict.receive(announcement.stream) } == .malformed)
        let lenient = BeaconReceiver(identity: me, limits: BeaconLimits(maximumBeaconsPerAnnouncement: 6))
        try lenient.addressBook.add(sender.publicKey)
        #expect(try lenient.receive(announcement.stream).beaconIndex == 5)
    }

    /// spec: an authenticated flag from an unknown sender ends the scan, even if a later beacon
    /// would match; cordova keeps scanning.
    @Test(arguments: [BeaconProfile.spec, .cordova])
    func unknownSenderBeforeOurBeacon(_ profile: BeaconProfile) throws {
        let me = PrivateKey()
        let known = PrivateKey()
        let unknown = PrivateKey()
        let expiration = start + 60_000
        let ephemeral = PrivateKey()
        let first = try BeaconGenerator(identity: unknown, profile: profile)
            .makeAnnouncement(for: [me.publicKey], expiration: expiration, ephemeralKey: ephemeral)
        let second = try BeaconGenerator(identity: known, profile: profile)
            .makeAnnouncement(for: [me.publicKey], expiration: expiration, ephemeralKey: ephemeral)
        // Same ephemeral key and expiration: the preambles agree, so beacons can be spliced.
        let stream = first.stream + second.stream.suffix(48)
        let receiver = BeaconReceiver(identity: me, profile: profile)
        try receiver.addressBook.add(known.publicKey)
        let outcome = Result { () throws(BeaconRejection) in try receiver.receive(stream, now: start) }
        switch profile {
        case .spec: #expect(reason { () throws(BeaconRejection) in try outcome.get() } == .noMatch)
        case .cordova: #expect(try outcome.get().beaconIndex == 1)
        }
    }

    /// The spec scan's outcome is that of checking beacons strictly in order, whatever the position
    /// of a stranger's authenticated flag (s), beacons for others (o) and ours from a contact (k).
    @Test(arguments: [
        ("k", 0), ("ok", 1), ("oook", 3), ("ks", 0), ("kos", 0), ("sk", nil), ("osok", nil), ("oso", nil), ("os", nil),
    ] as [(String, Int?)])
    func specScanEqualsInOrderScan(_ layout: String, _ expected: Int?) throws {
        let me = PrivateKey()
        let known = PrivateKey()
        let stranger = PrivateKey()
        let expiration = start + 60_000
        let ephemeral = PrivateKey()
        func beacon(from sender: PrivateKey, to receiver: PublicKey) throws -> [UInt8] {
            Array(try BeaconGenerator(identity: sender)
                .makeAnnouncement(for: [receiver], expiration: expiration, ephemeralKey: ephemeral).stream.suffix(48))
        }
        var stream = Array(try BeaconGenerator(identity: known)
            .makeAnnouncement(for: [me.publicKey], expiration: expiration, ephemeralKey: ephemeral).stream.prefix(96))
        for kind in layout {
            switch kind {
            case "k": stream += try beacon(from: known, to: me.publicKey)
            case "s": stream += try beacon(from: stranger, to: me.publicKey)
            default: stream += try beacon(from: known, to: PrivateKey().publicKey)
            }
        }
        let receiver = BeaconReceiver(identity: me)
        try receiver.addressBook.add(known.publicKey)
        let result = Result { () throws(BeaconRejection) in try receiver.receive(stream, now: start) }
        switch (result, expected) {
        case (.success(let match), let index?): #expect(match.beaconIndex == index)
        case (.failure(let rejection), nil): #expect(rejection.reason == .noMatch)
        default: Issue.record("\(layout): got \(result), expected \(String(describing: expected))")
        }
    }

    /// A beacon whose flag names a known sender but whose HMAC is wrong is skipped, and the scan
    /// goes on to the next beacon (both profiles, as in the spec's pseudo-code).
    @Test(arguments: [BeaconProfile.spec, .cordova])
    func badHmacSkipsToNextBeacon(_ profile: BeaconProfile) throws {
        let me = PrivateKey()
        let sender = PrivateKey()
        let announcement = try BeaconGenerator(identity: sender, profile: profile)
            .makeAnnouncement(for: [me.publicKey, me.publicKey], expiration: start + 60_000, ephemeralKey: PrivateKey())
        var stream = announcement.stream
        stream[profile.preambleLength + 40] ^= 0x01
        let receiver = BeaconReceiver(identity: me, profile: profile)
        try receiver.addressBook.add(sender.publicKey)
        #expect(try receiver.receive(stream, now: start).beaconIndex == 1)
    }
}
