import ThaliSSDP

extension PeerConformance.Cases {
    /// `peer/ssdp/own-alives-dropped`: the implementation does not discover itself from its own alives.
    public static let ownAlivesDropped = ConformanceCase("peer/ssdp/own-alives-dropped",
                                                         "its own alives, heard back through multicast loopback, are dropped: its events report the suite found and itself never",
                                                         ["SSDP-3.3"])
}

extension PeerConformance {
    /// Whether the implementation took its own alives for a peer's [SSDP-3.3]: the datagrams loop back to
    /// its own socket (ours set `IP_MULTICAST_LOOP`, and on one host every peer shares the group), and
    /// only its own reports show what it made of them. The adapter's `peer_appeared` events over the run
    /// must name the suite's location (the control: its reports of discoveries reach us) and never its own.
    func gradeOwnAlivesDropped(_ run: ConformanceRun, events: AdapterEventFollower?, own: BeaconLocation, suite: BeaconLocation) {
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
        func names(_ location: BeaconLocation, _ event: AdapterEvent) -> Bool {
            guard event.event == "peer_appeared", let text = event.location, let found = BeaconLocation(parsing: text) else { return false }
            return found.host == location.host && found.port == location.port
        }
        let appeared = events.events(after: 0)
        let ownSeen = appeared.filter { names(own, $0) }.count
        if ownSeen > 0 {
            run.grade(testCase, holds: false, expected: expected, actual: "\(ownSeen) `peer_appeared` for its own location")
        } else if appeared.contains(where: { names(suite, $0) }) {
            run.grade(testCase, holds: true, expected: expected, actual: "the suite appeared; its own location never did")
        } else {
            run.record(testCase, .notApplicable, expected: expected,
                       actual: "its events report no `peer_appeared` for the suite either, so they would not show its own")
        }
    }
}
