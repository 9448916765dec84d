import NIOCore
import NIOPosix
import Testing
import ThaliSSDP

@testable import ThaliConformance

/// The search of peer mode's `peer/ssdp/search-answer` [SSDP-2.7], against ThaliSSDP's discovery service
/// on loopback: answered while it announces, unanswered once it stops.
@Suite("M-SEARCH probe", .serialized)
struct SSDPSearchProbeTests {
    @Test("an announcing peer answers on the searcher's own socket with its USN and LOCATION; a silent one leaves no answer")
    func answeredOnlyWhileAnnouncing() async throws {
        let group = MultiThreadedEventLoopGroup.singleton
        let port = Int.random(in: 20_000...40_000)
        var configuration = SSDPDiscoveryConfiguration(interfaceAddress: "127.0.0.1")
        configuration.port = port
        let service = SSDPDiscoveryService(configuration: configuration, group: group)
        try await service.start(advertising: [1, 2, 3])
        let usn = try #require(await service.uniqueServiceName())
        var probe = SSDPSearchProbe(address: "127.0.0.1", group: configuration.groupAddress, port: port)

        let answered = try await probe.search(expecting: usn, on: group)
        let (answer, sender) = try #require(answered.answer, "\(answered.datagrams) datagrams, \(String(describing: answered.lastError))")
        #expect(answer.searchTarget == ThaliServiceName.notificationType)
        #expect(BeaconLocation(parsing: answer.location) == (await service.location()))
        #expect(answer.maxAge > 0)
        #expect(sender.ipAddress == "127.0.0.1")

        await service.advertise(nil)
        probe.slack = .milliseconds(500)
        let silent = try await probe.search(expecting: usn, on: group)
        #expect(silent.answer == nil)
        await service.stop()
    }
}
