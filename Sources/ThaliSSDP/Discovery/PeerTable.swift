import NIOCore
import ThaliMutants
import ThaliSupport

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
        /// When the current USN's beacons were read: the order in which a full table gives up peers.
        var readSequence: Int?
    }

    /// What the service must do after an input.
    enum Action: Equatable {
        case emit(SSDPDiscoveryEvent)
        /// Fetch the beacons for this USN at this location.
        case fetch(BeaconLocation, serviceName: String)
        /// A new peer was refused because the table is full and no tracked peer's beacons are read yet
        /// (the ones being fetched keep their places).
        case capExceeded
        /// A new peer announced a USN whose beacons were read before its peer gave its place up: nothing
        /// new to read, so it is not tracked again.
        case alreadyRead
    }

    let maxPeers: Int
    let byebyeGrace: TimeAmount
    /// The wait after a failed fetch before the same USN is fetched again: from the first failure's
    /// delay, doubling per failure in a row up to its ceiling, without jitter (an alive paces it anyway).
    let refetchBackoff: Backoff
    private(set) var entries: [BeaconLocation: Entry] = [:]
    private var locationByServiceName: [String: BeaconLocation] = [:]
    /// Locations in the order their beacons were read, with the read's sequence number (an entry read
    /// again since, or gone, is skipped): the front is the peer a full table gives up first.
    private var readOrder: [(location: BeaconLocation, sequence: Int)] = []
    private var readOrderStart = 0
    private var nextReadSequence = 0
    /// The USNs of peers given up after their beacons were read, at most `maxRememberedReadPeers`.
    private var readServiceNames: BoundedHashMemory
    /// Source addresses whose beacons matched one of the app's contacts, the latest `maxContactSources`
    /// (oldest forgotten first): their peers keep their places in a full table, ahead of strangers.
    private var contactHosts: Set<String> = []
    private var contactHostOrder: [String] = []
    let maxContactSources: Int

    init(maxPeers: Int, byebyeGrace: TimeAmount,
         refetchDelay: TimeAmount = TimeAmount(SSDPDiscoveryLimits().failedFetchRetryDelay),
         maxRefetchDelay: TimeAmount = TimeAmount(SSDPDiscoveryLimits().maxFailedFetchRetryDelay),
         maxRememberedReadPeers: Int = SSDPDiscoveryLimits().maxRememberedReadPeers,
         maxContactSources: Int = SSDPDiscoveryLimits().maxContactSources) {
        self.maxPeers = maxPeers
        self.byebyeGrace = byebyeGrace
        refetchBackoff = Backoff(base: Duration(refetchDelay), cap: Duration(maxRefetchDelay))
        readServiceNames = BoundedHashMemory(capacity: maxRememberedReadPeers)
        self.maxContactSources = max(0, maxContactSources)
    }

    /// The beacons of a peer at `host` matched a contact: its peers are a contact's from now on.
    mutating func markContact(host: String) {
        guard maxContactSources > 0, contactHosts.insert(host).inserted else { return }
        contactHostOrder.append(host)
        if contactHostOrder.count > maxContactSources { contactHosts.remove(contactHostOrder.removeFirst()) }
    }

    /// Whether the peer at `location` is a contact's (its source matched one).
    func isContact(_ location: BeaconLocation) -> Bool { contactHosts.contains(location.host) }

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
        // Narrowing (spec/ssdp.md 7.2): a full table gives up the peer read longest ago for a new one, so
        // a crowd larger than the table is read a sample at a time; a USN already read is not tracked again.
        guard !readServiceNames.contains(serviceName) else { return [.alreadyRead] }
        var actions: [Action] = []
        if entries.count >= maxPeers {
            // Contacts first: a contact takes the place of a stranger still being fetched when no read
            // one is left; a stranger never takes a contact's.
            guard let evicted = evictReadLongestAgo() ?? (isContact(location) ? evictUnreadStranger() : nil) else {
                return [.capExceeded]
            }
            actions.append(.emit(.left(evicted.peer, reason: .narrowed)))
        }
        // A USN is unique to one location; if it moves, the old location's peer leaves.
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
    mutating func fetched(serviceName: String, result: SSDPPeer.BeaconState, failure: BeaconFetchFailure? = nil,
                          now: NIODeadline) -> [Action] {
        guard let location = locationByServiceName[serviceName], var entry = entries[location] else { return [] }
        defer { entries[location] = entry }
        entry.peer.beaconState = result
        if case .failed = result {
            entry.fetchFailures += 1
            entry.refetchAt = now + refetchWait(afterFailures: entry.fetchFailures)
            return [.emit(.beaconFetchFailed(entry.peer, failure ?? BeaconFetchFailure(.badResponse, "failed")))]
        }
        entry.fetchFailures = 0
        entry.refetchAt = nil
        entry.readSequence = nextReadSequence
        readOrder.append((location, nextReadSequence))
        nextReadSequence += 1
        compactReadOrder()
        return [.emit(.beaconsFetched(entry.peer))]
    }

    /// Removes and returns the stranger whose beacons were read longest ago (nil: none is read yet),
    /// remembering its USN as read. Contacts keep their places; their reads are passed over.
    private mutating func evictReadLongestAgo() -> Entry? {
        var contactsPassed: [(location: BeaconLocation, sequence: Int)] = []
        defer {
            // Their reads stay in the order, at its front, for when their source is forgotten as a contact.
            if !contactsPassed.isEmpty {
                readOrderStart -= contactsPassed.count
                for (offset, record) in contactsPassed.enumerated() { readOrder[readOrderStart + offset] = record }
            }
        }
        while readOrderStart < readOrder.count {
            let (location, sequence) = readOrder[readOrderStart]
            readOrderStart += 1
            guard let entry = entries[location], entry.readSequence == sequence,
                  case .fetched = entry.peer.beaconState else { continue }
            if isContact(location) {
                contactsPassed.append((location, sequence))
                continue
            }
            entries[location] = nil
            locationByServiceName[entry.peer.uniqueServiceName] = nil
            readServiceNames.insert(entry.peer.uniqueServiceName)
            return entry
        }
        return nil
    }

    /// Removes and returns a stranger not read yet (its fetch pending or failed), for a contact.
    private mutating func evictUnreadStranger() -> Entry? {
        guard let (location, entry) = entries.first(where: { location, entry in
            if case .fetched = entry.peer.beaconState { return false }
            return !isContact(location)
        }) else { return nil }
        entries[location] = nil
        locationByServiceName[entry.peer.uniqueServiceName] = nil
        return entry
    }

    /// Drops the consumed front of `readOrder`, and its stale records once they outnumber the table.
    private mutating func compactReadOrder() {
        guard readOrder.count > 2 * max(maxPeers, 16) else { return }
        readOrder = readOrder[readOrderStart...].filter { entries[$0.location]?.readSequence == $0.sequence }
        readOrderStart = 0
    }

    /// `refetchDelay` × 2^(failures − 1), at most `maxRefetchDelay`.
    func refetchWait(afterFailures failures: Int) -> TimeAmount {
        TimeAmount(refetchBackoff.nominalDelay(beforeRetry: failures))
    }

    /// Removes peers whose byebye grace or max-age ran out by `now`.
    /// A full table remembers the read USNs of the peers that expire as read too: in a hall whose alives
    /// are read a sample at a time, a read peer can go a max-age unheard and would be fetched again.
    mutating func expire(now: NIODeadline) -> [Action] {
        var actions: [Action] = []
        let narrowing = entries.count >= maxPeers
        for (location, entry) in entries {
            let reason: SSDPDiscoveryEvent.DepartureReason?
            switch entry.state {
            case .active(let expiry): reason = expiry <= now && !Mutant.ssdpNeverForgets.isActive ? .expired : nil
            case .departing(let deadline): reason = deadline <= now ? .byebye : nil
            }
            guard let reason else { continue }
            entries[location] = nil
            locationByServiceName[entry.peer.uniqueServiceName] = nil
            if narrowing, reason == .expired, case .fetched = entry.peer.beaconState {
                readServiceNames.insert(entry.peer.uniqueServiceName)
            }
            actions.append(.emit(.left(entry.peer, reason: reason)))
        }
        return actions
    }

    /// Forgets everyone (discovery stopped).
    mutating func removeAll() -> [Action] {
        let actions = entries.values.map { Action.emit(.left($0.peer, reason: .stopped)) }
        entries.removeAll()
        locationByServiceName.removeAll()
        readOrder.removeAll()
        readOrderStart = 0
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

/// A set of strings remembered by hash, holding the newest `capacity` (the oldest forgotten first): a
/// bounded memory of 16 bytes or so per string, whatever its length.
struct BoundedHashMemory {
    let capacity: Int
    private var members: Set<Int> = []
    private var order: [Int] = []
    private var next = 0

    init(capacity: Int) {
        self.capacity = max(0, capacity)
    }

    var count: Int { members.count }

    func contains(_ text: String) -> Bool { members.contains(text.hashValue) }

    mutating func insert(_ text: String) {
        guard capacity > 0 else { return }
        let hash = text.hashValue
        guard members.insert(hash).inserted else { return }
        if order.count < capacity {
            order.append(hash)
        } else {
            members.remove(order[next])
            order[next] = hash
            next = (next + 1) % capacity
        }
    }
}
