import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import ThaliAdmission
import ThaliMutants

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Thali Wi-Fi discovery: announces this peer's beacon location over SSDP, answers searches, tracks the
/// peers it hears, fetches each peer's beacons once per USN and hands them to a consumer, and serves its
/// own beacons at `/NotificationBeacons`. Beacons are opaque bytes here; the app plugs in their parser.
///
/// All mutable state lives on one event loop (`eventLoop`); public methods hop there. Call `stop()` when
/// done: it sends the byebye and releases the sockets, timers and the beacon server.
public final class SSDPDiscoveryService: @unchecked Sendable {
    /// Errors raised by `start`.
    public enum StartError: Error, Hashable, Sendable {
        /// No interface carries `interfaceAddress`.
        case noInterface(address: String)
        /// `interfaceAddress` or `groupAddress` is not an IPv4 address of the right kind.
        case invalidAddress(String)
        /// `start` was called twice.
        case alreadyStarted
        /// The datagram channel does not expose socket options (not a POSIX socket).
        case socketOptionsUnavailable
        /// A timer or limit of the configuration is zero or negative where it must be positive.
        case invalidConfiguration(String)
    }

    /// The beacon consumer: called once per fetched USN with the peer and its stream bytes.
    public typealias BeaconConsumer = @Sendable (SSDPPeer, [UInt8]) async -> Void

    /// The configuration in force.
    public let configuration: SSDPDiscoveryConfiguration
    /// Discovery's events, in order. Buffers the newest 4,096 if nobody reads.
    public let events: AsyncStream<SSDPDiscoveryEvent>
    /// The loop all state is confined to.
    public let eventLoop: EventLoop

    private let group: EventLoopGroup
    private let logger: Logger
    private let consumer: BeaconConsumer
    private let eventSink: AsyncStream<SSDPDiscoveryEvent>.Continuation
    private let client: BeaconHTTPClient
    private let server: BeaconHTTPServer

    // Loop-confined state.
    private var started = false
    private var stopped = false
    private var multicastChannel: Channel?
    private var unicastChannel: Channel?
    /// The pinned interface address (for the group join).
    private var device: SocketAddress?
    private var groupSocketAddress: SocketAddress?
    private var announcer: SSDPAnnouncer
    private var searcher: SSDPSearcher
    private var table: PeerTable
    private var flood: RateWindow
    /// Datagrams read in the current window, from either socket (`maxDatagramsReadPerWindow`).
    private var reads: RateWindow
    /// Whether reading waits for the end of the window (narrowed by the datagram rate).
    private var readingPaused = false
    /// Whether the table is full and narrowing (counted once per time it fills up).
    private var narrowingAtCap = false
    /// Whether discovery is in a narrowing episode (the table full, or reading paused by its budget),
    /// reported once as `.limitTriggered(.narrowed)`; it ends `narrowingEpisodeGap` after the last sign.
    private var narrowingEpisode = false
    private var lastNarrowed: NIODeadline?
    private var sources: SSDPSourceBudgets
    /// Distinct sources whose fetches failed since the last success (the global unicast check).
    private var failingSources: Set<String> = []
    /// When the first of `failingSources` failed.
    private var failingSince: NIODeadline?
    /// Peers that reached us over unicast when the first of `failingSources` failed
    /// (``inboundUnicastCount``): any since then proves that unicast works.
    private var inboundAtFailingSince = 0
    /// Whether this peer's event loop ran late by `unicastFailureStarvedLoopLag` since the first of
    /// `failingSources` failed: the streak shows our starvation, not blocked unicast.
    private var loopStarvedDuringStreak = false
    /// When the housekeeping tick last ran (the loop's lateness is measured between ticks).
    private var lastHousekeeping: NIODeadline?
    /// Whether a fetch of ours succeeded in this run: unicast has worked here.
    private var anyFetchSucceeded = false
    /// Connections from peers that an app serving the beacons itself reported (``noteInboundUnicast()``).
    private let inboundUnicastReported = NIOLockedValueBox(0)
    private var discoveryOffUntil: NIODeadline?
    private var counters = SSDPDiscoveryCounters()
    private var pendingResponses = 0
    private var fetchQueue: [(BeaconLocation, String)] = []
    /// Locations whose fetch waits out its spread (``SSDPDiscoveryLimits/fetchDelay(trackedPeers:using:)``):
    /// one wait per tracked location, however many USNs it announces meanwhile.
    private var spreadingLocations: Set<BeaconLocation> = []
    private var fetchesInFlight = 0
    private var aliveTask: RepeatedTask?
    private var housekeepingTask: RepeatedTask?
    private var searchTask: RepeatedTask?

    /// A service with `configuration`, running on one loop of `group`; `consumer` receives fetched beacons.
    public init(configuration: SSDPDiscoveryConfiguration, group: EventLoopGroup,
                logger: Logger = Logger(label: "thali.ssdp"), consumer: @escaping BeaconConsumer = { _, _ in }) {
        self.configuration = configuration
        self.group = group
        self.eventLoop = group.next()
        self.logger = logger
        self.consumer = consumer
        (self.events, self.eventSink) = AsyncStream.makeStream(of: SSDPDiscoveryEvent.self,
                                                               bufferingPolicy: .bufferingNewest(4096))
        var clientConfiguration = configuration.client
        if clientConfiguration.sourceAddress == nil { clientConfiguration.sourceAddress = configuration.interfaceAddress }
        self.client = BeaconHTTPClient(configuration: clientConfiguration, group: group)
        self.announcer = SSDPAnnouncer(configuration: configuration,
                                       location: BeaconLocation(host: configuration.interfaceAddress, port: 0))
        self.searcher = SSDPSearcher(interval: configuration.searchInterval)
        self.table = PeerTable(maxPeers: configuration.limits.maxTrackedPeers,
                               byebyeGrace: configuration.byebyeGracePeriod,
                               refetchDelay: configuration.limits.failedFetchRetryDelay,
                               maxRefetchDelay: configuration.limits.maxFailedFetchRetryDelay,
                               maxRememberedReadPeers: configuration.limits.maxRememberedReadPeers,
                               maxContactSources: configuration.limits.maxContactSources)
        self.flood = RateWindow(limit: configuration.limits.maxDatagramsPerWindow,
                                length: configuration.limits.floodWindow)
        self.reads = RateWindow(limit: configuration.limits.maxDatagramsReadPerWindow,
                                length: configuration.limits.floodWindow)
        self.sources = SSDPSourceBudgets(limits: configuration.limits)
        // The server reports overloads back here; a weak link, so the server does not keep us alive.
        let overloadTarget = NIOLockedValueBox(WeakService())
        self.server = BeaconHTTPServer(host: configuration.interfaceAddress, limits: configuration.serverLimits,
                                       group: group, logger: logger, onOverload: { period in
            overloadTarget.withLockedValue { $0.service }?.httpOverloaded(for: period)
        })
        overloadTarget.withLockedValue { $0.service = self }
    }

    private struct WeakService: Sendable { weak var service: SSDPDiscoveryService? }

    // MARK: Public API

    /// Starts the beacon server, opens the sockets, announces `beacons` (if any) and searches once.
    public func start(advertising beacons: [UInt8]? = nil) async throws {
        try Self.validate(configuration)
        guard IPv4Text(Substring(configuration.interfaceAddress)) != nil else {
            throw StartError.invalidAddress(configuration.interfaceAddress)
        }
        let groupAddress = try SocketAddress(ipAddress: configuration.groupAddress, port: configuration.port)
        guard groupAddress.isMulticast else { throw StartError.invalidAddress(configuration.groupAddress) }
        guard LocalAddress.isLocal(configuration.interfaceAddress) else {
            throw StartError.noInterface(address: configuration.interfaceAddress)
        }
        let device = try SocketAddress(ipAddress: configuration.interfaceAddress, port: 0)
        try await eventLoop.submit {
            guard !self.started else { throw StartError.alreadyStarted }
            self.started = true
        }.get()

        server.setBeacons(beacons)
        do {
            let httpPort: Int
            switch configuration.beaconServer {
            case .builtIn: httpPort = try await server.start(port: configuration.httpPort)
            case .external(let port): httpPort = port
            }
            let unicast = try await openUnicastChannel().get()
            try await eventLoop.submit {
                self.device = device
                self.groupSocketAddress = groupAddress
                self.unicastChannel = unicast
                self.announcer.location = BeaconLocation(host: self.configuration.interfaceAddress, port: httpPort)
            }.get()
            try await joinGroup().get()
        } catch {
            // Leave nothing open behind a failed start.
            let unicast = try? await eventLoop.submit { () -> Channel? in
                defer { self.unicastChannel = nil }
                return self.unicastChannel
            }.get()
            try? await unicast?.close()
            await server.stop()
            throw error
        }
        try await eventLoop.submit {
            if beacons != nil { self.sendAll(self.announcer.beaconsChanged(advertising: true)) }
            self.searchIfAllowed()
            self.scheduleAlives()
            self.housekeepingTask = self.eventLoop.scheduleRepeatedTask(
                initialDelay: self.configuration.housekeepingInterval, delay: self.configuration.housekeepingInterval
            ) { _ in self.housekeeping() }
            self.searchTask = self.eventLoop.scheduleRepeatedTask(
                initialDelay: self.configuration.searchInterval, delay: self.configuration.searchInterval
            ) { _ in self.searchIfAllowed() }
        }.get()
    }

    /// Advertises a new beacon stream (nil: none). Sends byebye for the old USN, then alive for a new one.
    public func advertise(_ beacons: [UInt8]?) async {
        server.setBeacons(beacons)
        try? await eventLoop.submit {
            guard self.started, !self.stopped else { return }
            self.sendAll(self.announcer.beaconsChanged(advertising: beacons != nil))
        }.get()
    }

    /// Stops announcing for `period` (byebye now, alive again after it), reported as
    /// `.limitTriggered(.httpOverload)`: for an app serving the beacons itself
    /// (``SSDPDiscoveryConfiguration/BeaconServer/external(port:)``) whose port closed for an overload.
    public func pauseAnnouncing(for period: TimeAmount) {
        httpOverloaded(for: period)
    }

    /// Switches between the foreground (500 ms) and background (60 s) announcement rates.
    public func setBackground(_ background: Bool) async {
        try? await eventLoop.submit {
            guard background != self.isBackground else { return }
            self.isBackground = background
            if self.started && !self.stopped { self.scheduleAlives() }
        }.get()
    }

    private var isBackground: Bool?

    /// Clean shutdown: byebye for our USN, then sockets and server closed; tracked peers reported as left.
    public func stop() async {
        let (channels, byebyeSent) = (try? await eventLoop.submit { () -> ([Channel], EventLoopFuture<Void>?) in
            guard self.started, !self.stopped else { return ([], nil) }
            let byebyeSent = self.announcer.shutdown().map { self.send($0) }
            self.stopped = true
            self.aliveTask?.cancel()
            self.housekeepingTask?.cancel()
            self.searchTask?.cancel()
            self.perform(self.table.removeAll())
            let channels = [self.multicastChannel, self.unicastChannel].compactMap { $0 }
            self.multicastChannel = nil
            self.unicastChannel = nil
            return (channels, byebyeSent)
        }.get()) ?? ([], nil)
        try? await byebyeSent?.get()  // the byebye leaves before its socket closes
        for channel in channels { try? await channel.close() }
        await server.stop()
        eventSink.finish()
    }

    /// The peers tracked now.
    public func peers() async -> [SSDPPeer] {
        (try? await eventLoop.submit { self.table.peers }.get()) ?? []
    }

    /// What discovery has counted so far.
    public func counters() async -> SSDPDiscoveryCounters {
        (try? await eventLoop.submit { self.counters }.get()) ?? SSDPDiscoveryCounters()
    }

    /// Tells discovery that the beacons fetched from `location` matched one of the app's contacts: its
    /// source keeps its place in a full table and its fetches go ahead of strangers' (spec/ssdp.md 7.2).
    /// At most `maxContactSources` sources are remembered, the latest first.
    public func markContact(at location: BeaconLocation) {
        eventLoop.execute { [self] in table.markContact(host: location.host) }
    }

    /// What the beacon server has counted so far.
    public var serverCounters: BeaconHTTPServerCounters { server.counters }

    /// Where this peer's beacons are served (port 0 before `start`).
    public func location() async -> BeaconLocation {
        (try? await eventLoop.submit { self.announcer.location }.get())
            ?? BeaconLocation(host: configuration.interfaceAddress, port: 0)
    }

    /// This peer's current USN, if it advertises.
    public func uniqueServiceName() async -> String? {
        try? await eventLoop.submit { self.announcer.serviceName }.get()
    }

    /// Whether discovery is currently switched off by a flood.
    public func isDiscoveryOff() async -> Bool {
        (try? await eventLoop.submit { self.discoveryOffUntil != nil }.get()) ?? false
    }

    /// Whether announcements are currently paused by a limit.
    public func isAnnouncingPaused() async -> Bool {
        (try? await eventLoop.submit { () -> Bool in
            if case .paused = self.announcer.state { return true } else { return false }
        }.get()) ?? false
    }

    // MARK: Sockets

    /// Reads at most one byte more than the parser accepts, so an oversized datagram is truncated by the
    /// kernel and then refused by its size, never buffered whole.
    private var datagramAllocator: FixedSizeRecvByteBufferAllocator {
        FixedSizeRecvByteBufferAllocator(capacity: configuration.parserLimits.maxDatagramBytes + 1)
    }

    private func openUnicastChannel() -> EventLoopFuture<Channel> {
        let interface: in_addr
        do {
            guard case .v4(let address) = try SocketAddress(ipAddress: configuration.interfaceAddress, port: 0) else {
                return eventLoop.makeFailedFuture(StartError.invalidAddress(configuration.interfaceAddress))
            }
            interface = address.address.sin_addr
        } catch {
            return eventLoop.makeFailedFuture(error)
        }
        return DatagramBootstrap(group: eventLoop)
            .channelOption(.recvAllocator, value: datagramAllocator)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(SSDPDatagramHandler { [self] envelope in
                        self.received(envelope)
                    })
                }
            }
            .bind(host: configuration.interfaceAddress, port: 0)
            .flatMap { [configuration] channel in
                guard let options = channel as? SocketOptionProvider else {
                    return channel.close().flatMapThrowing { throw StartError.socketOptionsUnavailable }
                }
                return options.setIPMulticastIF(interface)
                    .flatMap { options.setIPMulticastTTL(Mutant.ssdpMulticastTTLOne.isActive ? 1 : configuration.multicastTTL) }
                    .flatMap { options.setIPMulticastLoop(1) }
                    .map { channel }
            }
    }

    /// Opens the multicast socket (bound to the group address, so unicast to the port is not read) and
    /// joins the group on the pinned interface.
    private func joinGroup() -> EventLoopFuture<Void> {
        let configuration = self.configuration
        return eventLoop.flatSubmit { [self] in
            guard let groupSocketAddress, let device else { return eventLoop.makeSucceededVoidFuture() }
            return DatagramBootstrap(group: eventLoop)
                .channelOption(.recvAllocator, value: datagramAllocator)
                .channelOption(.socketOption(.so_reuseaddr), value: 1)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(SSDPDatagramHandler { [self] envelope in
                            self.received(envelope)
                        })
                    }
                }
                .bind(host: configuration.groupAddress, port: configuration.port)
                .flatMap { (channel: Channel) -> EventLoopFuture<Channel> in
                    // IP_ADD_MEMBERSHIP by hand: NIO's joinGroup refuses interfaces without the MULTICAST
                    // flag, and `lo` has none, yet pinning both sides to 127.0.0.1 works there.
                    guard case .v4(let group) = groupSocketAddress, case .v4(let interface) = device else {
                        return channel.close().flatMapThrowing { throw StartError.invalidAddress(configuration.groupAddress) }
                    }
                    let request = ip_mreq(imr_multiaddr: group.address.sin_addr, imr_interface: interface.address.sin_addr)
                    guard let options = channel as? SocketOptionProvider else {
                        return channel.close().flatMapThrowing { throw StartError.socketOptionsUnavailable }
                    }
                    return options
                        .unsafeSetSocketOption(level: .ip, name: .ip_add_membership, value: request)
                        .map { channel }
                }
                .map { (channel: Channel) in
                    if self.stopped { channel.close(promise: nil) } else {
                        self.multicastChannel = channel
                        if self.readingPaused { channel.setOption(ChannelOptions.autoRead, value: false).whenFailure { _ in } }
                    }
                }
        }
    }

    /// Switches discovery off (the last resort of `maxDatagramsPerWindow`): the multicast socket closes
    /// so the kernel, not this process, drops the flood.
    private func switchDiscoveryOff(_ kind: SSDPDiscoveryEvent.LimitKind) {
        guard discoveryOffUntil == nil else { return }
        discoveryOffUntil = .now() + configuration.limits.discoveryCooldown
        logger.warning("SSDP discovery off", metadata: ["limit": "\(kind.rawValue)"])
        eventSink.yield(.limitTriggered(kind))
        multicastChannel?.close(promise: nil)
        multicastChannel = nil
        eventLoop.scheduleTask(in: configuration.limits.discoveryCooldown) { [self] in
            guard !stopped else { return }
            joinGroup().whenComplete { [self] result in
                discoveryOffUntil = nil
                flood = RateWindow(limit: configuration.limits.maxDatagramsPerWindow,
                                   length: configuration.limits.floodWindow)
                if case .failure(let error) = result {
                    logger.error("SSDP could not rejoin the group", metadata: ["error": "\(error)"])
                }
                searchIfAllowed()
            }
        }
    }

    /// Narrowing by the datagram rate: stops reading both sockets until the current window ends (their
    /// datagrams meanwhile wait in, then overflow, the sockets' buffers: the kernel drops them).
    private func pauseReading(now: NIODeadline) {
        guard !readingPaused else { return }
        readingPaused = true
        counters.readPauses += 1
        noteNarrowing(reason: "more datagrams than the read budget")
        setReadingPaused(true)
        let windowEnd = (reads.start ?? now) + configuration.limits.floodWindow
        eventLoop.scheduleTask(in: max(.zero, windowEnd - now)) { [self] in
            readingPaused = false
            guard !stopped else { return }
            setReadingPaused(false)
        }
    }

    private func setReadingPaused(_ paused: Bool) {
        for channel in [multicastChannel, unicastChannel].compactMap({ $0 }) {
            channel.setOption(ChannelOptions.autoRead, value: !paused).whenFailure { _ in }
        }
    }

    // MARK: Sending

    @discardableResult
    private func send(_ message: SSDPMessage, to destination: SocketAddress? = nil) -> EventLoopFuture<Void> {
        guard let channel = unicastChannel, let target = destination ?? groupSocketAddress else {
            return eventLoop.makeSucceededVoidFuture()
        }
        switch message {
        case .notification(let notification):
            if notification.subtype == .alive { counters.alivesSent += 1 } else { counters.byebyesSent += 1 }
        case .search: counters.searchesSent += 1
        case .searchResponse: counters.searchResponsesSent += 1
        }
        let buffer = channel.allocator.buffer(bytes: message.serialize())
        return channel.writeAndFlush(AddressedEnvelope(remoteAddress: target, data: buffer))
    }

    private func sendAll(_ messages: [SSDPMessage]) { messages.forEach { send($0) } }

    private func scheduleAlives() {
        aliveTask?.cancel()
        let interval = (isBackground ?? configuration.background)
            ? configuration.backgroundAliveInterval : configuration.foregroundAliveInterval
        aliveTask = eventLoop.scheduleRepeatedTask(initialDelay: interval, delay: interval) { [self] _ in
            if let alive = announcer.tick(now: .now()) { send(alive) }
        }
    }

    private func searchIfAllowed() {
        guard !stopped, searcher.shouldSearch(now: .now()) else { return }
        send(SSDPSearcher.request(configuration, searcher: announcer.serviceName))
    }

    // MARK: Receiving

    private func received(_ envelope: AddressedEnvelope<ByteBuffer>) {
        guard !stopped else { return }
        counters.datagramsReceived += 1
        let now = NIODeadline.now()
        guard discoveryOffUntil == nil else { return }  // stragglers read before the socket closed
        // What this process reads of the crowd is bounded first: past it, the kernel drops the rest.
        guard reads.record(now: now) else { return pauseReading(now: now) }
        // Per source before anything global: an ignored source's datagrams are not even parsed.
        let sourceAddress = envelope.remoteAddress.ipAddress ?? "?"
        let (admitted, newlyRefused) = sources.admitDatagram(from: sourceAddress, now: now)
        guard admitted else {
            counters.datagramsFromIgnoredSources += 1
            if newlyRefused {
                counters.sourcesIgnoredForRate += 1
                logger.notice("SSDP source ignored: datagram rate", metadata: ["source": "\(sourceAddress)"])
            }
            return
        }
        guard flood.record(now: now) else {
            counters.floodShutdowns += 1
            return switchDiscoveryOff(.announcementFlood)
        }
        let message: SSDPMessage
        do {
            message = try SSDPMessage.parse(envelope.data.readableBytesView, limits: configuration.parserLimits)
        } catch {
            counters.malformedDatagrams += 1
            return
        }
        let source = envelope.remoteAddress
        switch message {
        case .notification(let notification):
            guard notification.notificationType == configuration.notificationType else {
                counters.foreignMessagesIgnored += 1
                return
            }
            guard notification.uniqueServiceName != announcer.serviceName || Mutant.ssdpHearsItself.isActive else {
                counters.ownMessagesIgnored += 1
                return
            }
            guard ThaliServiceName.isThaliServiceName(notification.uniqueServiceName) else {
                counters.malformedDatagrams += 1
                return
            }
            switch notification.subtype {
            case .alive:
                guard let location = verifiedLocation(notification.location, source: source),
                      mayTrack(location) else { return }
                perform(table.alive(serviceName: notification.uniqueServiceName, location: location,
                                    maxAge: notification.maxAge ?? 0, now: now))
            case .byebye:
                perform(table.byebye(serviceName: notification.uniqueServiceName, source: source.ipAddress, now: now))
            }
        case .search(let search):
            respond(to: search, from: source)
        case .searchResponse(let response):
            guard response.searchTarget == configuration.notificationType else {
                counters.foreignMessagesIgnored += 1
                return
            }
            guard response.uniqueServiceName != announcer.serviceName else {
                counters.ownMessagesIgnored += 1
                return
            }
            guard ThaliServiceName.isThaliServiceName(response.uniqueServiceName),
                let location = verifiedLocation(response.location, source: source),
                mayTrack(location)
            else { return }
            perform(table.alive(serviceName: response.uniqueServiceName, location: location,
                                maxAge: response.maxAge, now: now))
        }
    }

    /// Whether an alive for `location` may be tracked: a peer tracked already may always refresh; a new
    /// one only while its source has fewer than `maxPeersPerSource`.
    private func mayTrack(_ location: BeaconLocation) -> Bool {
        if table.tracks(location) || sources.mayTrackAnotherPeer(from: location.host) { return true }
        counters.peersRejectedPerSource += 1
        return false
    }

    /// The LOCATION, if it parses and names the datagram's own source address: otherwise anyone could
    /// aim every listener's fetches at a victim.
    private func verifiedLocation(_ text: String?, source: SocketAddress) -> BeaconLocation? {
        guard let text, let location = BeaconLocation(parsing: text), location.host == source.ipAddress else {
            counters.spoofedLocationsIgnored += 1
            return nil
        }
        // Our own port under a USN that is no longer ours: an alive or answer of our previous USN, looped
        // back after a beacon change (the USN check above knows only the current one). No peer shares it.
        guard location.host != announcer.location.host || location.port != announcer.location.port || announcer.location.port == 0
                || Mutant.ssdpHearsItself.isActive else {
            counters.ownMessagesIgnored += 1
            return nil
        }
        return location
    }

    private func respond(to search: SSDPSearchRequest, from source: SocketAddress) {
        guard search.searcherServiceName == nil || search.searcherServiceName != announcer.serviceName else {
            counters.ownMessagesIgnored += 1
            return
        }
        guard search.searchTarget == configuration.notificationType
            || search.searchTarget == SSDPSearchRequest.allTargets
        else {
            counters.foreignMessagesIgnored += 1
            return
        }
        guard announcer.isAnnouncing else { return }
        guard pendingResponses < configuration.limits.maxPendingSearchResponses else {
            counters.searchResponsesDropped += 1
            return
        }
        pendingResponses += 1
        let window = Int64(max(0, min(search.maxWaitSeconds, configuration.maxSearchResponseDelaySeconds))) * 1000
        let delay = TimeAmount.milliseconds(window > 0 ? Int64.random(in: 0..<window) : 0)
        eventLoop.scheduleTask(in: delay) { [self] in
            pendingResponses -= 1
            guard !stopped, let answer = announcer.answer(to: search, date: Self.httpDate()) else { return }
            send(answer, to: source)
        }
    }

    // MARK: Peer table actions and fetching

    private func perform(_ actions: [PeerTable.Action]) {
        for action in actions {
            switch action {
            case .emit(let event):
                switch event {
                case .appeared(let peer): sources.peerTracked(at: peer.location.host, now: .now())
                case .left(let peer, let reason):
                    sources.peerLeft(at: peer.location.host)
                    if reason == .narrowed {
                        counters.peersGivenUpAtCap += 1
                        noteNarrowingAtCap()
                    }
                default: break
                }
                eventSink.yield(event)
            case .fetch(let location, let serviceName):
                // A contact's beacons are read at once and first (spec/ssdp.md 7.2, contacts first).
                let delay = table.isContact(location) ? .zero : crowdSpread()
                guard delay > .zero else {
                    enqueueFetch(location, serviceName: serviceName)
                    continue
                }
                fetchLater(location, at: .now() + delay)
            case .capExceeded:
                counters.peersRejectedAtCap += 1
                noteNarrowingAtCap()
            case .alreadyRead:
                counters.alreadyReadPeersIgnored += 1
            }
        }
    }

    /// A random wait below `trackedPeers × fetchSpreadPerPeer` (spec/ssdp.md 5): what spreads a crowd's
    /// fetches of one peer.
    private func crowdSpread() -> TimeAmount {
        var random = SystemRandomNumberGenerator()
        return configuration.limits.fetchDelay(trackedPeers: table.count, using: &random)
    }

    /// Fetches `location`'s current USN at `deadline`. A location already waiting fetches the USN current
    /// when its wait ends: a source that changes USN with every datagram gets one timer, not one per datagram.
    private func fetchLater(_ location: BeaconLocation, at deadline: NIODeadline) {
        guard spreadingLocations.insert(location).inserted else { return }
        eventLoop.scheduleTask(deadline: deadline) { [self] in
            spreadingLocations.remove(location)
            guard !stopped, let current = table.serviceName(at: location) else { return }
            enqueueFetch(location, serviceName: current)
        }
    }

    /// The table is full and narrows: counted once each time it fills up from below seven eighths of the
    /// cap (see `housekeeping`).
    private func noteNarrowingAtCap() {
        noteNarrowing(reason: "the peer table is full")
        guard !narrowingAtCap else { return }
        narrowingAtCap = true
        counters.peerCapNarrowings += 1
    }

    /// Discovery narrowed (a full table, or reading paused by its budget): the first sign of an episode
    /// reports it, once, as `.limitTriggered(.narrowed)`; `housekeeping` ends the episode after
    /// `narrowingEpisodeGap` without another.
    private func noteNarrowing(reason: String) {
        lastNarrowed = .now()
        guard !narrowingEpisode else { return }
        narrowingEpisode = true
        counters.narrowingEpisodes += 1
        logger.notice("SSDP discovery narrowed", metadata: ["reason": "\(reason)"])
        eventSink.yield(.limitTriggered(.narrowed))
    }

    /// Queues a fetch of `serviceName`; a contact's goes to the front of the queue, ahead of strangers'.
    private func enqueueFetch(_ location: BeaconLocation, serviceName: String) {
        let contact = table.isContact(location)
        guard fetchQueue.count < configuration.limits.maxTrackedPeers || contact else {
            countFailure(.notMade)
            perform(table.fetched(serviceName: serviceName, result: .failed, failure: BeaconFetchFailure(.notMade, "fetch queue full"),
                                  now: .now()))
            return
        }
        if contact { fetchQueue.insert((location, serviceName), at: 0) } else { fetchQueue.append((location, serviceName)) }
        startFetches()
    }

    private func startFetches() {
        while fetchesInFlight < configuration.limits.maxConcurrentFetches, !fetchQueue.isEmpty {
            let (location, serviceName) = fetchQueue.removeFirst()
            guard table.isCurrent(serviceName) else { continue }  // superseded while queued
            // A source that answered busy is asked again when it said, each fetch spread over the crowd.
            if let until = sources.fetchesDeferred(from: location.host, now: .now()) {
                fetchLater(location, at: until + crowdSpread())
                continue
            }
            guard !sources.isRefused(location.host, now: .now()) else {
                counters.fetchesSkippedForIgnoredSources += 1
                // Not fetched is failed: a later alive, once the wait is over, fetches it again.
                countFailure(.notMade)
                perform(table.fetched(serviceName: serviceName, result: .failed, failure: BeaconFetchFailure(.notMade, "source ignored"),
                                      now: .now()))
                continue
            }
            fetchesInFlight += 1
            let client = self.client
            Task {
                let result: Result<[UInt8], BeaconFetchError>
                do throws(BeaconFetchError) { result = .success(try await client.fetch(location)) } catch { result = .failure(error) }
                let delivery = try? await self.eventLoop.submit { self.fetchFinished(serviceName, result) }.get()
                if let (peer, bytes) = delivery ?? nil { await self.consumer(peer, bytes) }
                self.eventLoop.execute {
                    self.fetchesInFlight -= 1
                    self.startFetches()
                }
            }
        }
    }

    /// Records a fetch result; returns what to hand to the consumer.
    private func fetchFinished(_ serviceName: String, _ result: Result<[UInt8], BeaconFetchError>) -> (SSDPPeer, [UInt8])? {
        guard !stopped else { return nil }
        switch result {
        case .success(let bytes):
            counters.beaconFetchesSucceeded += 1
            anyFetchSucceeded = true
            failingSources.removeAll()
            failingSince = nil
            if let host = table.location(of: serviceName)?.host { sources.fetchSucceeded(at: host) }
            let actions = table.fetched(serviceName: serviceName, result: .fetched(bytes), now: .now())
            perform(actions)
            for case .emit(.beaconsFetched(let peer)) in actions { return (peer, bytes) }
            return nil
        case .failure(let error):
            guard let failure = error.failure else {
                if case .busy(let wait) = error.reason { deferFetches(of: serviceName, for: wait) }
                return nil
            }
            counters.beaconFetchesFailed += 1
            countFailure(failure.kind)
            let host = table.location(of: serviceName)?.host
            perform(table.fetched(serviceName: serviceName, result: .failed, failure: failure, now: .now()))
            guard let host else { return nil }
            // Per source first: a host whose locations keep failing is ignored alone.
            if sources.fetchFailed(at: host, now: .now()) {
                counters.sourcesIgnoredForFetchFailures += 1
                logger.notice("SSDP source ignored: its beacon fetches keep failing", metadata: ["source": "\(host)"])
            }
            if failure.kind.suggestsUnicastBlocked { unicastFailed(from: host) }
            return nil
        }
    }

    /// The last resort against blocked unicast: connects to `unicastFailureThreshold` distinct sources
    /// failed (no TCP connection at all), with no fetch succeeding and no peer reaching us in between,
    /// over at least `unicastFailureMinimumSpan` (`unicastFailureMinimumSpanOnceWorked` once unicast has
    /// worked in this run). A crowd that saturates its peers makes fetches time out, and connects fail
    /// while the peers they aim at are starved; but those peers still reach us, and blocked unicast would
    /// stop them too. Neither pauses our announcing.
    private func unicastFailed(from host: String) {
        let now = NIODeadline.now()
        let inbound = inboundUnicastCount
        // A peer reached us meanwhile: unicast works here, whatever our fetches meet. A new streak starts.
        if failingSince == nil || inbound != inboundAtFailingSince {
            startFailureStreak(at: now, inbound: inbound)
        }
        failingSources.insert(host)
        let limits = configuration.limits
        let unicastHasWorked = anyFetchSucceeded || inbound > 0
        let span = unicastHasWorked ? max(limits.unicastFailureMinimumSpan, limits.unicastFailureMinimumSpanOnceWorked)
                                    : limits.unicastFailureMinimumSpan
        guard let since = failingSince, failingSources.count >= limits.unicastFailureThreshold, now - since >= span else { return }
        // Our own loop stopped for a while: the fetches failed because we were not running. Start over.
        if loopStarvedDuringStreak {
            counters.unicastFailureStreaksStarved += 1
            logger.notice("SSDP unicast failures while this peer was starved of CPU: announcing goes on", metadata: [
                "sources": "\(failingSources.count)", "worstLoopLagMs": "\(counters.worstLoopLagMilliseconds)",
            ])
            startFailureStreak(at: now, inbound: inbound)
            failingSources.insert(host)
            return
        }
        failingSources.removeAll()
        failingSince = nil
        if pauseAnnouncing(for: configuration.limits.unicastFailurePause, kind: .unicastFailure) {
            counters.unicastFailurePauses += 1
        }
    }

    private func startFailureStreak(at now: NIODeadline, inbound: Int) {
        failingSources.removeAll()
        failingSince = now
        inboundAtFailingSince = inbound
        loopStarvedDuringStreak = false
    }

    /// Peers that reached us over unicast so far: requests the built-in beacon server answered, and the
    /// connections an app serving the beacons itself reported.
    private var inboundUnicastCount: Int {
        server.counters.requestsAnswered + inboundUnicastReported.withLockedValue { $0 }
    }

    /// Tells discovery that a peer on the network reached this one over unicast: for an app that serves
    /// the beacons itself (``SSDPDiscoveryConfiguration/BeaconServer/external(port:)``), once per
    /// connection it admits. Unicast that reaches us is not blocked, so the `unicastFailure` last resort
    /// (`spec/ssdp.md` §7) does not pause announcing while peers keep connecting, however many of our
    /// own fetches fail (a crowd that saturates this device). Cheap: a lock and an addition.
    public func noteInboundUnicast() {
        inboundUnicastReported.withLockedValue { $0 &+= 1 }
    }

    private func countFailure(_ kind: BeaconFetchFailure.Kind) {
        counters.beaconFetchFailuresByKind[kind, default: 0] += 1
    }

    /// A busy answer (spec/ssdp.md 6.1): the source asked to be fetched again after `wait`. Its fetches wait
    /// that long plus a spread over the crowd (§5), so the crowd it turned away does not come back in one
    /// wave. Not a failure: nothing counts toward the source's or the global failure limits, and the peer
    /// stays in the table, its fetch pending.
    private func deferFetches(of serviceName: String, for wait: TimeAmount) {
        counters.busyAnswersReceived += 1
        guard let location = table.location(of: serviceName) else { return }
        let until = NIODeadline.now() + wait
        sources.deferFetches(from: location.host, until: until)
        fetchLater(location, at: until + crowdSpread())
    }

    /// Pauses announcing; returns whether this started a pause (an ongoing one is only extended).
    @discardableResult
    private func pauseAnnouncing(for period: TimeAmount, kind: SSDPDiscoveryEvent.LimitKind) -> Bool {
        if case .paused = announcer.state {
            _ = announcer.pause(until: .now() + period)
            return false
        }
        logger.warning("SSDP announcements paused", metadata: ["limit": "\(kind.rawValue)"])
        eventSink.yield(.limitTriggered(kind))
        if let byebye = announcer.pause(until: .now() + period) { send(byebye) }
        return true
    }

    private func httpOverloaded(for period: TimeAmount) {
        eventLoop.execute { [self] in
            guard started, !stopped else { return }
            pauseAnnouncing(for: period, kind: .httpOverload)
        }
    }

    private func housekeeping() {
        let now = NIODeadline.now()
        if let last = lastHousekeeping {
            let lag = now - last - configuration.housekeepingInterval
            let lagMilliseconds = Int(lag.nanoseconds / 1_000_000)
            if lagMilliseconds > counters.worstLoopLagMilliseconds { counters.worstLoopLagMilliseconds = lagMilliseconds }
            let limit = configuration.limits.unicastFailureStarvedLoopLag
            if failingSince != nil, limit > .zero, lag >= limit { loopStarvedDuringStreak = true }
        }
        lastHousekeeping = now
        perform(table.expire(now: now))
        // Below seven eighths of the cap the table is no longer narrowing: the few peers a hall's table
        // loses to expiry between refills do not count (and log) a new narrowing each time.
        if narrowingAtCap, table.count < configuration.limits.maxTrackedPeers - configuration.limits.maxTrackedPeers / 8 {
            narrowingAtCap = false
        }
        if narrowingEpisode, !narrowingAtCap, let lastNarrowed,
           NIODeadline.now() - lastNarrowed >= configuration.limits.narrowingEpisodeGap {
            narrowingEpisode = false
        }
    }

    // MARK: Helpers

    /// Refuses timers that would spin the event loop and limits that could never be met.
    static func validate(_ configuration: SSDPDiscoveryConfiguration) throws(StartError) {
        let positiveTimes: [(String, TimeAmount)] = [
            ("foregroundAliveInterval", configuration.foregroundAliveInterval),
            ("backgroundAliveInterval", configuration.backgroundAliveInterval),
            ("searchInterval", configuration.searchInterval),
            ("housekeepingInterval", configuration.housekeepingInterval),
            ("floodWindow", configuration.limits.floodWindow),
            ("failedFetchRetryDelay", configuration.limits.failedFetchRetryDelay),
            ("maxFailedFetchRetryDelay", configuration.limits.maxFailedFetchRetryDelay),
        ]
        let nonNegativeTimes: [(String, TimeAmount)] = [
            ("fetchSpreadPerPeer", configuration.limits.fetchSpreadPerPeer),
            ("maxFetchSpread", configuration.limits.maxFetchSpread),
            ("unicastFailureMinimumSpan", configuration.limits.unicastFailureMinimumSpan),
            ("unicastFailureMinimumSpanOnceWorked", configuration.limits.unicastFailureMinimumSpanOnceWorked),
            ("unicastFailureStarvedLoopLag", configuration.limits.unicastFailureStarvedLoopLag),
        ]
        for (name, value) in nonNegativeTimes where value < .zero { throw .invalidConfiguration(name) }
        for (name, value) in positiveTimes where value <= .zero { throw .invalidConfiguration(name) }
        let positiveCounts: [(String, Int)] = [
            ("maxAge", configuration.maxAge), ("maxDatagramsPerWindow", configuration.limits.maxDatagramsPerWindow),
            ("maxDatagramsReadPerWindow", configuration.limits.maxDatagramsReadPerWindow),
            ("maxTrackedPeers", configuration.limits.maxTrackedPeers),
            ("maxConcurrentFetches", configuration.limits.maxConcurrentFetches),
            ("unicastFailureThreshold", configuration.limits.unicastFailureThreshold),
            ("maxDatagramsPerSource", configuration.limits.maxDatagramsPerSource),
            ("maxPeersPerSource", configuration.limits.maxPeersPerSource),
            ("sourceFetchFailureThreshold", configuration.limits.sourceFetchFailureThreshold),
            ("maxTrackedSources", configuration.limits.maxTrackedSources),
            ("maxDatagramBytes", configuration.parserLimits.maxDatagramBytes),
        ]
        for (name, value) in positiveCounts where value <= 0 { throw .invalidConfiguration(name) }
        guard (1...65535).contains(configuration.port) else { throw .invalidConfiguration("port") }
    }

    /// RFC 1123 date for the DATE header.
    static func httpDate() -> String {
        var now = time(nil)
        var parts = tm()
        gmtime_r(&now, &parts)
        var buffer = [CChar](repeating: 0, count: 64)
        let length = strftime(&buffer, buffer.count, "%a, %d %b %Y %H:%M:%S GMT", &parts)
        return String(decoding: buffer.prefix(length).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
