import Foundation
import NIOPosix
import Testing
import ThaliBeacons

@testable import ThaliSSDP

/// What a beacon consumer made of the streams SSDP delivered.
final class MatchLog: @unchecked Sendable {
    private let lock = NSLock()
    private var matches: [(usn: String, match: BeaconMatch)] = []
    private var rejections: [String] = []
    func record(_ usn: String, _ match: BeaconMatch) { lock.withLock { matches.append((usn, match)) } }
    func reject(_ reason: String) { lock.withLock { rejections.append(reason) } }
    var matched: [(usn: String, match: BeaconMatch)] { lock.withLock { matches } }
    var rejected: [String] { lock.withLock { rejections } }
}

/// End to end: ThaliBeacons' generator makes the stream, ThaliSSDP announces and serves it, the other
/// peer's discovery fetches it and hands it to ThaliBeacons' receiver, which finds the beacon for it.
@Suite("Real beacons over SSDP", .serialized)
struct BeaconsOverSSDPTests {
    @Test func aContactFindsItsBeaconInAnAnnouncementFetchedOverSSDP() async throws {
        let alice = PrivateKey(), bob = PrivateKey(), carol = PrivateKey()
        let generator = BeaconGenerator(identity: alice)
        let first = try generator.makeAnnouncement(for: [carol.publicKey, bob.publicKey], validity: .seconds(60))
        let receiver = BeaconReceiver(identity: bob)
        try receiver.addressBook.add(alice.publicKey)

        let log = MatchLog()
        let port = try freeUDPPort()
        let group = MultiThreadedEventLoopGroup.singleton
        let aliceService = SSDPDiscoveryService(configuration: loopbackConfiguration(port: port), group: group)
        let bobService = SSDPDiscoveryService(configuration: loopbackConfiguration(port: port), group: group) { peer, bytes in
            do { log.record(peer.uniqueServiceName, try receiver.receive(bytes)) } catch { log.reject("\(error)") }
        }
        try await bobService.start()
        try await aliceService.start(advertising: first.stream)
        try await eventually("bob matches alice's first announcement") { log.matched.count == 1 }
        #expect(log.matched[0].match.sender == alice.publicKey)
        #expect(log.matched[0].match.beaconIndex == 1)  // carol's beacon came first
        #expect(log.matched[0].usn == (await aliceService.uniqueServiceName()))

        // Alice's beacons change: new USN, fetched once, a fresh ephemeral key (no replay rejection).
        let second = try generator.makeAnnouncement(for: [bob.publicKey], validity: .seconds(60))
        await aliceService.advertise(second.stream)
        try await eventually("bob matches the second announcement") { log.matched.count == 2 }
        #expect(log.matched[1].match.sender == alice.publicKey && log.matched[1].match.beaconIndex == 0)
        #expect(log.matched[1].match.pskIdentity != log.matched[0].match.pskIdentity)
        // More alives of the second USN, read by bob (it advertises nothing, so all it reads is alice's): a
        // refetch would follow each within milliseconds (one tracked peer, a 10 ms spread); the first two
        // would be done when the third alive, 200 ms later, is read.
        let readBefore = await bobService.counters().datagramsReceived
        try await eventually("three more alives read") { await bobService.counters().datagramsReceived >= readBefore + 3 }
        #expect(await bobService.counters().beaconFetchesSucceeded == 2)
        #expect(log.matched.count == 2)
        #expect(log.rejected.isEmpty)
        #expect(receiver.statistics.matches == 2)
        await aliceService.stop()
        await bobService.stop()
    }
}
