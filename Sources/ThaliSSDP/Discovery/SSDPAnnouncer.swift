import NIOCore
import ThaliMutants

/// What this peer announces, as a state machine: silent (nothing advertised), announcing a USN, or paused
/// (a limit fired) while keeping the USN it will resume with.
struct SSDPAnnouncer {
    enum State: Equatable {
        case silent
        case announcing(serviceName: String)
        case paused(serviceName: String, until: NIODeadline)
    }

    private(set) var state: State = .silent
    let configuration: SSDPDiscoveryConfiguration
    var location: BeaconLocation

    init(configuration: SSDPDiscoveryConfiguration, location: BeaconLocation) {
        self.configuration = configuration
        self.location = location
    }

    /// The USN currently ours, announced or paused.
    var serviceName: String? {
        switch state {
        case .silent: return nil
        case .announcing(let name), .paused(let name, _): return name
        }
    }

    /// New beacons (or none): returns the byebye for the old USN and the alive for the new, in send order.
    mutating func beaconsChanged(advertising: Bool) -> [SSDPMessage] {
        var messages: [SSDPMessage] = []
        if let old = serviceName, !Mutant.ssdpNoByebye.isActive { messages.append(byebye(old)) }
        guard advertising else {
            state = .silent
            return messages
        }
        let name = ThaliServiceName.makeUniqueServiceName()
        switch state {
        case .paused(_, let until): state = .paused(serviceName: name, until: until)
        case .silent, .announcing: state = .announcing(serviceName: name)
        }
        if case .announcing = state { messages.append(alive(name)) }
        return messages
    }

    /// The periodic alive, if announcing at `now` (a pause that ran out resumes here).
    mutating func tick(now: NIODeadline) -> SSDPMessage? {
        switch state {
        case .silent: return nil
        case .announcing(let name): return alive(name)
        case .paused(let name, let until):
            guard until <= now else { return nil }
            state = .announcing(serviceName: name)
            return alive(name)
        }
    }

    /// Stops announcing until `until`; returns the byebye that withdraws the current USN.
    mutating func pause(until: NIODeadline) -> SSDPMessage? {
        switch state {
        case .silent: return nil
        case .announcing(let name):
            state = .paused(serviceName: name, until: until)
            return byebye(name)
        case .paused(let name, let previous):
            state = .paused(serviceName: name, until: max(previous, until))
            return nil
        }
    }

    /// Clean shutdown: the byebye for the current USN.
    mutating func shutdown() -> SSDPMessage? {
        defer { state = .silent }
        return serviceName.map(byebye)
    }

    /// Whether M-SEARCHes should be answered now.
    var isAnnouncing: Bool { if case .announcing = state { return true } else { return false } }

    func alive(_ name: String) -> SSDPMessage {
        .notification(.alive(host: configuration.hostHeader, notificationType: configuration.notificationType,
                             uniqueServiceName: name, location: location.description, maxAge: configuration.maxAge,
                             server: configuration.server))
    }

    func byebye(_ name: String) -> SSDPMessage {
        .notification(.byebye(host: configuration.hostHeader, notificationType: configuration.notificationType,
                              uniqueServiceName: name))
    }

    /// The unicast answer to an M-SEARCH for `searchTarget`, if we announce now and the target is ours.
    func answer(to search: SSDPSearchRequest, date: String) -> SSDPMessage? {
        guard !Mutant.ssdpNoSearchAnswer.isActive, case .announcing(let name) = state,
            search.searchTarget == configuration.notificationType || search.searchTarget == SSDPSearchRequest.allTargets,
            search.searcherServiceName != name
        else { return nil }
        return .searchResponse(SSDPSearchResponse(
            maxAge: configuration.maxAge, date: date, location: location.description, server: configuration.server,
            searchTarget: configuration.notificationType, uniqueServiceName: name))
    }
}

/// When to search: on join, then never more often than `searchInterval`.
struct SSDPSearcher {
    let interval: TimeAmount
    private(set) var lastSearch: NIODeadline?

    init(interval: TimeAmount) { self.interval = interval }

    /// Whether a search may go out at `now`; records it if so.
    mutating func shouldSearch(now: NIODeadline) -> Bool {
        if let lastSearch, now - lastSearch < interval { return false }
        lastSearch = now
        return true
    }

    static func request(_ configuration: SSDPDiscoveryConfiguration, searcher: String?) -> SSDPMessage {
        .search(SSDPSearchRequest(host: configuration.hostHeader, maxWaitSeconds: configuration.searchMaxWait,
                                  searchTarget: configuration.notificationType, searcherServiceName: searcher,
                                  userAgent: configuration.server))
    }
}
