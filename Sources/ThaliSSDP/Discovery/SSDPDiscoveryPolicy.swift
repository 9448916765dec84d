import Logging
import NIOCore

/// Discovery's policy as a value (`spec/ssdp.md` §4-7): what to announce and answer, which peers to
/// track, which beacons to fetch and when, and the limits that narrow discovery or switch part of it
/// off. Fed the service's inputs (datagrams with their source address, fetch outcomes, timers firing,
/// the app's calls), each with the time it happened; returns the ``Action``s the service turns into I/O.
/// It reads no clock and does no I/O, so tests drive it in virtual time. Randomness (the crowd spread of
/// fetches, the delay of search answers) comes from the generator it was made with.
///
/// Composed of smaller values: ``PeerTable`` (the peers), ``SSDPSourceBudgets`` (per source),
/// ``SSDPReadBudget`` (read and flood windows), ``SSDPNarrowingEpisodes``, ``SSDPUnicastFailureStreak``
/// (the last resort against blocked unicast), ``SSDPFetchQueue``, and ``SSDPAnnouncer``/``SSDPSearcher``.
/// Receiving is in `SSDPDiscoveryPolicy+Receiving.swift`, fetching in `SSDPDiscoveryPolicy+Fetching.swift`.
struct SSDPDiscoveryPolicy {
    /// What the service must do, in order.
    enum Action: Equatable {
        /// Report `event` on `SSDPDiscoveryService.events`.
        case emit(SSDPDiscoveryEvent)
        /// Send `message` from the unicast socket to `destination`, or to the group when nil.
        case send(SSDPMessage, to: SocketAddress?)
        /// Fetch the beacons of `serviceName` at the location. The fetch holds a slot: feed its outcome to
        /// ``fetchFinished(_:outcome:inboundUnicast:now:)``, then (after any delivery) ``fetchEnded(now:)``.
        case startFetch(BeaconLocation, serviceName: String)
        /// Hand the fetched beacons to the consumer, before the fetch's slot is given back.
        case deliver(SSDPPeer, [UInt8])
        /// Call ``timerFired(_:now:date:)`` with `timer` at `deadline`.
        case arm(Timer, at: NIODeadline)
        /// Stop reading both sockets (true), or read them again (false).
        case pauseReading(Bool)
        /// Close the multicast socket, so that the kernel drops the flood: discovery is off.
        case closeMulticast
        /// Open the multicast socket and join the group again; then call ``rejoined(now:)``.
        case rejoinGroup
        /// Log `message` at `level`.
        case log(Logger.Level, Logger.Message, Logger.Metadata)
    }

    /// The timers the policy arms, each firing once: a periodic tick (alive, search, housekeeping) arms
    /// its next one as it fires, so the service has one mechanism for time, and a test driver the same.
    enum Timer: Hashable {
        /// The periodic alive of arming `round`: a round armed since (a new rate, a move) makes it stale.
        case alive(round: UInt64)
        /// The periodic search (``searchDue(now:)``, sent if `searchInterval` allows).
        case search
        /// The housekeeping tick (``housekeeping(now:)``).
        case housekeeping
        /// The window of a read pause ended.
        case readingResumes
        /// The flood cool-down ended.
        case discoveryBackOn
        /// The random delay of the answer to `search` from `source` ended.
        case searchAnswer(SSDPSearchRequest, to: SocketAddress)
        /// The location's fetch waited out its crowd spread (or a busy answer's wait).
        case fetchSpreadEnds(BeaconLocation)
    }

    /// How a fetch ended, as the policy weighs it.
    enum FetchOutcome: Equatable {
        /// The beacons (empty for a 204).
        case fetched([UInt8])
        /// Every attempt failed.
        case failed(BeaconFetchFailure)
        /// The server answered busy: fetch it again after `retryAfter` (no failure).
        case busy(retryAfter: TimeAmount)

        /// The outcome of a client's fetch.
        init(_ result: Result<[UInt8], BeaconFetchError>) {
            switch result {
            case .success(let bytes): self = .fetched(bytes)
            case .failure(let error):
                if case .busy(let wait) = error.reason {
                    self = .busy(retryAfter: TimeAmount(wait))
                } else {
                    self = .failed(error.failure ?? BeaconFetchFailure(.badResponse, "\(error.reason)"))
                }
            }
        }
    }

    let configuration: SSDPDiscoveryConfiguration
    var limits: SSDPDiscoveryLimits { configuration.limits }
    var announcer: SSDPAnnouncer
    var searcher: SSDPSearcher
    var table: PeerTable
    var sources: SSDPSourceBudgets
    var readBudget: SSDPReadBudget
    var narrowing: SSDPNarrowingEpisodes
    var unicastFailures: SSDPUnicastFailureStreak
    var fetchQueue: SSDPFetchQueue
    /// What discovery has counted so far (sends are counted by the service as they leave, ``countSent(_:)``).
    var counters = SSDPDiscoveryCounters()
    /// Search answers waiting for their random delay (`maxPendingSearchResponses`).
    var pendingSearchAnswers = 0
    /// Whether discovery stopped: inputs after it do nothing.
    private(set) var isStopped = false
    /// Whether the app set background mode (nil: the configuration's).
    private var background: Bool?
    /// The round of the alive timer armed last; an older one fires as stale and does nothing.
    private var aliveRound: UInt64 = 0
    var random: any RandomNumberGenerator

    /// A policy for `configuration`, drawing its random waits from `random`.
    init(configuration: SSDPDiscoveryConfiguration, random: any RandomNumberGenerator = SystemRandomNumberGenerator()) {
        self.configuration = configuration
        let limits = configuration.limits
        announcer = SSDPAnnouncer(configuration: configuration,
                                  location: BeaconLocation(host: configuration.interfaceAddress, port: 0))
        searcher = SSDPSearcher(interval: TimeAmount(configuration.searchInterval))
        table = PeerTable(maxPeers: limits.maxTrackedPeers, byebyeGrace: TimeAmount(configuration.byebyeGracePeriod),
                          refetchDelay: TimeAmount(limits.failedFetchRetryDelay), maxRefetchDelay: TimeAmount(limits.maxFailedFetchRetryDelay),
                          maxRememberedReadPeers: limits.maxRememberedReadPeers, maxContactSources: limits.maxContactSources)
        sources = SSDPSourceBudgets(limits: limits)
        readBudget = SSDPReadBudget(limits: limits)
        narrowing = SSDPNarrowingEpisodes(limits: limits)
        unicastFailures = SSDPUnicastFailureStreak(limits: limits)
        fetchQueue = SSDPFetchQueue(limits: limits)
        self.random = random
    }

    // MARK: State read by the service

    /// Where this peer's beacons are served (port 0 until the beacon server runs).
    var location: BeaconLocation { announcer.location }
    /// This peer's current USN, if it advertises.
    var serviceName: String? { announcer.serviceName }
    /// The peers tracked now.
    var peers: [SSDPPeer] { table.peers }
    /// Whether discovery is off after a flood.
    var isDiscoveryOff: Bool { readBudget.isDiscoveryOff }
    /// Whether reading waits for the end of its window (a socket opened now starts paused).
    var isReadingPaused: Bool { readBudget.isReadingPaused }
    /// Whether announcements are paused by a limit.
    var isAnnouncingPaused: Bool { if case .paused = announcer.state { true } else { false } }
    /// The interval between alives: the background one in background mode.
    var aliveInterval: TimeAmount {
        TimeAmount((background ?? configuration.background) ? configuration.backgroundAliveInterval : configuration.foregroundAliveInterval)
    }

    // MARK: Announcing

    /// The beacon server listens at `location`: the LOCATION announced from now on.
    mutating func serve(at location: BeaconLocation) {
        announcer.location = location
    }

    /// The sockets are open at `now`: the first alive (when `advertising`), the search on join, and the
    /// periodic ticks armed.
    mutating func start(advertising: Bool, now: NIODeadline) -> [Action] {
        (advertising ? advertise(true) : []) + searchDue(now: now)
            + [.arm(.housekeeping, at: now + TimeAmount(configuration.housekeepingInterval)), rearmAlive(now: now),
               .arm(.search, at: now + TimeAmount(configuration.searchInterval))]
    }

    /// Arms a new round of the alive timer, one interval from `now`; the round armed before goes stale.
    private mutating func rearmAlive(now: NIODeadline) -> Action {
        aliveRound &+= 1
        return .arm(.alive(round: aliveRound), at: now + aliveInterval)
    }

    /// New beacons (or none when `advertising` is false): the byebye for the old USN, the alive for a new one.
    mutating func advertise(_ advertising: Bool) -> [Action] {
        announcer.beaconsChanged(advertising: advertising).map { .send($0, to: nil) }
    }

    /// The alive timer fired at `now`: the alive, if announcing (a pause that ran out resumes here).
    mutating func aliveDue(now: NIODeadline) -> [Action] {
        announcer.tick(now: now).map { [.send($0, to: nil)] } ?? []
    }

    /// A search is due at `now` (joining, rejoining, or the search timer): sent if `searchInterval` allows.
    mutating func searchDue(now: NIODeadline) -> [Action] {
        guard !isStopped, searcher.shouldSearch(now: now) else { return [] }
        return [.send(SSDPSearcher.request(configuration, searcher: announcer.serviceName), to: nil)]
    }

    /// Switches background mode at `now`: when the alive interval changed, the alive timer starts over at
    /// the new one (before ``start(advertising:now:)`` the actions may be dropped: it arms its own).
    mutating func setBackground(_ background: Bool, now: NIODeadline) -> [Action] {
        guard background != self.background else { return [] }
        self.background = background
        return isStopped ? [] : [rearmAlive(now: now)]
    }

    /// A limit pauses announcing for `period` from `now` (byebye now, alives again after it), reported as
    /// `.limitTriggered(kind)`; an ongoing pause is only extended.
    mutating func pauseAnnouncing(for period: TimeAmount, kind: SSDPDiscoveryEvent.LimitKind, now: NIODeadline) -> [Action] {
        pause(for: period, kind: kind, now: now).actions
    }

    /// Pauses announcing; `started` tells whether this started a pause (an ongoing one is only extended).
    mutating func pause(for period: TimeAmount, kind: SSDPDiscoveryEvent.LimitKind,
                        now: NIODeadline) -> (actions: [Action], started: Bool) {
        if case .paused = announcer.state {
            _ = announcer.pause(until: now + period)
            return ([], false)
        }
        var actions: [Action] = [.log(.warning, "SSDP announcements paused", ["limit": "\(kind.rawValue)"]),
                                 .emit(.limitTriggered(kind))]
        if let byebye = announcer.pause(until: now + period) { actions.append(.send(byebye, to: nil)) }
        return (actions, true)
    }

    /// The interface's address changed to `location`'s host (roaming, `spec/ssdp.md` §4.3): returns the
    /// byebye for our USN, to send from the old socket while that can still reach the segment (nil when
    /// not announcing). Call ``moved(now:)`` once the new sockets are open.
    mutating func moving(to location: BeaconLocation) -> SSDPMessage? {
        announcer.location = location
        counters.interfaceMoves += 1
        guard announcer.isAnnouncing, let name = announcer.serviceName else { return nil }
        return announcer.byebye(name)
    }

    /// The sockets are open on the new address at `now`: the alive for the same USN at the new LOCATION
    /// at once (listeners move the USN's entry there and drop the old location), and a search, as on
    /// joining a network (the search interval starts over).
    mutating func moved(now: NIODeadline) -> [Action] {
        guard !isStopped else { return [] }
        searcher = SSDPSearcher(interval: TimeAmount(configuration.searchInterval))
        let alive: [Action] = announcer.isAnnouncing ? announcer.serviceName.map { [.send(announcer.alive($0), to: nil)] } ?? [] : []
        // The alive timer starts over: the next periodic alive follows the one just sent.
        return alive + searchDue(now: now) + [rearmAlive(now: now)]
    }

    /// The beacons fetched from `host` matched one of the app's contacts.
    mutating func markContact(host: String) {
        table.markContact(host: host)
    }

    /// Clean shutdown: the byebye for our USN (send it before the sockets close), and every tracked peer
    /// reported as left.
    mutating func stop(now: NIODeadline) -> (byebye: SSDPMessage?, actions: [Action]) {
        let byebye = announcer.shutdown()
        isStopped = true
        return (byebye, perform(table.removeAll(), now: now))
    }

    /// The service sent `message`.
    mutating func countSent(_ message: SSDPMessage) {
        switch message {
        case .notification(let notification):
            if notification.subtype == .alive { counters.alivesSent += 1 } else { counters.byebyesSent += 1 }
        case .search: counters.searchesSent += 1
        case .searchResponse: counters.searchResponsesSent += 1
        }
    }

    // MARK: Time

    /// `timer` fired at `now`; `date` gives the RFC 1123 date of a search answer's DATE header.
    mutating func timerFired(_ timer: Timer, now: NIODeadline, date: () -> String) -> [Action] {
        switch timer {
        case .alive(let round):
            guard round == aliveRound, !isStopped else { return [] }
            return aliveDue(now: now) + [.arm(timer, at: now + aliveInterval)]
        case .search:
            guard !isStopped else { return [] }
            return searchDue(now: now) + [.arm(.search, at: now + TimeAmount(configuration.searchInterval))]
        case .housekeeping:
            guard !isStopped else { return [] }
            return housekeeping(now: now) + [.arm(.housekeeping, at: now + TimeAmount(configuration.housekeepingInterval))]
        case .readingResumes:
            readBudget.readingResumed()
            return isStopped ? [] : [.pauseReading(false)]
        case .discoveryBackOn:
            return isStopped ? [] : [.rejoinGroup]
        case .searchAnswer(let search, let source):
            pendingSearchAnswers -= 1
            guard !isStopped, let answer = announcer.answer(to: search, date: date()) else { return [] }
            return [.send(answer, to: source)]
        case .fetchSpreadEnds(let location):
            fetchQueue.endSpread(of: location)
            guard !isStopped, let current = table.serviceName(at: location) else { return [] }
            return enqueueFetch(location, serviceName: current, now: now)
        }
    }

    /// The group was joined again after a flood's cool-down (whether or not the join worked): discovery
    /// is on, and searches (rate permitting).
    mutating func rejoined(now: NIODeadline) -> [Action] {
        readBudget.rejoined()
        return searchDue(now: now)
    }

    /// The housekeeping tick at `now`: how late the loop ran, expiry and byebye graces, narrowing's end.
    mutating func housekeeping(now: NIODeadline) -> [Action] {
        if let lag = unicastFailures.tick(now: now, interval: TimeAmount(configuration.housekeepingInterval)) {
            let lagMilliseconds = Int(lag.nanoseconds / 1_000_000)
            if lagMilliseconds > counters.worstLoopLagMilliseconds { counters.worstLoopLagMilliseconds = lagMilliseconds }
        }
        let actions = perform(table.expire(now: now), now: now)
        narrowing.housekeeping(trackedPeers: table.count, now: now)
        return actions
    }

    // MARK: Narrowing

    /// Reports a sign of narrowing that is news: a new episode once, as `.limitTriggered(.narrowed)`.
    mutating func narrowed(_ news: SSDPNarrowingEpisodes.News, reason: String) -> [Action] {
        if news.fillsTable { counters.peerCapNarrowings += 1 }
        guard news.startsEpisode else { return [] }
        counters.narrowingEpisodes += 1
        return [.log(.notice, "SSDP discovery narrowed", ["reason": "\(reason)"]), .emit(.limitTriggered(.narrowed))]
    }
}
