import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import ThaliBeacons
import ThaliNodeCore
import ThaliSSDP

/// How target mode runs.
public struct TargetConformanceConfiguration: Sendable {
    /// Our IPv4 address: announcements go out from it and the scripted locations listen on it.
    public var address: String
    /// A second local address of ours, for a forged byebye and a spoofed LOCATION (on loopback, 127.0.0.2);
    /// without one those two cases are N/A.
    public var secondAddress: String?
    /// The SSDP UDP port the implementation listens on.
    public var ssdpPort = SSDPDiscoveryConfiguration.defaultPort
    /// The SSDP multicast group.
    public var ssdpGroup = SSDPDiscoveryConfiguration.defaultGroupAddress
    /// How long the implementation has to react to each scripted step (a conforming peer may wait before it
    /// fetches: our own spreads fetches over the crowd, spec/ssdp.md §5).
    public var observation: TimeAmount = .seconds(3)
    /// The implementation's public key and the suite's identity, which it has as a contact: with both, the
    /// beacon cases announce beacons for it (tampered, good, replayed) and watch whether it connects;
    /// without them those cases are N/A.
    public var keys: (peer: PublicKey, identity: PrivateKey)?
    /// The most PSK-TLS connections it may make within ``observation`` after the suite refused its delivery
    /// stream: a refused stream is not retried by itself and a failed session backs off (spec/node.md,
    /// "Stream marking"), so a storm of reconnections is a warning. Our node's link retries after 250 ms,
    /// doubling: about 5 connections in 3 s.
    public var maxConnectionsAfterRefusal = 8
    /// How long the suite waits, before its script, for the implementation's first M-SEARCH: an
    /// implementation searches when it joins the group (ours only then and every 5 minutes), so one started
    /// after the suite is heard at once; zero starts the script at once and grades whatever searches the
    /// run hears.
    public var searchWait: TimeAmount = .zero
    /// How long the judgement of a search waits for the announcement of the USN its `S` names, when that
    /// has not come yet (an implementation may search just before it announces).
    public var searchSettle: TimeAmount = .seconds(1)
    /// Called once the suite listens on the group, before it waits for the implementation's M-SEARCH: the
    /// moment to start the implementation.
    public var listening: @Sendable () -> Void = {}
    /// The implementation over Bluetooth instead of Wi-Fi: each scripted peer reaches it by a link of its
    /// own (its `00` hello makes the implementation fetch that peer's location, BLE-3.4) instead of an
    /// alive; the SSDP cases are N/A (spec/conformance.md, "Target mode over Bluetooth").
    public var bluetooth: TargetBluetoothLinks?

    /// A configuration for `address`; on loopback the second address is 127.0.0.2.
    public init(address: String) {
        self.address = address
        secondAddress = address == "127.0.0.1" ? "127.0.0.2" : nil
    }
}

/// Target mode: the suite announces scripted peers, correct and deliberately broken, serves their beacon
/// locations, and grades what the implementation under test does with them, from outside: which
/// locations it fetches, how often, and whether it connects. It needs no keys: no beacon it is served is
/// for it.
public struct TargetConformance: Sendable {

    let configuration: TargetConformanceConfiguration
    let group: EventLoopGroup

    /// A run with `configuration` on `group`.
    public init(configuration: TargetConformanceConfiguration, group: EventLoopGroup) {
        self.configuration = configuration
        self.group = group
    }

    /// Runs every case, recording each verdict in `run` as it is decided.
    public func run(_ run: ConformanceRun) async {
        if let links = configuration.bluetooth {
            await runOverBluetooth(run, links)
            return
        }
        let listener: SearchListener?
        do {
            listener = try await SearchListener.start(group: configuration.ssdpGroup, port: configuration.ssdpPort,
                                                      interface: configuration.address, on: group)
        } catch {
            run.note("cannot listen on \(configuration.ssdpGroup):\(configuration.ssdpPort) for the implementation's searches: \(error)")
            listener = nil
        }
        configuration.listening()
        defer { listener?.close() }
        let waited = configuration.searchWait > .zero
        if let listener, waited {
            await listener.wait(until: \.heardAny, within: configuration.searchWait)
            await listener.wait(until: { !$0.awaitsAnnouncement }, within: configuration.searchSettle)
            gradeSearches(run, listener)
        }
        do {
            try await script(run, listener: listener)
        } catch {
            run.note("target mode stopped: \(error)")
            run.recordRemaining(Cases.scripted, .inconclusive, because: "the run stopped: \(error)")
        }
        if let listener, !waited { gradeSearches(run, listener) }
        run.recordRemaining([Cases.searchForm], .inconclusive, because: "the suite could not listen on the group")
    }

    /// The implementation's M-SEARCH datagrams heard so far [SSDP-2.6]; none is N/A (searching is not
    /// required, and ours searches only when it joins the group and every 5 minutes).
    func gradeSearches(_ run: ConformanceRun, _ listener: SearchListener) {
        let expected = "HOST \(configuration.ssdpGroup):\(configuration.ssdpPort), MAN, MX, ST the Thali NT, S its current USN while it advertises one"
        guard let (holds, actual) = listener.heard.judge() else {
            let why = configuration.searchWait > .zero
                ? "no M-SEARCH for the Thali NT within \(PeerConformance.text(configuration.searchWait)) of listening"
                : "no M-SEARCH for the Thali NT during the run (one searches when it joins: start it after the suite, with --search-wait-s)"
            run.record(Cases.searchForm, .notApplicable, expected: expected, actual: why)
            return
        }
        run.grade(Cases.searchForm, holds: holds, expected: expected, actual: actual)
    }

    func script(_ run: ConformanceRun, listener: SearchListener?) async throws {
        let address = configuration.address
        // A stream with one beacon, for a key nobody holds: well formed, and for nobody we know.
        let stream = try BeaconGenerator(identity: PrivateKey()).makeAnnouncement(for: [PrivateKey().publicKey], validity: .seconds(600)).stream
        // Everything opened is closed however the script ends, a failed start halfway included.
        var locations: [ScriptedLocation] = []
        var senders: [MulticastSender] = []
        defer {
            for location in locations { location.close() }
            for sender in senders { sender.close() }
        }
        for _ in 0..<5 { locations.append(try await ScriptedLocation.start(host: address, body: stream, group: group)) }
        let (control, foreign, badUSN, byebyeTarget) = (locations[0], locations[1], locations[2], locations[3])
        var forgetting = ForgettingPeer(location: locations[4])
        // One location per malformed form, so that a fetch names the form that was taken.
        var malformed: [ScriptedLocation] = []
        for _ in TargetDatagrams.malformedForms {
            malformed.append(try await ScriptedLocation.start(host: address, body: stream, group: group))
            locations.append(malformed[malformed.count - 1])
        }
        senders.append(try await MulticastSender.start(address: address, group: configuration.ssdpGroup, port: configuration.ssdpPort,
                                                       on: group))
        let sender = senders[0]
        listener?.ignore(sender.localAddress)
        var spoofed: ScriptedLocation?
        var secondSender: MulticastSender?
        if let second = configuration.secondAddress {
            let location = try await ScriptedLocation.start(host: second, body: stream, group: group)
            locations.append(location)
            spoofed = location
            let other = try await MulticastSender.start(address: second, multicastInterface: address, group: configuration.ssdpGroup,
                                                        port: configuration.ssdpPort, on: group)
            senders.append(other)
            secondSender = other
            listener?.ignore(other.localAddress)
        }
        let datagrams = TargetDatagrams(host: "\(configuration.ssdpGroup):\(configuration.ssdpPort)")
        let controlUSN = ThaliServiceName.makeUniqueServiceName()
        let byebyeUSN = ThaliServiceName.makeUniqueServiceName()

        // Step 1: everything at once, the broken first, so that a lenient implementation has every chance.
        for bytes in datagrams.malformedAlives(locations: malformed.map(\.url)) { try await sender.send(bytes) }
        try await sender.send(datagrams.alive(nt: "urn:schemas-upnp-org:device:Basic:1", usn: ThaliServiceName.makeUniqueServiceName(),
                                              location: foreign.url))
        for usn in ["uuid:not-a-uuid", "urn:thali:\(controlUSN.dropFirst(5))", "data:\(controlUSN.dropFirst(5))"] {
            try await sender.send(datagrams.alive(usn: usn, location: badUSN.url))
        }
        if let spoofed { try await sender.send(datagrams.alive(usn: ThaliServiceName.makeUniqueServiceName(), location: spoofed.url)) }
        try await sender.send(datagrams.alive(usn: controlUSN, location: control.url))
        try await sender.send(datagrams.alive(usn: byebyeUSN, location: byebyeTarget.url))
        try await forgetting.announce(with: sender, datagrams)
        try await Task.sleep(for: .nanoseconds(configuration.observation.nanoseconds))

        let fetched = control.fetches
        run.grade(Cases.validFetched, holds: fetched >= 1, expected: "at least one GET of \(control.url)",
                  actual: "\(fetched) fetches")
        guard fetched >= 1, byebyeTarget.fetches >= 1 else {
            run.recordRemaining(Cases.scripted, .inconclusive,
                                because: "the implementation fetched none of our well-formed alives: is it listening on \(configuration.ssdpGroup):\(configuration.ssdpPort)?")
            return
        }

        // Step 2: the control USN again (nothing new to fetch), and a byebye for the other USN from a second
        // address, then that USN's alive again: honouring the forged byebye would fetch it anew.
        for _ in 0..<4 { try await sender.send(datagrams.alive(usn: controlUSN, location: control.url)) }
        let byebyeFetchesBefore = byebyeTarget.fetches
        if let secondSender {
            try await secondSender.send(datagrams.byebye(usn: byebyeUSN))
            try await Task.sleep(for: .milliseconds(300))
            try await sender.send(datagrams.alive(usn: byebyeUSN, location: byebyeTarget.url))
        }
        try await Task.sleep(for: .nanoseconds(configuration.observation.nanoseconds))

        run.grade(Cases.fetchOnce, holds: control.fetches == 1, expected: "exactly 1 fetch after 5 alives of one USN",
                  actual: "\(control.fetches) fetches")
        run.grade(Cases.noMatchNoConnect, holds: locations.allSatisfy { $0.otherConnections == 0 },
                  expected: "no connection but beacon fetches to any location we announced",
                  actual: "\(locations.map(\.otherConnections).reduce(0, +)) other connections (TLS or not HTTP)")
        let taken = zip(TargetDatagrams.malformedForms, malformed).filter { $0.1.fetches > 0 }
        run.grade(Cases.malformed, holds: taken.isEmpty, expected: "no fetch for any of the \(malformed.count) malformed forms",
                  actual: taken.isEmpty ? "no fetch for any of the \(malformed.count) forms"
                      : "fetched for " + taken.map { "\($0.0) (\($0.1.fetches)×)" }.joined(separator: ", "))
        run.grade(Cases.foreignNT, holds: foreign.fetches == 0, expected: "no fetch", actual: "\(foreign.fetches) fetches")
        run.grade(Cases.badUSN, holds: badUSN.fetches == 0, expected: "no fetch", actual: "\(badUSN.fetches) fetches")
        if let spoofed {
            run.grade(Cases.spoofedLocation, holds: spoofed.fetches == 0, expected: "no fetch of \(spoofed.url)",
                      actual: "\(spoofed.fetches) fetches")
        } else {
            run.record(Cases.spoofedLocation, .notApplicable, expected: "no fetch", actual: "no second address (--second-address)")
        }
        if secondSender != nil {
            let again = byebyeTarget.fetches - byebyeFetchesBefore
            run.grade(Cases.forgedByebye, holds: again == 0, expected: "no new fetch after a forged byebye and an alive",
                      actual: "\(again) new fetches")
        } else {
            run.record(Cases.forgedByebye, .notApplicable, expected: "no new fetch", actual: "no second address (--second-address)")
        }
        // Silent since step 1, two observation periods and more past its max-age: it must be forgotten.
        try await forgetting.announceAgain(with: sender, datagrams)
        try await beaconCases(run, announcer: .overSSDP(sender: sender, datagrams: datagrams, address: address))
        // Before the busy location: a client may postpone every fetch from a busy server's address.
        try await forgetting.grade(run, observation: configuration.observation)
        // Last: a client may postpone every fetch from a busy server's address, ours among them.
        let busy = try await ScriptedLocation.start(host: address, body: stream, busyRetryAfter: Self.busyRetryAfterSeconds, group: group)
        locations.append(busy)
        try await gradeBusy(run, busy, sender: sender, datagrams: datagrams)
    }

    /// How a scripted peer's location reaches the implementation: an alive over SSDP under a new USN, or a
    /// new Bluetooth link joined to it.
    struct Announcer: Sendable {
        /// Announces the suite's location at `port` as a new peer; `fetches` counts that location's beacon
        /// requests (over Bluetooth the announcement returns once it rose, or after a bounded wait).
        let announce: @Sendable (_ port: Int, _ fetches: @escaping @Sendable () -> Int) async throws -> Void
        /// How the replay is made: nil, by announcing the same location again under a new USN (SSDP); a
        /// period, by waiting that long on the link that made the session for the implementation's own
        /// refetch of the same announcement (over Bluetooth a new link is a new origin, where the same
        /// announcement rightly matches anew: spec/beacons.md keys the replay cache by origin).
        let replayWait: TimeAmount?

        static func overSSDP(sender: MulticastSender, datagrams: TargetDatagrams, address: String) -> Announcer {
            Announcer(announce: { port, _ in
                try await sender.send(datagrams.alive(usn: ThaliServiceName.makeUniqueServiceName(), location: "http://\(address):\(port)/"))
            }, replayWait: nil)
        }
    }

    /// The `Retry-After` of the busy location, in seconds.
    static let busyRetryAfterSeconds = 2

    /// How often the busy case repeats its alive: the temptation to ask too soon, and the occasion to ask
    /// again once the Retry-After has passed.
    static let busyAliveInterval = TimeAmount.milliseconds(500)

    /// A location that answers its first fetch `503` with `Retry-After`: a new USN's alive, repeated every
    /// ``busyAliveInterval`` through the Retry-After and one more period. Asking sooner than the
    /// Retry-After fails [SSDP-6.10]; not asking again on the alives after it fails too [SSDP-5.1: a failed
    /// fetch is retried].
    func gradeBusy(_ run: ConformanceRun, _ busy: ScriptedLocation, sender: MulticastSender, datagrams: TargetDatagrams) async throws {
        let started = NIODeadline.now()
        let usn = ThaliServiceName.makeUniqueServiceName()
        let end = started + .seconds(Int64(Self.busyRetryAfterSeconds)) + configuration.observation
        while NIODeadline.now() < end {
            try await sender.send(datagrams.alive(usn: usn, location: busy.url))
            try await Task.sleep(for: .nanoseconds(Self.busyAliveInterval.nanoseconds))
        }
        judgeBusy(run, busy, started: started, retryRequired: true)
    }

    /// The judgement of the busy case once the watch is over: when, after the `503`, it fetched again
    /// [SSDP-6.10], and, with `retryRequired` (over SSDP, where alives kept coming), whether it did [SSDP-5.1].
    func judgeBusy(_ run: ConformanceRun, _ busy: ScriptedLocation, started: NIODeadline, retryRequired: Bool) {
        let wait = TimeAmount.seconds(Int64(Self.busyRetryAfterSeconds))
        let times = busy.fetchTimes
        let expected = "no fetch within \(Self.busyRetryAfterSeconds) s of the 503" + (retryRequired ? ", then a fetch on a later alive" : "")
        guard let first = times.first else {
            run.record(Cases.busyWaited, .inconclusive, expected: expected, actual: "never fetched", started: started)
            return
        }
        guard times.count > 1 else {
            let watched = PeerConformance.text(wait + configuration.observation)
            run.grade(Cases.busyWaited, holds: !retryRequired, expected: expected,
                      actual: retryRequired ? "never fetched again within \(watched), though its alive kept coming every \(PeerConformance.text(Self.busyAliveInterval))"
                          : "no second fetch within \(watched)",
                      started: started)
            return
        }
        let after = times[1] - first
        run.grade(Cases.busyWaited, holds: after >= wait, expected: expected,
                  actual: "fetched again \(after.nanoseconds / 1_000_000) ms after the 503", started: started)
    }
}
