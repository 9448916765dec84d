import NIOCore

/// Fetching: what the peer table asks for, spread over the crowd (`spec/ssdp.md` §5), queued behind
/// `maxConcurrentFetches`, contacts first (§7.2); what a fetch's outcome does to its source's budget,
/// to a busy source's later fetches (§6.1), and to the last resort against blocked unicast (§7).
extension SSDPDiscoveryPolicy {
    /// A fetch from ``Action/startFetch(_:serviceName:)`` ended at `now`, `inboundUnicast` peers having
    /// reached us over unicast so far (requests our beacon server answered, connections the app reported).
    /// Its slot is still held: give it back with ``fetchEnded(now:)`` once any delivery is done.
    mutating func fetchFinished(_ serviceName: String, outcome: FetchOutcome, inboundUnicast: Int, now: NIODeadline) -> [Action] {
        guard !isStopped else { return [] }
        switch outcome {
        case .fetched(let bytes):
            counters.beaconFetchesSucceeded += 1
            unicastFailures.fetchSucceeded()
            if let host = table.location(of: serviceName)?.host { sources.fetchSucceeded(at: host) }
            let tableActions = table.fetched(serviceName: serviceName, result: .fetched(bytes), now: now)
            var actions = perform(tableActions, now: now)
            for case .emit(.beaconsFetched(let peer)) in tableActions {
                actions.append(.deliver(peer, bytes))
                break
            }
            return actions
        case .busy(let wait):
            return deferFetches(of: serviceName, for: wait, now: now)
        case .failed(let failure):
            counters.beaconFetchesFailed += 1
            countFailure(failure.kind)
            let host = table.location(of: serviceName)?.host
            var actions = perform(table.fetched(serviceName: serviceName, result: .failed, failure: failure, now: now), now: now)
            guard let host else { return actions }
            // Per source first: a host whose locations keep failing is ignored alone.
            if sources.fetchFailed(at: host, now: now) {
                counters.sourcesIgnoredForFetchFailures += 1
                actions.append(.log(.notice, "SSDP source ignored: its beacon fetches keep failing", ["source": "\(host)"]))
            }
            if failure.kind.suggestsUnicastBlocked { actions += unicastFailed(from: host, inbound: inboundUnicast, now: now) }
            return actions
        }
    }

    /// A fetch gave its slot back at `now`: the next queued ones start.
    mutating func fetchEnded(now: NIODeadline) -> [Action] {
        fetchQueue.finished()
        return startFetches(now: now)
    }

    /// Turns the peer table's actions into the service's, counting and weighing them on the way.
    mutating func perform(_ tableActions: [PeerTable.Action], now: NIODeadline) -> [Action] {
        var actions: [Action] = []
        for tableAction in tableActions {
            switch tableAction {
            case .emit(let event):
                switch event {
                case .appeared(let peer): sources.peerTracked(at: peer.location.host, now: now)
                case .left(let peer, let reason):
                    sources.peerLeft(at: peer.location.host)
                    if reason == .narrowed {
                        counters.peersGivenUpAtCap += 1
                        actions += narrowed(narrowing.tableFull(now: now), reason: "the peer table is full")
                    }
                default: break
                }
                actions.append(.emit(event))
            case .fetch(let location, let serviceName):
                // A contact's beacons are read at once and first (spec/ssdp.md 7.2, contacts first).
                let delay = table.isContact(location) ? .zero : crowdSpread()
                actions += delay > .zero ? fetchLater(location, at: now + delay)
                                         : enqueueFetch(location, serviceName: serviceName, now: now)
            case .capExceeded:
                counters.peersRejectedAtCap += 1
                actions += narrowed(narrowing.tableFull(now: now), reason: "the peer table is full")
            case .alreadyRead:
                counters.alreadyReadPeersIgnored += 1
            }
        }
        return actions
    }

    /// Queues a fetch of `serviceName`, a contact's ahead of strangers'; a full queue fails it (not made).
    mutating func enqueueFetch(_ location: BeaconLocation, serviceName: String, now: NIODeadline) -> [Action] {
        guard fetchQueue.enqueue(location, serviceName: serviceName, contact: table.isContact(location)) else {
            countFailure(.notMade)
            return perform(table.fetched(serviceName: serviceName, result: .failed,
                                         failure: BeaconFetchFailure(.notMade, "fetch queue full"), now: now), now: now)
        }
        return startFetches(now: now)
    }

    /// Starts queued fetches while slots are free; skips superseded USNs, postpones busy sources' fetches,
    /// and fails ignored sources' (not made: a later alive, once the wait is over, fetches it again).
    private mutating func startFetches(now: NIODeadline) -> [Action] {
        var actions: [Action] = []
        while let (location, serviceName) = fetchQueue.next() {
            guard table.isCurrent(serviceName) else { continue }  // superseded while queued
            // A source that answered busy is asked again when it said, each fetch spread over the crowd.
            if let until = sources.fetchesDeferred(from: location.host, now: now) {
                actions += fetchLater(location, at: until + crowdSpread())
                continue
            }
            guard !sources.isRefused(location.host, now: now) else {
                counters.fetchesSkippedForIgnoredSources += 1
                countFailure(.notMade)
                actions += perform(table.fetched(serviceName: serviceName, result: .failed,
                                                 failure: BeaconFetchFailure(.notMade, "source ignored"), now: now), now: now)
                continue
            }
            fetchQueue.started()
            actions.append(.startFetch(location, serviceName: serviceName))
        }
        return actions
    }

    /// Fetches `location`'s current USN at `deadline`. A location already waiting fetches the USN current
    /// when its wait ends: a source that changes USN with every datagram gets one timer, not one per datagram.
    private mutating func fetchLater(_ location: BeaconLocation, at deadline: NIODeadline) -> [Action] {
        fetchQueue.beginSpread(of: location) ? [.arm(.fetchSpreadEnds(location), at: deadline)] : []
    }

    /// A random wait below `trackedPeers × fetchSpreadPerPeer` (spec/ssdp.md 5): what spreads a crowd's
    /// fetches of one peer.
    private mutating func crowdSpread() -> TimeAmount {
        TimeAmount(limits.fetchDelay(trackedPeers: table.count, using: &random))
    }

    /// A busy answer (spec/ssdp.md 6.1): the source asked to be fetched again after `wait`. Its fetches wait
    /// that long plus a spread over the crowd (§5), so the crowd it turned away does not come back in one
    /// wave. Not a failure: nothing counts toward the source's or the global failure limits, and the peer
    /// stays in the table, its fetch pending.
    private mutating func deferFetches(of serviceName: String, for wait: TimeAmount, now: NIODeadline) -> [Action] {
        counters.busyAnswersReceived += 1
        guard let location = table.location(of: serviceName) else { return [] }
        let until = now + wait
        sources.deferFetches(from: location.host, until: until)
        return fetchLater(location, at: until + crowdSpread())
    }

    /// A fetch from `host` got no TCP connection: the last resort against blocked unicast pauses
    /// announcing once the streak is long enough (``SSDPUnicastFailureStreak``). Neither a starved streak
    /// nor a source's own failures pause it.
    private mutating func unicastFailed(from host: String, inbound: Int, now: NIODeadline) -> [Action] {
        switch unicastFailures.connectFailed(from: host, inbound: inbound, now: now) {
        case .goingOn:
            return []
        case .starved(let sources):
            counters.unicastFailureStreaksStarved += 1
            return [.log(.notice, "SSDP unicast failures while this peer was starved of CPU: announcing goes on", [
                "sources": "\(sources)", "worstLoopLagMs": "\(counters.worstLoopLagMilliseconds)",
            ])]
        case .blocked:
            let (actions, started) = pause(for: TimeAmount(limits.unicastFailurePause), kind: .unicastFailure, now: now)
            if started { counters.unicastFailurePauses += 1 }
            return actions
        }
    }

    private mutating func countFailure(_ kind: BeaconFetchFailure.Kind) {
        counters.beaconFetchFailuresByKind[kind, default: 0] += 1
    }
}
