import Testing
import ThaliBeacons

@Suite struct PSKTableTests {
    let start: UInt64 = 1_763_700_000_000

    @Test func lookupFindsEachAdvertisedBeaconUntilItExpires() throws {
        let clock = TestClock(start)
        let contacts = (0..<3).map { _ in PrivateKey().publicKey }
        let announcement = try BeaconGenerator(identity: PrivateKey(), clock: clock.beaconClock,
                                               entropy: BeaconEntropy(fuzz: { 0 }, ephemeralKey: { PrivateKey() }))
            .makeAnnouncement(for: contacts, validity: .seconds(10))
        let table = AdvertisedPSKTable(clock: clock.beaconClock)
        table.register(announcement)
        #expect(table.count == 3)
        for beacon in announcement.beacons {
            let entry = try #require(table.lookup(identity: beacon.pskIdentity))
            #expect(entry.contact == beacon.receiver)
            #expect(entry.psk == beacon.psk)
            #expect(entry.expiration == announcement.expiration)
        }
        #expect(table.lookup(identity: "not advertised") == nil)
        #expect(table.lookup(identity: "") == nil)
        clock.advance(10_000)  // exactly at expiration: still valid, as for receivers
        #expect(table.lookup(identity: announcement.beacons[0].pskIdentity) != nil)
        clock.advance(1)
        #expect(table.lookup(identity: announcement.beacons[0].pskIdentity) == nil)
        #expect(table.lookup(identity: announcement.beacons[1].pskIdentity) == nil)
    }

    @Test func receiverAndTableAgreeOnThePSK() throws {
        for profile in BeaconProfile.allCases {
            let sender = PrivateKey()
            let me = PrivateKey()
            let announcement = try BeaconGenerator(identity: sender, profile: profile)
                .makeAnnouncement(for: [PrivateKey().publicKey, me.publicKey], validity: .seconds(30))
            let table = AdvertisedPSKTable()
            table.register(announcement)
            let receiver = BeaconReceiver(identity: me, profile: profile)
            try receiver.addressBook.add(sender.publicKey)
            let match = try receiver.receive(announcement.stream)
            let entry = try #require(table.lookup(identity: match.pskIdentity))
            #expect(entry.psk == match.psk)
            #expect(entry.contact == me.publicKey)
            #expect(match.psk.count == (profile == .spec ? 16 : 32))
        }
    }

    @Test func duplicateReceiversCollapse() throws {
        let contact = PrivateKey().publicKey
        let announcement = try BeaconGenerator(identity: PrivateKey()).makeAnnouncement(for: [contact, contact], validity: .seconds(5))
        #expect(announcement.beacons[0].pskIdentity == announcement.beacons[1].pskIdentity)
        let table = AdvertisedPSKTable()
        table.register(announcement)
        #expect(table.count == 1)
    }

    @Test func tableIsBoundedAndEvictsSoonestExpiringFirst() throws {
        let clock = TestClock(start)
        let generator = BeaconGenerator(identity: PrivateKey(), clock: clock.beaconClock,
                                        entropy: BeaconEntropy(fuzz: { 0 }, ephemeralKey: { PrivateKey() }))
        let table = AdvertisedPSKTable(capacity: 4, clock: clock.beaconClock)
        let soon = try generator.makeAnnouncement(for: (0..<3).map { _ in PrivateKey().publicKey }, validity: .seconds(10))
        let later = try generator.makeAnnouncement(for: (0..<3).map { _ in PrivateKey().publicKey }, validity: .seconds(60))
        table.register(soon)
        table.register(later)
        #expect(table.count == 4)
        #expect(table.evictions == 2)
        #expect(later.beacons.allSatisfy { table.lookup(identity: $0.pskIdentity) != nil })
        #expect(soon.beacons.filter { table.lookup(identity: $0.pskIdentity) != nil }.count == 1)
        // Expired entries make room without evictions.
        clock.advance(11_000)
        let next = try generator.makeAnnouncement(for: [PrivateKey().publicKey], validity: .seconds(60))
        table.register(next)
        #expect(table.count == 4)
        #expect(table.evictions == 2)
        // An announcement larger than the table keeps only what fits.
        let huge = try generator.makeAnnouncement(for: (0..<6).map { _ in PrivateKey().publicKey }, validity: .seconds(90))
        table.register(huge)
        #expect(table.count == 4)
        table.removeAll()
        #expect(table.count == 0)
    }

    @Test func expiredAnnouncementIsNotRegistered() throws {
        let clock = TestClock(start)
        let announcement = try BeaconGenerator(identity: PrivateKey(), clock: clock.beaconClock)
            .makeAnnouncement(for: [PrivateKey().publicKey], validity: .seconds(1))
        clock.advance(5_000)
        let table = AdvertisedPSKTable(clock: clock.beaconClock)
        table.register(announcement)
        #expect(table.count == 0)
    }

    @Test func concurrentLookupsAndRegistrations() async throws {
        let table = AdvertisedPSKTable(capacity: 64)
        let generator = BeaconGenerator(identity: PrivateKey())
        let announcements = try (0..<8).map { _ in try generator.makeAnnouncement(for: [PrivateKey().publicKey, PrivateKey().publicKey], validity: .seconds(60)) }
        await withTaskGroup(of: Int.self) { group in
            for announcement in announcements {
                group.addTask {
                    table.register(announcement)
                    return announcement.beacons.filter { table.lookup(identity: $0.pskIdentity) != nil }.count
                }
            }
            for await found in group { #expect(found == 2) }
        }
        #expect(table.count == 16)
    }
}
