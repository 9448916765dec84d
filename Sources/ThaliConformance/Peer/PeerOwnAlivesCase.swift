import NIOCore
import ThaliSSDP

extension PeerConformance.Cases {
    /// `peer/ssdp/own-alives-dropped`: the implementation does not discover itself from its own alives.
    public static let ownAlivesDropped = ConformanceCase("peer/ssdp/own-alives-dropped",
                                                         "its own alives, heard back through multicast loopback, are dropped: its events report the suite found and itself never",
                                                         ["SSDP-3.3"])
}

/// What the suite learnt before it queued anything through the adapter, for [SSDP-3.3]: a
/// `peer_appeared` is reported once, when a peer is new, so an implementation that heard its own first
/// alive before its events were followed would show nothing later. The grade needs both facts.
struct OwnAlivesWatch: Sendable {
    /// The implementation's events reported the suite's SSDP probe before the first `send`: they were
    /// followed before it had anything of the suite's to announce.
    var followedBeforeSends = false
    /// Where something answered the probe's search or announced before the first `send`.
    var announcingBefore: [BeaconLocation] = []
}

extension PeerConformance {
    /// The longest the probe waits for answers to its search (`MX: 1`): past this an implementation that
    /// announces already has answered, by SSDP's own rule.
    static let ownAlivesSearchMaxWait = 1
    /// How long one probe waits for the implementation's events to report it before the next probe, at a
    /// new location, tries again: its one report may have come before the events were followed.
    static let ownAlivesProbeWait: TimeAmount = .seconds(1)

    /// Before anything is queued for the suite: announces a probe on SSDP (a location of its own that
    /// answers `204`, no beacons) until the implementation's events report it, which shows that they are
    /// followed. A report that came before they were followed is lost, so each probe that is not reported
    /// within ``ownAlivesProbeWait`` says byebye and the next one comes at a new location, until the step
    /// timeout; a late report of any of them counts. Each probe also searches, to learn whether the
    /// implementation announces already. Without an adapter's events, with a location given or over
    /// Bluetooth, nothing is probed.
    func watchForOwnAlives(events: AdapterEventFollower?) async -> OwnAlivesWatch {
        let configuration = self.configuration
        guard let events, configuration.location == nil, configuration.bluetooth == nil else { return OwnAlivesWatch() }
        let started = NIODeadline.now()
        let deadline = started + configuration.stepTimeout
        let searchWindowEnd = started + .seconds(Int64(Self.ownAlivesSearchMaxWait)) + configuration.searchDelayTolerance
        var watch = OwnAlivesWatch()
        var heard: [BeaconLocation] = [], probes: [BeaconLocation] = []
        let mark = events.count
        while !watch.followedBeforeSends && NIODeadline.now() < deadline && !Task.isCancelled {
            guard let port = try? await PeerSuiteServer.start(host: configuration.address, peer: configuration.peerKey,
                                                              limits: configuration.deliveryLimits, group: group) else { break }
            var ssdp = SSDPDiscoveryConfiguration(interfaceAddress: configuration.address)
            ssdp.groupAddress = configuration.ssdpGroup
            ssdp.port = configuration.ssdpPort
            ssdp.beaconServer = .external(port: port.port)
            ssdp.searchMaxWait = Self.ownAlivesSearchMaxWait
            let probe = SSDPDiscoveryService(configuration: ssdp, group: group) { _, _ in }
            guard (try? await probe.start(advertising: [])) != nil else {
                await port.close()
                break
            }
            probes.append(BeaconLocation(host: configuration.address, port: port.port))
            // A report of an earlier probe that comes late shows as much: it was made before any send.
            let wait = min(Self.ownAlivesProbeWait, deadline - NIODeadline.now())
            watch.followedBeforeSends = await events.first(after: mark, timeout: wait) { [probes] event in
                probes.contains { Self.event(event, names: $0) }
            } != nil
            if watch.followedBeforeSends, searchWindowEnd > NIODeadline.now() {
                try? await Task.sleep(nanoseconds: UInt64((searchWindowEnd - NIODeadline.now()).nanoseconds))
            }
            heard += await probe.peers().map(\.location)
            await probe.stop()
            await port.close()
        }
        watch.announcingBefore = heard
        return watch
    }

    /// Whether `event` is a `peer_appeared` naming `location`'s host and port.
    static func event(_ event: AdapterEvent, names location: BeaconLocation) -> Bool {
        guard event.event == "peer_appeared", let text = event.location, let found = BeaconLocation(parsing: text) else { return false }
        return found.host == location.host && found.port == location.port
    }

    /// Whether the implementation took its own alives for a peer's [SSDP-3.3]: the datagrams loop back to
    /// its own socket (ours set `IP_MULTICAST_LOOP`, and on one host every peer shares the group), and
    /// only its own reports show what it made of them. The adapter's `peer_appeared` events over the run
    /// must name the suite (the control: its reports of discoveries reach us) and never its own location;
    /// and they count only when they were followed before it first announced (`watch`): the report of the
    /// suite's probe before the first `send` is both the control and the proof.
    func gradeOwnAlivesDropped(_ run: ConformanceRun, events: AdapterEventFollower?, own: BeaconLocation, suite: BeaconLocation,
                               watch: OwnAlivesWatch) {
        let testCase = Cases.ownAlivesDropped
        let expected = "a `peer_appeared` for the suite's \(suite) and none for its own \(own)"
        guard configuration.location == nil else {
            run.record(testCase, .notApplicable, expected: expected, actual: ssdpNotUsed)
            return
        }
        guard let events else {
            run.record(testCase, .notApplicable, expected: expected, actual: "no adapter, so no events to read")
            return
        }
        let appeared = events.events(after: 0)
        let ownSeen = appeared.filter { Self.event($0, names: own) }.count
        if ownSeen > 0 {
            run.grade(testCase, holds: false, expected: expected, actual: "\(ownSeen) `peer_appeared` for its own location")
        } else if watch.announcingBefore.contains(where: { $0.host == own.host && $0.port == own.port }) {
            run.record(testCase, .inconclusive, expected: expected,
                       actual: "it announced at \(own) before the suite queued anything, so it may have heard itself before its events were followed")
        } else if watch.followedBeforeSends {
            run.grade(testCase, holds: true, expected: expected,
                      actual: "its events reported the suite's probe before anything was queued for it, and never its own location")
        } else if appeared.contains(where: { Self.event($0, names: suite) }) {
            run.record(testCase, .inconclusive, expected: expected,
                       actual: "its events reported the suite only after items were queued for it, so they may have begun after it first heard itself")
        } else {
            run.record(testCase, .notApplicable, expected: expected,
                       actual: "its events report no `peer_appeared` for the suite either, so they would not show its own")
        }
    }
}
