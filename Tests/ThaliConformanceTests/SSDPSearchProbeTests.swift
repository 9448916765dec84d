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

    /// Eight searches at once to a ThaliSSDP peer that delays its answers by at most `maxDelaySeconds`.
    static func delays(maxDelaySeconds: Int) async throws -> [TimeAmount] {
        let group = MultiThreadedEventLoopGroup.singleton
        var configuration = SSDPDiscoveryConfiguration(interfaceAddress: "127.0.0.1")
        configuration.port = Int.random(in: 20_000...40_000)
        configuration.maxSearchResponseDelaySeconds = maxDelaySeconds
        let service = SSDPDiscoveryService(configuration: configuration, group: group)
        try await service.start(advertising: [1, 2, 3])
        let usn = try #require(await service.uniqueServiceName())
        var probe = SSDPSearchProbe(address: "127.0.0.1", group: configuration.groupAddress, port: configuration.port)
        probe.searches = 8
        let outcome = try await probe.search(expecting: usn, on: group)
        await service.stop()
        return outcome.answerDelays
    }

    @Test("searches at once to ThaliSSDP as configured (delays drawn within min(MX, 5)) pass SSDP-4.3; one that answers at once warns")
    func answerDelays() async throws {
        let judge = SearchAnswerDelays(maxWaitSeconds: 1, sent: 8, tolerance: .milliseconds(500))
        let drawn = try await Self.delays(maxDelaySeconds: 5)
        #expect(drawn.count == 8)
        let (verdict, seen) = judge.judge(drawn)
        #expect(verdict == .pass, "\(seen)")
        let immediate = try await Self.delays(maxDelaySeconds: 0)
        let (atOnce, seenAtOnce) = judge.judge(immediate)
        #expect(atOnce == .warn && seenAtOnce.contains("not drawn at random"), "\(seenAtOnce)")
    }

    @Test("the judgement of delays: too few answers, one too late, all at one moment")
    func judgement() {
        let judge = SearchAnswerDelays(maxWaitSeconds: 3, sent: 8, tolerance: .milliseconds(500))
        let spread: [TimeAmount] = [0, 400, 900, 1_300, 1_800, 2_200, 2_600, 2_900].map { .milliseconds($0) }
        #expect(judge.judge(spread).0 == .pass)
        #expect(judge.judge(Array(spread.prefix(3))).0 == .inconclusive)
        #expect(judge.judge(spread + [.milliseconds(3_600)]).0 == .warn)
        #expect(judge.judge(Array(repeating: .milliseconds(1_000), count: 8)).0 == .warn)
        // MX above 5 is capped at 5 s.
        #expect(SearchAnswerDelays(maxWaitSeconds: 120, sent: 8, tolerance: .zero).judge(spread + [.milliseconds(5_200)]).0 == .warn)
    }
}
