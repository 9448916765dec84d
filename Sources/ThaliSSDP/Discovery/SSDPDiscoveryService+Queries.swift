/// What an app reads of discovery: each a snapshot of the policy's state, taken on the service's loop.
extension SSDPDiscoveryService {
    /// The peers tracked now.
    public func peers() async -> [SSDPPeer] {
        await read([]) { $0.peers }
    }

    /// What discovery has counted so far.
    public func counters() async -> SSDPDiscoveryCounters {
        await read(SSDPDiscoveryCounters()) { $0.counters }
    }

    /// What the beacon server has counted so far.
    public var serverCounters: BeaconHTTPServerCounters { server.counters }

    /// Where this peer's beacons are served (port 0 before `start`).
    public func location() async -> BeaconLocation {
        await read(BeaconLocation(host: configuration.interfaceAddress, port: 0)) { $0.location }
    }

    /// This peer's current USN, if it advertises.
    public func uniqueServiceName() async -> String? {
        await read(nil) { $0.serviceName }
    }

    /// Whether discovery is currently switched off by a flood.
    public func isDiscoveryOff() async -> Bool {
        await read(false) { $0.isDiscoveryOff }
    }

    /// Whether announcements are currently paused by a limit.
    public func isAnnouncingPaused() async -> Bool {
        await read(false) { $0.isAnnouncingPaused }
    }
}
