import NIOCore
import ThaliMutants

/// Receiving: the budgets a datagram passes before it is parsed (the read budget, its source's, the
/// flood limit), then what its message does (`spec/ssdp.md` §3, §5, §7).
extension SSDPDiscoveryPolicy {
    /// A datagram read from either socket at `now`, from `source`. Parsed only once its budgets admit it:
    /// an ignored source's datagrams are not even parsed.
    mutating func received(datagram: some Collection<UInt8>, from source: SocketAddress, now: NIODeadline) -> [Action] {
        guard !isStopped else { return [] }
        counters.datagramsReceived += 1
        switch readBudget.read(now: now) {
        case .read: break
        case .dropped: return []
        case .pauseReading(let until):
            // Narrowing by the datagram rate: both sockets wait until the window ends (their datagrams
            // meanwhile wait in, then overflow, the sockets' buffers: the kernel drops them).
            counters.readPauses += 1
            return narrowed(narrowing.readingPaused(now: now), reason: "more datagrams than the read budget")
                + [.pauseReading(true), .arm(.readingResumes, at: until)]
        }
        // Per source before anything global.
        let sourceAddress = source.ipAddress ?? "?"
        let (admitted, newlyRefused) = sources.admitDatagram(from: sourceAddress, now: now)
        guard admitted else {
            counters.datagramsFromIgnoredSources += 1
            guard newlyRefused else { return [] }
            counters.sourcesIgnoredForRate += 1
            return [.log(.notice, "SSDP source ignored: datagram rate", ["source": "\(sourceAddress)"])]
        }
        if let backOn = readBudget.countTowardFlood(now: now) {
            // The last resort: the multicast socket closes so that the kernel, not this process, drops the flood.
            counters.floodShutdowns += 1
            let kind = SSDPDiscoveryEvent.LimitKind.announcementFlood
            return [.log(.warning, "SSDP discovery off", ["limit": "\(kind.rawValue)"]), .emit(.limitTriggered(kind)),
                    .closeMulticast, .arm(.discoveryBackOn, at: backOn)]
        }
        let message: SSDPMessage
        do {
            message = try SSDPMessage.parse(datagram, limits: configuration.parserLimits)
        } catch {
            counters.malformedDatagrams += 1
            return []
        }
        return received(message, from: source, now: now)
    }

    /// A parsed datagram from `source`, admitted by its budgets.
    private mutating func received(_ message: SSDPMessage, from source: SocketAddress, now: NIODeadline) -> [Action] {
        switch message {
        case .notification(let notification):
            guard notification.notificationType == configuration.notificationType else {
                counters.foreignMessagesIgnored += 1
                return []
            }
            guard notification.uniqueServiceName != announcer.serviceName || Mutant.ssdpHearsItself.isActive else {
                counters.ownMessagesIgnored += 1
                return []
            }
            guard ThaliServiceName.isThaliServiceName(notification.uniqueServiceName) else {
                counters.malformedDatagrams += 1
                return []
            }
            switch notification.subtype {
            case .alive:
                guard let location = verifiedLocation(notification.location, source: source), mayTrack(location) else { return [] }
                return perform(table.alive(serviceName: notification.uniqueServiceName, location: location,
                                           maxAge: notification.maxAge ?? 0, now: now), now: now)
            case .byebye:
                return perform(table.byebye(serviceName: notification.uniqueServiceName, source: source.ipAddress, now: now),
                               now: now)
            }
        case .search(let search):
            return respond(to: search, from: source, now: now)
        case .searchResponse(let response):
            guard response.searchTarget == configuration.notificationType else {
                counters.foreignMessagesIgnored += 1
                return []
            }
            guard response.uniqueServiceName != announcer.serviceName else {
                counters.ownMessagesIgnored += 1
                return []
            }
            guard ThaliServiceName.isThaliServiceName(response.uniqueServiceName),
                  let location = verifiedLocation(response.location, source: source), mayTrack(location)
            else { return [] }
            return perform(table.alive(serviceName: response.uniqueServiceName, location: location,
                                       maxAge: response.maxAge, now: now), now: now)
        }
    }

    /// Whether an alive for `location` may be tracked: a peer tracked already may always refresh; a new
    /// one only while its source has fewer than `maxPeersPerSource`.
    private mutating func mayTrack(_ location: BeaconLocation) -> Bool {
        if table.tracks(location) || sources.mayTrackAnotherPeer(from: location.host) { return true }
        counters.peersRejectedPerSource += 1
        return false
    }

    /// The LOCATION, if it parses and names the datagram's own source address: otherwise anyone could
    /// aim every listener's fetches at a victim.
    private mutating func verifiedLocation(_ text: String?, source: SocketAddress) -> BeaconLocation? {
        guard let text, let location = BeaconLocation(parsing: text), location.host == source.ipAddress else {
            counters.spoofedLocationsIgnored += 1
            return nil
        }
        // Our own port under a USN that is no longer ours: an alive or answer of our previous USN, looped
        // back after a beacon change (the USN check above knows only the current one). No peer shares it.
        let own = announcer.location
        guard location.host != own.host || location.port != own.port || own.port == 0 || Mutant.ssdpHearsItself.isActive else {
            counters.ownMessagesIgnored += 1
            return nil
        }
        return location
    }

    /// An M-SEARCH: answered by unicast after a random delay below min(MX, `maxSearchResponseDelaySeconds`),
    /// while we announce, at most `maxPendingSearchResponses` answers waiting.
    private mutating func respond(to search: SSDPSearchRequest, from source: SocketAddress, now: NIODeadline) -> [Action] {
        guard search.searcherServiceName == nil || search.searcherServiceName != announcer.serviceName else {
            counters.ownMessagesIgnored += 1
            return []
        }
        guard search.searchTarget == configuration.notificationType || search.searchTarget == SSDPSearchRequest.allTargets else {
            counters.foreignMessagesIgnored += 1
            return []
        }
        guard announcer.isAnnouncing else { return [] }
        guard pendingSearchAnswers < limits.maxPendingSearchResponses else {
            counters.searchResponsesDropped += 1
            return []
        }
        pendingSearchAnswers += 1
        let window = Int64(max(0, min(search.maxWaitSeconds, configuration.maxSearchResponseDelaySeconds))) * 1000
        let delay = TimeAmount.milliseconds(window > 0 ? Int64.random(in: 0..<window, using: &random) : 0)
        return [.arm(.searchAnswer(search, to: source), at: now + delay)]
    }
}
