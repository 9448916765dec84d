import Foundation
import NIOCore
import NIOPosix
import Testing
@testable import ThaliSSDP

/// The `unicastFailure` last resort reads failing connects as blocked unicast only over a span; once
/// unicast has worked in the run, over the longer `unicastFailureMinimumSpanOnceWorked` (a saturated crowd
/// fails every fetch for a while after it has read our beacons; blocked unicast fails from the start).
@Suite("Unicast failure span", .serialized)
struct UnicastFailureSpanTests {
    let group = MultiThreadedEventLoopGroup.singleton

    @Test("after one successful fetch, failing connects pause announcing only once the longer span has passed")
    func unicastThatWorkedNeedsTheLongerSpan() async throws {
        let port = try freeUDPPort()
        var configuration = Self.refetchingConfiguration(port: port)
        configuration.limits.unicastFailureMinimumSpan = .milliseconds(300)
        configuration.limits.unicastFailureMinimumSpanOnceWorked = .seconds(3)
        let bob = SSDPDiscoveryService(configuration: configuration, group: group)
        let bobEvents = EventLog(bob)
        try await bob.start(advertising: [1])

        // One peer whose beacons Bob reads: unicast works here.
        let openHost = "127.0.0.61"
        let open = BeaconHTTPServer(host: openHost, group: group)
        let openPort = try await open.start()
        open.setBeacons([7])
        let openRaw = try await RawSSDPSocket(host: openHost, groupPort: port)
        try await openRaw.send(aliveText(port: port, location: "http://\(openHost):\(openPort)/"))
        try await eventually("the open peer fetched") { await bob.counters().beaconFetchesSucceeded >= 1 }
        await open.stop()

        // Before the first failure: the streak starts later, so the pause must come at least the span after this.
        let clock = ContinuousClock()
        let beforeFailures = clock.now
        // Then three hosts whose ports refuse, announcing again and again.
        let alives = try await Self.announceRefusingHosts(from: 62, port: port)
        defer { alives.cancel() }
        try await eventually("a failure from each") {
            Set(bobEvents.events.compactMap { if case .beaconFetchFailed(let peer, _) = $0 { peer.location.host } else { nil } }).count == 3
        }
        let allFailing = clock.now
        // Failing on from all three, well past the short span: not yet a pause.
        try await eventually(timeout: .seconds(15), "failures past the short span") {
            await bob.counters().beaconFetchesFailed >= 15 && clock.now - allFailing >= .milliseconds(900)
        }
        #expect(!bobEvents.events.contains(.limitTriggered(.unicastFailure)), "\(bobEvents.events)")
        // Past the longer span, the same failures do pause announcing.
        try await bobEvents.wait(timeout: .seconds(15), "unicast failure") { $0 == .limitTriggered(.unicastFailure) }
        #expect(clock.now - beforeFailures >= .seconds(3))
        #expect(await bob.counters().unicastFailurePauses == 1)
        await bob.stop()
    }

    /// Oversubscription is not blocked unicast: a peer whose own event loop stops for a while (a crowd on a
    /// few cores) fails its connects for that reason. Its housekeeping tick runs late then, and a streak in
    /// which it ran `unicastFailureStarvedLoopLag` late starts over instead of pausing announcing.
    @Test("failures while this peer's own event loop runs late start over instead of pausing announcing")
    func starvedLoopDoesNotPause() async throws {
        // A loop of its own: the test stalls it.
        let loops = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let port = try freeUDPPort()
        var configuration = Self.refetchingConfiguration(port: port)
        configuration.housekeepingInterval = .milliseconds(50)
        configuration.limits.unicastFailureMinimumSpan = .milliseconds(400)
        configuration.limits.unicastFailureStarvedLoopLag = .milliseconds(150)
        let bob = SSDPDiscoveryService(configuration: configuration, group: loops)
        let bobEvents = EventLog(bob)
        try await bob.start(advertising: [1])
        let alives = try await Self.announceRefusingHosts(from: 66, port: port)
        defer { alives.cancel() }
        // Bob's loop stops for 200 ms out of every 300, as a starved peer's does.
        let stalls = Task {
            while !Task.isCancelled {
                bob.eventLoop.execute { usleep(200_000) }
                try? await Task.sleep(for: .milliseconds(300))
            }
        }
        try await eventually(timeout: .seconds(20), "two streaks read as starvation") {
            await bob.counters().unicastFailureStreaksStarved >= 2
        }
        #expect(!bobEvents.events.contains(.limitTriggered(.unicastFailure)), "\(bobEvents.events)")
        #expect(await bob.counters().unicastFailurePauses == 0)
        #expect(await bob.counters().worstLoopLagMilliseconds >= 150)
        stalls.cancel()
        _ = await stalls.value
        // Running on time again, the same failures are blocked unicast: announcing pauses.
        try await bobEvents.wait(timeout: .seconds(15), "unicast failure") { $0 == .limitTriggered(.unicastFailure) }
        #expect(await bob.counters().unicastFailurePauses == 1)
        await bob.stop()
        try await loops.shutdownGracefully()
    }

    /// Loopback discovery that reads three failing sources as enough for the last resort, and fetches
    /// them again every 100 ms however often they fail.
    static func refetchingConfiguration(port: Int) -> SSDPDiscoveryConfiguration {
        var configuration = loopbackConfiguration(port: port)
        configuration.limits.unicastFailureThreshold = 3
        configuration.limits.failedFetchRetryDelay = .milliseconds(100)
        configuration.limits.maxFailedFetchRetryDelay = .milliseconds(100)
        configuration.limits.sourceFetchFailureThreshold = 1000  // keep fetching them
        configuration.client.maxAttempts = 1
        return configuration
    }

    /// Three hosts, 127.0.0.`first` and the two after it, announcing every 50 ms locations whose ports
    /// refuse, until the returned task is cancelled.
    static func announceRefusingHosts(from first: Int, port: Int) async throws -> Task<Void, Never> {
        var hosts: [(RawSSDPSocket, String)] = []
        for host in (first..<first + 3).map({ "127.0.0.\($0)" }) {
            hosts.append((try await RawSSDPSocket(host: host, groupPort: port),
                          aliveText(port: port, location: "http://\(host):\(try closedTCPPort())/")))
        }
        return Task {
            while !Task.isCancelled {
                for (raw, alive) in hosts { try? await raw.send(alive) }
                try? await Task.sleep(for: .milliseconds(50))
            }
        }
    }

    @Test("a negative span once unicast worked is refused as configuration")
    func negativeSpanIsRefused() async throws {
        var configuration = loopbackConfiguration(port: try freeUDPPort())
        configuration.limits.unicastFailureMinimumSpanOnceWorked = .seconds(-1)
        let bob = SSDPDiscoveryService(configuration: configuration, group: group)
        await #expect(throws: SSDPDiscoveryService.StartError.invalidConfiguration("unicastFailureMinimumSpanOnceWorked")) {
            try await bob.start()
        }
    }
}
