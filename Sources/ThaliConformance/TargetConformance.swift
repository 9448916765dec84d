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
    /// The cases, in the order they are graded.
    public enum Cases {
        /// `target/ssdp/valid-fetched`: a well-formed alive from a new USN is fetched (the control: without
        /// it, the "nothing fetched" cases below prove nothing).
        public static let validFetched = ConformanceCase("target/ssdp/valid-fetched", "a well-formed alive of a new USN is fetched",
                                                         ["SSDP-3.6"])
        /// `target/ssdp/fetch-once-per-usn`: four more alives of that USN fetch it no more.
        public static let fetchOnce = ConformanceCase("target/ssdp/fetch-once-per-usn", "more alives of a fetched USN fetch it no more",
                                                      ["SSDP-5.1"])
        /// `target/beacons/no-match-no-connect`: a stream without a beacon for it leads to no connection.
        public static let noMatchNoConnect = ConformanceCase("target/beacons/no-match-no-connect",
                                                             "a stream without a beacon for it leads to no connection", ["BCN-4.8"])
        /// `target/ssdp/malformed-ignored`: datagrams that break the strict grammar are not acted on.
        public static let malformed = ConformanceCase("target/ssdp/malformed-ignored",
                                                      "alives that break the strict grammar (HTTP/1.0, bare LF, a header twice, NTS ssdp:update, no max-age, folded line, bytes after the end) are not fetched",
                                                      ["SSDP-3.1"])
        /// `target/ssdp/foreign-nt-ignored`: an alive of another NT is not fetched.
        public static let foreignNT = ConformanceCase("target/ssdp/foreign-nt-ignored", "an alive of another UPnP NT is not fetched", ["SSDP-3.2"])
        /// `target/ssdp/bad-usn-ignored`: an alive whose USN is not uuid:/data: is not fetched.
        public static let badUSN = ConformanceCase("target/ssdp/bad-usn-ignored", "alives whose USN is neither uuid:<UUID> nor data:<UUID>:<n> are not fetched",
                                                   ["SSDP-3.4"])
        /// `target/ssdp/spoofed-location-ignored`: an alive whose LOCATION host is not its source is not fetched.
        public static let spoofedLocation = ConformanceCase("target/ssdp/spoofed-location-ignored",
                                                            "an alive whose LOCATION names another host than its source is not fetched", ["SSDP-3.5"])
        /// `target/ssdp/forged-byebye-ignored`: a byebye from another address does not make it forget the peer.
        public static let forgedByebye = ConformanceCase("target/ssdp/forged-byebye-ignored",
                                                         "a byebye from another address does not withdraw the peer (its next alive fetches nothing)",
                                                         ["SSDP-5.2"])

        /// `target/beacons/tampered-no-connect`: our announcement for it with a flipped tag byte is fetched
        /// and leads to no connection.
        public static let tamperedNoConnect = ConformanceCase("target/beacons/tampered-no-connect",
                                                              "an announcement for it from a contact, one byte of its beacon's tag flipped, is fetched and leads to no connection",
                                                              ["BCN-4.8"])
        /// `target/beacons/stranger-first-no-connect`: an announcement whose first beacon is for it from a
        /// stranger (its flag verifies) and whose second is ours leads to no connection: the scan ends at
        /// the stranger's flag.
        public static let strangerFirstNoConnect = ConformanceCase("target/beacons/stranger-first-no-connect",
                                                                   "an announcement whose first beacon is for it from a stranger and whose second is ours, from a contact, is fetched and leads to no connection",
                                                                   ["BCN-4.6"])
        /// `target/beacons/match-connects`: a good announcement for it from a contact leads to a PSK-TLS
        /// connection (the control of the two cases around it).
        public static let matchConnects = ConformanceCase("target/beacons/match-connects",
                                                          "a good announcement for it from a contact is fetched and leads to a PSK-TLS session and delivery, unmarked (our server selects no ALPN)",
                                                          ["NODE-3.2", "BCN-4.7", "NODE-4.2"])
        /// `target/psk-tls/close-notify-first`: the session of match-connects, which it closes once delivery
        /// ends (it connected, and it received), ends with its close_notify before TCP closes.
        public static let closeNotifyFirst = ConformanceCase("target/psk-tls/close-notify-first",
                                                             "closing the session of match-connects once delivery ends, it sends close_notify before it closes TCP",
                                                             ["PSK-6.1"])
        /// `target/beacons/replay-no-connect`: the same announcement again from the same location, under a
        /// new USN, is fetched and leads to no connection.
        public static let replayNoConnect = ConformanceCase("target/beacons/replay-no-connect",
                                                            "the same announcement again from the same location, under a new USN, is fetched and leads to no connection",
                                                            ["BCN-4.5"])

        /// `target/psk-tls/small-group-refused`: connecting on a good beacon to a server that offers a
        /// 1536-bit DH group, it refuses with handshake_failure and sends no ClientKeyExchange.
        public static let smallGroupRefused = ConformanceCase("target/psk-tls/small-group-refused",
                                                              "offered a 1536-bit DH group after a good beacon, it refuses with a fatal handshake_failure, no ClientKeyExchange",
                                                              ["PSK-2.3"])

        /// `target/streams/delivery-header`: offered `thali-streams/1` by our server, its delivery stream
        /// starts with the header `delivery`.
        public static let deliveryHeader = ConformanceCase("target/streams/delivery-header",
                                                           "on a session that agreed on thali-streams/1, the delivery stream it opens starts with the header delivery",
                                                           ["NODE-4.1", "NODE-4.3"])
        /// `target/streams/status-read`: it takes our status 0 off the front of the stream: its welcome
        /// answers our hello.
        public static let statusRead = ConformanceCase("target/streams/status-read",
                                                       "it takes our status 0 off the front of the stream: our hello after it is answered with its welcome",
                                                       ["NODE-4.6"])
        /// `target/streams/refusal-not-retried`: a delivery stream we refuse is closed, not opened again on
        /// that session, and its reconnections stay few.
        public static let refusalNotRetried = ConformanceCase("target/streams/refusal-not-retried",
                                                              "a delivery stream we refuse (not-served) is closed by it, not opened again on that session, and its reconnections back off",
                                                              ["NODE-4.7"])

        /// `target/http/busy-waited`: answered `503` with `Retry-After: 2` to its beacon fetch, it asks
        /// that location again no sooner than 2 s later (an alive of the same USN in between tempts it).
        public static let busyWaited = ConformanceCase("target/http/busy-waited",
                                                       "answered 503 with Retry-After: 2, it fetches that location again no sooner than 2 s later, an alive in between notwithstanding",
                                                       ["SSDP-6.10"])

        /// `target/ssdp/search-form`: its M-SEARCH datagrams heard on the group are well formed, name the
        /// group in HOST and carry S with its current USN while it advertises one.
        public static let searchForm = ConformanceCase("target/ssdp/search-form",
                                                       "its M-SEARCH for the Thali NT is well formed with HOST group:port, MAN, MX and ST, and carries S with its current USN while it advertises one",
                                                       ["SSDP-2.6"])

        /// Every case of target mode.
        public static let all = [searchForm, validFetched, fetchOnce, noMatchNoConnect, malformed, foreignNT, badUSN, spoofedLocation, forgedByebye,
                                 forgotten, tamperedNoConnect, strangerFirstNoConnect, matchConnects, closeNotifyFirst, replayNoConnect, smallGroupRefused,
                                 deliveryHeader, statusRead, refusalNotRetried, busyWaited]
        /// The cases of the script (all but the search, which listens beside it).
        static let scripted = Array(all.dropFirst())
        static let beacons = [tamperedNoConnect, strangerFirstNoConnect, matchConnects, closeNotifyFirst, replayNoConnect, smallGroupRefused]
            + marking
        static let marking = [deliveryHeader, statusRead, refusalNotRetried]
    }

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
    private func gradeSearches(_ run: ConformanceRun, _ listener: SearchListener) {
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

    private func script(_ run: ConformanceRun, listener: SearchListener?) async throws {
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
        for _ in 0..<6 { locations.append(try await ScriptedLocation.start(host: address, body: stream, group: group)) }
        let (control, malformed, foreign, badUSN, byebyeTarget) = (locations[0], locations[1], locations[2], locations[3], locations[4])
        var forgetting = ForgettingPeer(location: locations[5])
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
        for bytes in datagrams.malformedAlives(location: malformed.url) { try await sender.send(bytes) }
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
        run.grade(Cases.malformed, holds: malformed.fetches == 0, expected: "no fetch", actual: "\(malformed.fetches) fetches")
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

    /// A location that answers its first fetch `503` with `Retry-After`: a new USN's alive, the same alive
    /// again half a period later, then the Retry-After and one more period to see whether, and when, it
    /// fetches again. Asking sooner fails [SSDP-6.10]; asking later, or not within the watch, passes.
    private func gradeBusy(_ run: ConformanceRun, _ busy: ScriptedLocation, sender: MulticastSender, datagrams: TargetDatagrams) async throws {
        let started = NIODeadline.now()
        let usn = ThaliServiceName.makeUniqueServiceName()
        let wait = TimeAmount.seconds(Int64(Self.busyRetryAfterSeconds))
        try await sender.send(datagrams.alive(usn: usn, location: busy.url))
        try await Task.sleep(for: .nanoseconds(configuration.observation.nanoseconds / 2))
        try await sender.send(datagrams.alive(usn: usn, location: busy.url))
        try await Task.sleep(for: .nanoseconds((wait + configuration.observation).nanoseconds))
        judgeBusy(run, busy, started: started)
    }

    /// The judgement of the busy case once the watch is over: when, after the `503`, it fetched again [SSDP-6.10].
    func judgeBusy(_ run: ConformanceRun, _ busy: ScriptedLocation, started: NIODeadline) {
        let wait = TimeAmount.seconds(Int64(Self.busyRetryAfterSeconds))
        let times = busy.fetchTimes
        let expected = "no fetch within \(Self.busyRetryAfterSeconds) s of the 503"
        guard let first = times.first else {
            run.record(Cases.busyWaited, .inconclusive, expected: expected, actual: "never fetched", started: started)
            return
        }
        guard times.count > 1 else {
            run.record(Cases.busyWaited, .pass, expected: expected, actual: "no second fetch within \(PeerConformance.text(wait + configuration.observation))",
                       started: started)
            return
        }
        let after = times[1] - first
        run.grade(Cases.busyWaited, holds: after >= wait, expected: expected,
                  actual: "fetched again \(after.nanoseconds / 1_000_000) ms after the 503", started: started)
    }

    /// Announcements for the implementation from a contact, served on a port that also speaks PSK-TLS: a
    /// tampered one (no connection may follow), a good one (a session must), then the good one again from
    /// the same location under a new USN (a replay: no connection may follow).
    func beaconCases(_ run: ConformanceRun, announcer: Announcer) async throws {
        guard let (peer, identity) = configuration.keys else {
            for testCase in Cases.beacons {
                run.record(testCase, .notApplicable, expected: testCase.title, actual: "no keys (--peer-key and --identity)")
            }
            return
        }
        let server = try await PeerSuiteServer.start(host: configuration.address, peer: peer, limits: DeliveryLimits(), group: group)
        var watch = ServerWatch(server: server)
        do {
            let generator = BeaconGenerator(identity: identity)
            let good = try generator.makeAnnouncement(for: [peer], validity: .seconds(600))
            let other = try generator.makeAnnouncement(for: [peer], validity: .seconds(600))
            var flipped = other.stream
            flipped[other.profile.preambleLength + BeaconWire.flagLength - 1] ^= 0x01  // the last byte of its beacon's flag (the GCM tag)
            let tampered = BeaconAnnouncement(profile: other.profile, stream: flipped, expiration: other.expiration, beacons: other.beacons)
            var started = NIODeadline.now()
            server.serve(tampered)
            try await announcer.announce(server.port, { server.fetchCount })
            let tamperedSeen = try await watch.observe(for: configuration.observation)
            server.serve(try Self.strangerFirst(for: peer, identity: identity))
            try await announcer.announce(server.port, { server.fetchCount })
            let strangerSeen = try await watch.observe(for: configuration.observation)
            started = NIODeadline.now()
            server.serve(good)
            try await announcer.announce(server.port, { server.fetchCount })
            let connected = try await watch.untilSession(within: configuration.observation)
            run.grade(Cases.matchConnects, holds: connected.session && connected.welcomed,
                      expected: "a fetch, then a PSK-TLS session without ALPN whose delivery stream welcomes our hello",
                      actual: connected.description + (connected.session && !connected.welcomed ? ", no welcome to our hello" : ""), started: started)
            guard connected.session else {
                for testCase in [Cases.tamperedNoConnect, Cases.strangerFirstNoConnect, Cases.closeNotifyFirst, Cases.replayNoConnect,
                                 Cases.smallGroupRefused] + Cases.marking {
                    run.record(testCase, .inconclusive, expected: testCase.title, actual: "a good announcement led to no session either")
                }
                await server.close()
                return
            }
            try await gradeClosing(run, connected: connected, watch: &watch)
            for (testCase, seen) in [(Cases.tamperedNoConnect, tamperedSeen), (Cases.strangerFirstNoConnect, strangerSeen)] {
                run.grade(testCase, holds: seen.fetches > 0 && seen.connections == 0,
                          expected: "a fetch and no connection within \(PeerConformance.text(configuration.observation))", actual: seen.description)
            }
            started = NIODeadline.now()
            if announcer.replayWait == nil { try await announcer.announce(server.port, { server.fetchCount }) }
            let replayPeriod = announcer.replayWait ?? configuration.observation
            let replayed = try await watch.observe(for: replayPeriod)
            let expected = (announcer.replayWait == nil ? "" : "over the same link, ")
                + "a fetch and no connection within \(PeerConformance.text(replayPeriod))"
            if replayed.fetches == 0 {
                run.record(Cases.replayNoConnect, .inconclusive, expected: expected, actual: replayed.description, started: started)
            } else {
                run.grade(Cases.replayNoConnect, holds: replayed.connections == 0, expected: expected, actual: replayed.description, started: started)
            }
            if try await marking(run, server: server, watch: &watch, generator: generator, peer: peer, announcer: announcer) {
                try await refusal(run, server: server, watch: &watch, announcement: try generator.makeAnnouncement(for: [peer], validity: .seconds(600)),
                                  announcer: announcer)
            }
        } catch {
            await server.close()
            throw error
        }
        await server.close()
        try await smallGroup(run, announcer: announcer, peer: peer, identity: identity)
    }

    /// How the session of match-connects ended, waiting up to an observation period for its end: its
    /// close_notify first passes, a bare TCP close fails [PSK-6.1]; a session still open, or one we
    /// closed first, says nothing of how it closes.
    private func gradeClosing(_ run: ConformanceRun, connected: ServerWatch.Seen, watch: inout ServerWatch) async throws {
        let started = NIODeadline.now()
        let ended = connected.ended.isEmpty ? try await watch.untilSessionEnds(within: configuration.observation).ended : connected.ended
        let expected = "its close_notify, then the TCP close"
        guard let end = ended.first else {
            run.record(Cases.closeNotifyFirst, .inconclusive, expected: expected,
                       actual: "the session was still open \(PeerConformance.text(configuration.observation)) after delivery ended", started: started)
            return
        }
        switch end {
        case .closeNotify, .bareClose:
            run.grade(Cases.closeNotifyFirst, holds: end == .closeNotify, expected: expected, actual: end.description, started: started)
        case .closedBySuite, .failed:
            run.record(Cases.closeNotifyFirst, .inconclusive, expected: expected, actual: end.description, started: started)
        }
    }

    /// Our server now selects `thali-streams/1` (the sessions before were unmarked): a new announcement
    /// for it, and the header of the delivery stream it opens on the new session, and whether it read our
    /// status. Returns whether its sessions are marked (else the marking cases are UNSUPPORTED).
    private func marking(_ run: ConformanceRun, server: PeerSuiteServer, watch: inout ServerWatch, generator: BeaconGenerator,
                         peer: PublicKey, announcer: Announcer) async throws -> Bool {
        server.mark(.acceptDelivery)
        server.serve(try generator.makeAnnouncement(for: [peer], validity: .seconds(600)))
        try await announcer.announce(server.port, { server.fetchCount })
        let connected = try await watch.untilSession(within: configuration.observation)
        guard connected.session else {
            run.recordRemaining(Cases.marking, .inconclusive, because: "a new announcement led to no session: \(connected)")
            return false
        }
        guard connected.markedSessions > 0 else {
            run.recordRemaining(Cases.marking, .unsupported, because: "it offered no \(StreamHeader.alpnProtocol): its sessions are unmarked")
            return false
        }
        guard let (header, status) = connected.headers.first else {
            run.recordRemaining(Cases.marking, .fail, because: "a marked session, and no marked stream: \(connected)")
            return false
        }
        run.grade(Cases.deliveryHeader, holds: header == .kind(.delivery), expected: "header delivery (08 64 65 6c 69 76 65 72 79)",
                  actual: header.description)
        let welcomed = status == .accepted && connected.welcomed
        run.grade(Cases.statusRead, holds: welcomed, expected: "after our status 0 and hello, its welcome",
                  actual: status != .accepted ? "we refused its stream: \(status)" : welcomed ? "welcome" : "no welcome: the stream failed or ended")
        return true
    }

    /// A new announcement for it, and every marked stream of its sessions refused (not-served): each is
    /// closed by it, none opened again on its session, and the sessions over ``TargetConformanceConfiguration/observation``
    /// stay within ``TargetConformanceConfiguration/maxConnectionsAfterRefusal`` [NODE-4.7].
    private func refusal(_ run: ConformanceRun, server: PeerSuiteServer, watch: inout ServerWatch, announcement: BeaconAnnouncement,
                         announcer: Announcer) async throws {
        let started = NIODeadline.now()
        server.mark(.refuse(StreamRefusal(.notServed, reason: "refused on purpose by the conformance suite")))
        server.serve(announcement)
        try await announcer.announce(server.port, { server.fetchCount })
        let seen = try await watch.observe(for: configuration.observation)
        let expected = "the refused streams closed by it, at most one per session, at most \(configuration.maxConnectionsAfterRefusal) connections "
            + "within \(PeerConformance.text(configuration.observation))"
        guard seen.refused > 0 else {
            run.record(Cases.refusalNotRetried, .inconclusive, expected: expected, actual: seen.description, started: started)
            return
        }
        run.grade(Cases.refusalNotRetried, holds: seen.refusedEnded + 1 >= seen.refused && seen.refused <= seen.markedSessions
                    && seen.connections <= configuration.maxConnectionsAfterRefusal,
                  expected: expected, actual: seen.description, started: started)
    }

    /// A good announcement for it on a location whose TLS side offers a 1536-bit group: the client must
    /// refuse it at the ServerKeyExchange [PSK-2.3]. The server's flight is written by hand (no TLS
    /// library would offer the group); nothing after it is needed, since a conforming client stops there.
    private func smallGroup(_ run: ConformanceRun, announcer: Announcer, peer: PublicKey, identity: PrivateKey) async throws {
        let started = NIODeadline.now()
        let announcement = try BeaconGenerator(identity: identity).makeAnnouncement(for: [peer], validity: .seconds(600))
        let location = try await ScriptedLocation.start(host: configuration.address, body: announcement.stream,
                                                        tlsFlight: SmallGroupFlight.bytes(), group: group)
        defer { location.close() }
        try await announcer.announce(location.port, { location.fetches })
        try await Task.sleep(for: .nanoseconds(configuration.observation.nanoseconds))
        let replies = location.tlsReplies
        let expected = "a fatal handshake_failure alert after our ServerKeyExchange"
        guard let first = replies.first else {
            run.record(Cases.smallGroupRefused, .inconclusive, expected: expected,
                       actual: "\(location.fetches) fetch(es), no TLS connection", started: started)
            return
        }
        let verdict: ConformanceVerdict
        switch first {
        case .alert(2, 40): verdict = .pass
        case .alert, .closed: verdict = .warn  // refused, but not with the specified alert
        case .continued: verdict = .fail
        }
        run.record(Cases.smallGroupRefused, verdict, expected: expected,
                   actual: "\(replies.count) connection(s): " + replies.map(\.description).reduce(into: [String]()) { kinds, reply in
                       if !kinds.contains(reply) { kinds.append(reply) }
                   }.joined(separator: "; "), started: started)
    }
}

/// The server's first flight offering a 1536-bit DH group (RFC 3526 group 5) for TLS_DHE_PSK_WITH_AES_256_GCM_SHA384:
/// ServerHello (with an empty renegotiation_info, which OpenSSL clients require), ServerKeyExchange (an
/// empty identity hint, p, g = 2, a Ys), ServerHelloDone, in one record.
enum SmallGroupFlight {
    static let prime: [UInt8] = {
        let hex = Array("""
            FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A08798E3404DD\
            EF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B0BFF5CB6F406B7ED\
            EE386BFB5A899FA5AE9F24117C4B1FE649286651ECE45B3DC2007CB8A163BF0598DA48361C55D39A69163FA8FD24CF5F\
            83655D23DCA3AD961C62F356208552BB9ED529077096966D670C354E4ABC9804F1746C08CA237327FFFFFFFFFFFFFFFF
            """)
        return stride(from: 0, to: hex.count, by: 2).map { UInt8(String(hex[$0...$0 + 1]), radix: 16) ?? 0 }
    }()

    static func bytes() -> [UInt8] {
        func vector16(_ bytes: [UInt8]) -> [UInt8] { [UInt8(bytes.count >> 8), UInt8(bytes.count & 0xFF)] + bytes }
        func handshake(_ type: UInt8, _ body: [UInt8]) -> [UInt8] {
            [type, 0, UInt8(body.count >> 8), UInt8(body.count & 0xFF)] + body
        }
        let random = (0..<32).map { _ in UInt8.random(in: .min ... .max) }
        let extensions: [UInt8] = [0xFF, 0x01, 0x00, 0x01, 0x00]
        let hello = [0x03, 0x03] + random + [0x00, 0x00, 0xAB, 0x00] + vector16(extensions)
        // Ys = 4, a square, so in the prime-order subgroup that OpenSSL checks before the group's size; the
        // client refuses before it would need our private value.
        let exchange = vector16([]) + vector16(prime) + vector16([2]) + vector16([4])
        let body = handshake(2, hello) + handshake(12, exchange) + handshake(14, [])
        return [0x16, 0x03, 0x03, UInt8(body.count >> 8), UInt8(body.count & 0xFF)] + body
    }
}

/// What a client answered to a scripted TLS flight.
enum TLSReply: Sendable, Equatable, CustomStringConvertible {
    /// An alert record: level and description.
    case alert(UInt8, UInt8)
    /// It closed without a record.
    case closed
    /// It went on with a handshake record (a ClientKeyExchange).
    case continued
    var description: String {
        switch self {
        case .alert(let level, let code): "alert level \(level) code \(code)\(code == 40 ? " (handshake_failure)" : "")"
        case .closed: "closed without an alert"
        case .continued: "went on with a handshake record (ClientKeyExchange)"
        }
    }
}

extension TargetConformance {
    /// One announcement, under one ephemeral key, of two beacons for `peer`: the first from a stranger
    /// (its flag verifies for `peer`, naming a KeyId it does not know), the second from `identity`.
    static func strangerFirst(for peer: PublicKey, identity: PrivateKey) throws -> BeaconAnnouncement {
        let ephemeralKey = PrivateKey()
        let expiration = DeliveryClock.nowMilliseconds + 600_000
        let stranger = try BeaconGenerator(identity: PrivateKey()).makeAnnouncement(for: [peer], expiration: expiration, ephemeralKey: ephemeralKey)
        let ours = try BeaconGenerator(identity: identity).makeAnnouncement(for: [peer], expiration: expiration, ephemeralKey: ephemeralKey)
        // Both streams share the preamble (ephemeral key, expiration); a beacon's PSK identity depends only
        // on the preamble and its own bytes, so ours keeps its identity and PSK at index 1.
        let preamble = ours.profile.preambleLength
        return BeaconAnnouncement(profile: ours.profile, stream: stranger.stream + ours.stream[preamble...], expiration: expiration,
                                  beacons: stranger.beacons + ours.beacons)
    }
}

/// Reads a ``PeerSuiteServer``'s events for target mode: counts fetches and connection attempts over a
/// period, or waits for a session (and plays the sender on it: hello, welcome, done).
struct ServerWatch {
    /// What the implementation did in one period.
    struct Seen: CustomStringConvertible {
        var fetches = 0
        /// PSK-TLS handshakes, authenticated or failed.
        var connections = 0
        /// Authenticated sessions that agreed on `thali-streams/1`.
        var markedSessions = 0
        var session = false
        /// Whether a delivery session answered our hello with its welcome.
        var welcomed = false
        /// The headers of the marked streams it opened, with our answers.
        var headers: [(MarkedStreamAcceptor.Header, StreamStatus)] = []
        /// Marked streams we refused that it closed.
        var refusedEnded = 0
        /// How its authenticated sessions ended, in order.
        var ended: [SessionEnd] = []
        var refused: Int { headers.count { if case .refused = $0.1 { true } else { false } } }
        var description: String {
            "\(fetches) fetch(es), \(connections) connection(s)" + (markedSessions > 0 ? " (\(markedSessions) marked)" : "")
                + (session ? ", a session" : "") + (refused > 0 ? ", \(refused) stream(s) refused, \(refusedEnded) closed by it" : "")
        }
    }

    let server: PeerSuiteServer
    private var events: AsyncStream<PeerSuiteServer.Event>.AsyncIterator
    private var wakes = 0

    init(server: PeerSuiteServer) {
        self.server = server
        events = server.events.makeAsyncIterator()
    }

    /// Everything that happens in `period` (a connection here is what a negative case looks for, so the
    /// whole period is watched).
    mutating func observe(for period: TimeAmount) async throws -> Seen {
        try await watch(period) { _ in false }
    }

    /// Waits until a session is authenticated and its delivery stream ends, or `timeout` passes.
    mutating func untilSession(within timeout: TimeAmount) async throws -> Seen {
        try await watch(timeout) { $0.session }
    }

    /// Waits until an authenticated session's connection closes, or `timeout` passes.
    mutating func untilSessionEnds(within timeout: TimeAmount) async throws -> Seen {
        try await watch(timeout) { !$0.ended.isEmpty }
    }

    private mutating func watch(_ period: TimeAmount, until done: (Seen) -> Bool) async throws -> Seen {
        wakes += 1
        let wake = wakes
        server.wake(after: period, id: wake)
        var seen = Seen()
        while let event = await events.next() {
            switch event {
            case .beaconsFetched: seen.fetches += 1
            case .authenticated(let marked):
                seen.connections += 1
                if marked { seen.markedSessions += 1 }
            case .handshakeFailed: seen.connections += 1
            case .markedStream(let header, let status):
                seen.headers.append((header, status))
            case .refusedStreamEnded:
                seen.refusedEnded += 1
            case .sessionEnded(let end):
                seen.ended.append(end)
            case .stream(let frames):
                seen.welcomed = await Self.finishSession(frames)
                seen.session = true
            case .wake(let id) where id == wake: return seen
            case .wake: break
            }
            if done(seen) { return seen }
        }
        return seen
    }

    /// Plays a sender with nothing to send: hello, its welcome, done, then the end of the stream. Returns
    /// whether the welcome came.
    static func finishSession(_ frames: DeliveryChannel.AsyncFrames) async -> Bool {
        var welcomed = false
        try? await frames.executeThenClose { inbound, outbound in
            var iterator = inbound.makeAsyncIterator()
            try await outbound.write(.hello(version: DeliveryFrame.protocolVersion))
            guard case .welcome? = try await iterator.next() else { return }
            welcomed = true
            try await outbound.write(.done)
            while try await iterator.next() != nil {}
        }
        return welcomed
    }
}

/// The datagrams target mode sends, written out byte for byte (some deliberately broken).
struct TargetDatagrams {
    /// The `HOST` header: group:port.
    let host: String

    func alive(nt: String = ThaliServiceName.notificationType, usn: String, location: String, maxAge: Int = 30) -> [UInt8] {
        Array(("NOTIFY * HTTP/1.1\r\nHOST: \(host)\r\nCACHE-CONTROL: max-age=\(maxAge)\r\nLOCATION: \(location)\r\nNT: \(nt)\r\n"
               + "NTS: ssdp:alive\r\nUSN: \(usn)\r\n\r\n").utf8)
    }

    func byebye(usn: String) -> [UInt8] {
        Array("NOTIFY * HTTP/1.1\r\nHOST: \(host)\r\nNT: \(ThaliServiceName.notificationType)\r\nNTS: ssdp:byebye\r\nUSN: \(usn)\r\n\r\n".utf8)
    }

    /// Alives that break spec/ssdp.md §3 one rule each, all naming `location`, each with a fresh USN.
    func malformedAlives(location: String) -> [[UInt8]] {
        let nt = ThaliServiceName.notificationType
        func usn() -> String { ThaliServiceName.makeUniqueServiceName() }
        let good = { (usn: String) in
            ["HOST: \(host)", "CACHE-CONTROL: max-age=30", "LOCATION: \(location)", "NT: \(nt)", "NTS: ssdp:alive", "USN: \(usn)"]
        }
        func datagram(_ start: String, _ lines: [String], ending: String = "\r\n", trailer: String = "") -> [UInt8] {
            Array((([start] + lines).map { $0 + ending }.joined() + ending + trailer).utf8)
        }
        return [
            datagram("NOTIFY * HTTP/1.0", good(usn())),
            datagram("NOTIFY * HTTP/1.1", good(usn()), ending: "\n"),
            datagram("NOTIFY * HTTP/1.1", good(usn()) + ["NT: \(nt)"]),
            datagram("NOTIFY * HTTP/1.1", good(usn()).map { $0 == "NTS: ssdp:alive" ? "NTS: ssdp:update" : $0 }),
            datagram("NOTIFY * HTTP/1.1", good(usn()).map { $0.hasPrefix("CACHE-CONTROL") ? "CACHE-CONTROL: no-cache" : $0 }),
            datagram("NOTIFY * HTTP/1.1", good(usn()).map { $0.hasPrefix("NT:") ? "NT:\r\n \(nt)" : $0 }),
            datagram("NOTIFY * HTTP/1.1", good(usn()), trailer: "tail"),
        ]
    }
}

/// A beacon location of the script: answers `GET /NotificationBeacons` with its body and counts the
/// fetches; any other connection (a TLS ClientHello, anything not HTTP) is counted and closed.
final class ScriptedLocation: Sendable {
    private let channel: Channel
    private let counts: NIOLockedValueBox<(fetches: Int, other: Int)>
    private let replies: NIOLockedValueBox<[TLSReply]>
    private let times: NIOLockedValueBox<[NIODeadline]>
    /// The LOCATION naming it.
    let url: String

    /// How many beacon requests have their time kept (``fetchTimes``).
    static let maxRecordedFetchTimes = 64

    /// The longest request head read before the connection is closed.
    static let maxRequestBytes = 8 * 1024

    private init(channel: Channel, counts: NIOLockedValueBox<(fetches: Int, other: Int)>, replies: NIOLockedValueBox<[TLSReply]>,
                 times: NIOLockedValueBox<[NIODeadline]>, url: String) {
        self.times = times
        self.channel = channel
        self.counts = counts
        self.replies = replies
        self.url = url
    }

    /// With a TLS flight: what each TLS client answered to it, in order.
    var tlsReplies: [TLSReply] { replies.withLockedValue { $0 } }

    /// The port it listens on.
    var port: Int { channel.localAddress?.port ?? 0 }

    /// Beacon requests answered.
    var fetches: Int { counts.withLockedValue { $0.fetches } }
    /// Connections that were not a beacon request.
    var otherConnections: Int { counts.withLockedValue { $0.other } }
    /// When each beacon request came (the first ``maxRecordedFetchTimes``).
    var fetchTimes: [NIODeadline] { times.withLockedValue { $0 } }

    /// Listens on `host`; with `tlsFlight`, a connection that starts with a TLS record gets those bytes
    /// after its first record, and what it answers is recorded (``tlsReplies``). With `busyRetryAfter`, the
    /// first beacon request is answered `503` with that `Retry-After` (seconds), the later ones as usual.
    static func start(host: String, body: [UInt8], tlsFlight: [UInt8]? = nil, busyRetryAfter: Int? = nil,
                      group: EventLoopGroup) async throws -> ScriptedLocation {
        let counts = NIOLockedValueBox((fetches: 0, other: 0))
        let replies = NIOLockedValueBox<[TLSReply]>([])
        let times = NIOLockedValueBox<[NIODeadline]>([])
        let channel = try await ServerBootstrap(group: group)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(ScriptedLocationHandler(body: body, counts: counts, tlsFlight: tlsFlight,
                                                                                           replies: replies, times: times,
                                                                                           busyRetryAfter: busyRetryAfter))
                }
            }
            .bind(host: host, port: 0).get()
        return ScriptedLocation(channel: channel, counts: counts, replies: replies, times: times,
                                url: "http://\(host):\(channel.localAddress?.port ?? 0)/")
    }

    func close() { channel.close(promise: nil) }
}

/// Reads a request head (bounded), answers a beacon GET, counts the rest; only moves bytes.
private final class ScriptedLocationHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    private let body: [UInt8]
    private let counts: NIOLockedValueBox<(fetches: Int, other: Int)>
    private let tlsFlight: [UInt8]?
    private let replies: NIOLockedValueBox<[TLSReply]>
    private let times: NIOLockedValueBox<[NIODeadline]>
    private let busyRetryAfter: Int?
    private var head: [UInt8] = []
    private var done = false
    private var flightSent = false

    init(body: [UInt8], counts: NIOLockedValueBox<(fetches: Int, other: Int)>, tlsFlight: [UInt8]?, replies: NIOLockedValueBox<[TLSReply]>,
         times: NIOLockedValueBox<[NIODeadline]>, busyRetryAfter: Int?) {
        self.times = times
        self.busyRetryAfter = busyRetryAfter
        self.body = body
        self.counts = counts
        self.tlsFlight = tlsFlight
        self.replies = replies
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !done else { return }
        head += unwrapInboundIn(data).readableBytesView
        if let tlsFlight, head.first == 0x16 || flightSent {
            scriptTLS(context, flight: tlsFlight)
        } else if head.first != UInt8(ascii: "G") || head.count > ScriptedLocation.maxRequestBytes {
            finish(context, fetch: false)
        } else if head.count >= 4, head.suffix(4) == Array("\r\n\r\n".utf8) {
            let isBeaconRequest = head.starts(with: Array("GET /NotificationBeacons ".utf8))
            if isBeaconRequest {
                let first = times.withLockedValue { times in
                    defer { if times.count < ScriptedLocation.maxRecordedFetchTimes { times.append(.now()) } }
                    return times.isEmpty
                }
                var response: ByteBuffer
                if let busyRetryAfter, first {
                    response = context.channel.allocator.buffer(
                        string: "HTTP/1.1 503 Service Unavailable\r\nRetry-After: \(busyRetryAfter)\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                } else {
                    response = context.channel.allocator.buffer(
                        string: "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: \(body.count)\r\nConnection: close\r\n\r\n")
                    response.writeBytes(body)
                }
                context.writeAndFlush(wrapOutboundOut(response), promise: nil)
            }
            finish(context, fetch: isBeaconRequest)
        }
    }

    /// Answers the client's first record with `flight`, then records the first record it sends back.
    private func scriptTLS(_ context: ChannelHandlerContext, flight: [UInt8]) {
        guard head.count >= 5, head.count <= ScriptedLocation.maxRequestBytes else {
            if head.count > ScriptedLocation.maxRequestBytes { finish(context, fetch: false) }
            return
        }
        let length = 5 + Int(head[3]) << 8 + Int(head[4])
        guard head.count >= length else { return }
        if !flightSent {
            flightSent = true
            head.removeFirst(length)
            context.writeAndFlush(wrapOutboundOut(context.channel.allocator.buffer(bytes: flight)), promise: nil)
            if head.count >= 5 { scriptTLS(context, flight: flight) }
            return
        }
        let reply: TLSReply = head[0] == 0x15 && length >= 7 ? .alert(head[5], head[6]) : .continued
        replies.withLockedValue { $0.append(reply) }
        finish(context, fetch: false)
    }

    func channelInactive(context: ChannelHandlerContext) {
        if flightSent && !done {
            done = true
            replies.withLockedValue { $0.append(.closed) }
        }
        context.fireChannelInactive()
    }

    private func finish(_ context: ChannelHandlerContext, fetch: Bool) {
        done = true
        counts.withLockedValue { fetch ? ($0.fetches += 1) : ($0.other += 1) }
        context.close(promise: nil)
    }
}

/// A UDP socket that multicasts datagrams to the SSDP group from one address.
final class MulticastSender: Sendable {
    private let channel: Channel
    private let destination: SocketAddress

    private init(channel: Channel, destination: SocketAddress) {
        self.channel = channel
        self.destination = destination
    }

    /// Binds to `address` and multicasts on the interface that has `multicastInterface` (default: `address`).
    static func start(address: String, multicastInterface: String? = nil, group: String, port: Int,
                      on eventLoopGroup: EventLoopGroup) async throws -> MulticastSender {
        guard case .v4(let interface) = try SocketAddress(ipAddress: multicastInterface ?? address, port: 0) else {
            throw SocketAddressError.failedToParseIPString(multicastInterface ?? address)
        }
        let channel = try await DatagramBootstrap(group: eventLoopGroup).bind(host: address, port: 0).get()
        if let options = channel as? SocketOptionProvider {
            try await options.setIPMulticastIF(interface.address.sin_addr).get()
            try await options.setIPMulticastLoop(1).get()
        }
        return MulticastSender(channel: channel, destination: try SocketAddress(ipAddress: group, port: port))
    }

    func send(_ bytes: [UInt8]) async throws {
        try await channel.writeAndFlush(AddressedEnvelope(remoteAddress: destination, data: channel.allocator.buffer(bytes: bytes)))
    }

    /// The address its datagrams come from.
    var localAddress: SocketAddress? { channel.localAddress }

    func close() { channel.close(promise: nil) }
}
