import NIOCore
import ThaliSSDP

extension PeerConformance.Cases {
    /// `peer/ssdp/multicast-ttl`: its multicast alives carry IP TTL 2.
    public static let multicastTTL = ConformanceCase("peer/ssdp/multicast-ttl",
                                                     "its multicast alives carry IP TTL 2 (read on the link they were sent on, where no router lowers it)",
                                                     ["SSDP-1.2"])
}

extension PeerConformance {
    /// How long the suite listens for the implementation's alives to read their TTL: a peer in the
    /// foreground announces every 500 ms (spec/ssdp.md §4), so 3 s hears several.
    static let multicastTTLWait: TimeAmount = .seconds(3)

    /// Reads the TTL of the implementation's alives as they arrive on the group [SSDP-1.2]: on the same link
    /// it is the TTL they were sent with. Run while it still announces for us (before we receive).
    func gradeMulticastTTL(_ run: ConformanceRun, location: BeaconLocation) async {
        let testCase = Cases.multicastTTL
        let expected = "IP TTL 2 on every alive naming \(location)"
        guard configuration.location == nil else {
            run.record(testCase, .notApplicable, expected: expected, actual: ssdpNotUsed)
            return
        }
        let started = NIODeadline.now()
        let (group, port, interface, wait) = (configuration.ssdpGroup, configuration.ssdpPort, configuration.address, Self.multicastTTLWait)
        let result = await Task.detached {
            Result { try MulticastTTLProbe.listen(group: group, port: port, interface: interface, location: location, duration: wait) }
        }.value
        switch result {
        case .failure(let error):
            run.record(testCase, .inconclusive, expected: expected, actual: "cannot listen on \(group):\(port): \(error)", started: started)
        case .success(let heard) where heard.ttls.isEmpty:
            run.record(testCase, .inconclusive, expected: expected,
                       actual: "no alive naming it within \(Self.text(wait)) (\(heard.datagrams) datagrams on the group)", started: started)
        case .success(let heard):
            run.grade(testCase, holds: heard.ttls.allSatisfy { $0 == 2 }, expected: expected,
                      actual: "TTL \(heard.ttls.map(String.init).joined(separator: ", ")) on \(heard.ttls.count) alive(s)", started: started)
        }
    }
}
