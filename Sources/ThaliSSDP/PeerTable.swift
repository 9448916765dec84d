import NIOCore
import ThaliAdmission

/// The peers discovery tracks, as a state machine with explicit inputs (alive, byebye, fetch results,
/// time) and outputs (`Action`s the service performs). No I/O, so tests drive it directly.
struct PeerTable {
    /// A tracked peer's lifecycle.
    enum State {
        /// Announcing; forgotten at `expiry` unless refreshed.
        case active(expiry: NIODeadline)
        /// Sent byebye; a new USN before `deadline` makes this a change instead of a departure.
        case departing(deadline: NIODeadline)
    }

    struct Entry {
        var peer: SSDPPeer
        var state: State
        /// Fetches of this location that failed in a row (whatever the USN); the wait before a refetch
        /// doubles with each.
        var fetchFailures = 0
        /// After a failed fetch: when the next alive of the same USN fetches it again.
        var refetchAt: NIODeadline?
    }

    /// What the service must do after an input.
    enum Action: Equatable {
        case emit(SSDPDiscoveryEvent)
        /// Fetch the beacons for this USN at this location.
        case fetch(BeaconLocation, serviceName: String)
        /// A new peer was refused because the table is full.
        case capExceeded
    }

    let maxPeers: Int
    let byebyeGrace: TimeAmount
    /// The wait after a failed fetch before the same USN is fetched again: from the first failure's
    /// delay, doubling per failure in a row up to its ceiling, without jitter (an alive paces it anyway).
    let refetchBackoff: Backoff
    private(set) var entries: [BeaconLocation: Entry] = [:]
    private var locationByServiceName: [String: BeaconLocation] = [:]

    init(maxPeers: Int, byebyeGrace: TimeAmount,
         refetchDelay: TimeAmount = SSDPDiscoveryLimits().failedFetchRetryDelay,
         maxRefetchDelay: TimeAmount = SSDPDiscoveryLimits().maxFailedFetchRetryDelay) {
        self.maxPeers = maxPeers
        self.byebyeGrace = byebyeGrace
        refetchBackoff = Backoff(base: Duration(refetchDelay), cap: Duration(maxRefetchDelay))
    }

    var count: Int { entries.count }
    var peers: [SSDPPeer] { entries.values.map(\.peer) }

    /// An alive announcement or a search answer. The same USN again is only a refresh, unless fetching
    /// its beacons failed and the wait since is over: then it is fetched again (a peer whose beacons do not
    /// change, holding an item for us, would otherwise stay unread).
    mutating func alive(serviceName: String, location: BeaconLocation, maxAge: Int, now: NIODeadline) -> [Action] {
        let expiry = now + .seconds(Int64(max(0, maxAge)))
        if let known = locationByServiceName[serviceName], known == location, var entry = entries[location] {
            entry.state = .active(expiry: expiry)
            defer { entries[location] = entry }
            guard entry.peer.beaconState == .failed, let due = entry.refetchAt, due <= now else { return [] }
            entry.peer.beaconState = .fetching
            entry.refetchAt = nil
            return [.fetch(location, serviceName: serviceName)]
        }
        if var entry = entries[location] {
            let previous = entry.peer.uniqueServiceName
            locationByServiceName[previous] = nil
            locationByServiceName[serviceName] = location
            entry.peer.uniqueServiceName = serviceName
            entry.peer.beaconState = .fetching
            entry.state = .active(expiry: expiry)
            entry.refetchAt = nil
            entries[location] = entry
            return [.emit(.changed(entry.peer, previousServiceName: previous)), .fetch(location, serviceName: serviceName)]
        }
        guard entries.count < maxPeers else { return [.capExceeded] }
        // A USN is unique to one location; if it moves, the old location's peer leaves.
        var actions: [Action] = []
        if let staleLocation = locationByServiceName[serviceName], let stale = entries.removeValue(forKey: staleLocation) {
            actions.append(.emit(.left(stale.peer, reason: .byebye)))
        }
        let peer = SSDPPeer(location: location, uniqueServiceName: serviceName, beaconState: .fetching)
        entries[location] = Entry(peer: peer, state: .active(expiry: expiry))
        locationByServiceName[serviceName] = location
        return actions + [.emit(.appeared(peer)), .fetch(location, serviceName: serviceName)]
    }

    /// A byebye from `source`: the peer departs unless a new USN arrives from it within the grace period.
    /// Only the peer's own address may say byebye for it, so a forged byebye cannot evict anyone.
    mutating func byebye(serviceName: String, source: String?, now: NIODeadline) -> [Action] {
        guard let location = locationByServiceName[serviceName], var entry = entries[location],
            location.host == source
        else { return [] }
        entry.state = .departing(deadline: now + byebyeGrace)
        entries[location] = entry
        return []
    }

    /// The result of fetching `serviceName`'s beacons at `now` (a fetch not made, its source ignored,
    /// is a failure too); ignored if the peer moved on to another USN. After a failure the USN is fetched
    /// again on an alive `refetchDelay` later, doubling per failure in a row up to `maxRefetchDelay`.
    mutating func fetched(serviceName: String, result: SSDPPeer.BeaconState, reason: String? = nil,
                          now: NIODeadline) -> [Action] {
        guard let location = locationByServiceName[serviceName], var entry = entries[location] else { return [] }
        defer { entries[location] = entry }
        entry.peer.beaconState = result
        if case .failed = result {
            entry.fetchFailures += 1
            entry.refetchAt = now + refetchWait(afterFailures: entry.fetchFailures)
            return [.emit(.beaconFetchFailed(entry.peer, reason: reason ?? "failed"))]
        }
        entry.fetchFailures = 0
        entry.refetchAt = nil
        return [.emit(.beaconsFetched(entry.peer))]
    }

    /// `refetchDelay` × 2^(failures − 1), at most `maxRefetchDelay`.
    func refetchWait(afterFailures failures: Int) -> TimeAmount {
        TimeAmount(refetchBackoff.nominalDelay(beforeRetry: failures))
    }

    /// Removes peers whose byebye grace or max-age ran out by `now`.
    mutating func expire(now: NIODeadline) -> [Action] {
        var actions: [Action] = []
        for (location, entry) in entries {
            let reason: SSDPDiscoveryEvent.DepartureReason?
            switch entry.state {
            case .active(let expiry): reason = expiry <= now ? .expired : nil
            case .departing(let deadline): reason = deadline <= now ? .byebye : nil
            }
            guard let reason else { continue }
            entries[location] = nil
            locationByServiceName[entry.peer.uniqueServiceName] = nil
            actions.append(.emit(.left(entry.peer, reason: reason)))
        }
        return actions
    }

    /// Forgets everyone (discovery stopped).
    mutating func removeAll() -> [Action] {
        let actions = entries.values.map { Action.emit(.left($0.peer, reason: .stopped)) }
        entries.removeAll()
        locationByServiceName.removeAll()
        return actions
    }

    /// Whether `serviceName` is the current USN of a tracked peer.
    func isCurrent(_ serviceName: String) -> Bool { locationByServiceName[serviceName] != nil }

    /// Whether a peer at `location` is tracked.
    func tracks(_ location: BeaconLocation) -> Bool { entries[location] != nil }

    /// Where the peer announcing `serviceName` is, if tracked.
    func location(of serviceName: String) -> BeaconLocation? { locationByServiceName[serviceName] }

    /// The USN the peer at `location` announces now, if tracked.
    func serviceName(at location: BeaconLocation) -> String? { entries[location]?.peer.uniqueServiceName }
}
