import Testing
import ThaliBeacons
import ThaliNodeCore
import ThaliSSDP
import ThaliSupport

@testable import ThaliConformance

/// `peer/beacons/fresh-ephemeral-key` [BCN-1.3]: the judgement of the announcements fetched from one
/// location, fed announcements our generator makes, one key drawn fresh for each or one key used twice.
@Suite("Conformance: ephemeral keys across announcements")
struct AnnouncementKeyLogTests {
    static let location = BeaconLocation(host: "127.0.0.1", port: 40_000)
    static let receiver = PrivateKey().publicKey

    static func log(_ streams: [[UInt8]], at location: BeaconLocation = location) -> AnnouncementKeyLog {
        var log = AnnouncementKeyLog(profile: .spec)
        for stream in streams { log.record(stream, from: location) }
        return log
    }

    @Test("announcements each with a fresh key hold; the same stream fetched again is one announcement")
    func freshKeys() throws {
        let generator = BeaconGenerator(identity: PrivateKey())
        let first = try generator.makeAnnouncement(for: [Self.receiver], validity: .seconds(600)).stream
        let second = try generator.makeAnnouncement(for: [Self.receiver], validity: .seconds(600)).stream
        let judged = try #require(Self.log([first, first, second]).judge(Self.location))
        #expect(judged.holds && judged.actual == "2 announcements, 2 different ephemeral keys", "\(judged.actual)")
        // One announcement, fetched twice (a node serving several in turn does so), is nothing to compare.
        #expect(Self.log([first, first]).judge(Self.location) == nil)
        // Nor are empty bodies (a 204) and cut streams announcements.
        #expect(Self.log([first, [], Array(second.prefix(40))]).judge(Self.location) == nil)
    }

    @Test("two announcements under one ephemeral key fail, the key named")
    func reusedKey() throws {
        let generator = BeaconGenerator(identity: PrivateKey())
        let ephemeral = PrivateKey()
        let now = DeliveryClock.nowMilliseconds
        let first = try generator.makeAnnouncement(for: [Self.receiver], expiration: now + 600_000, ephemeralKey: ephemeral).stream
        let second = try generator.makeAnnouncement(for: [Self.receiver, PrivateKey().publicKey], expiration: now + 601_000,
                                                    ephemeralKey: ephemeral).stream
        let judged = try #require(Self.log([first, second]).judge(Self.location))
        #expect(!judged.holds, "\(judged.actual)")
        #expect(judged.actual.contains(Hex.encode(first.prefix(8))), "\(judged.actual)")
    }

    @Test("locations are judged apart: another peer's announcements are not the implementation's")
    func byLocation() throws {
        let ephemeral = PrivateKey()
        let now = DeliveryClock.nowMilliseconds
        let streams = try (0..<2).map { index in
            try BeaconGenerator(identity: PrivateKey()).makeAnnouncement(for: [Self.receiver], expiration: now + 600_000 + UInt64(index),
                                                                        ephemeralKey: ephemeral).stream
        }
        var log = Self.log([streams[0]])
        log.record(streams[1], from: BeaconLocation(host: "127.0.0.2", port: 40_000))
        #expect(log.judge(Self.location) == nil && log.count(Self.location) == 1)
    }
}
