import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

/// Thali Wi-Fi discovery: announces this peer's beacon location over SSDP, answers searches, tracks the
/// peers it hears, fetches each peer's beacons once per USN and hands them to a consumer, and serves its
/// own beacons at `/NotificationBeacons`. Beacons are opaque bytes here; the app plugs in their parser.
///
/// All mutable state lives on one event loop (`eventLoop`); public methods hop there. Call `stop()` when
/// done: it sends the byebye and releases the sockets, timers and the beacon server. What to send, track,
/// fetch and limit is decided by a value with no I/O (`SSDPDiscoveryPolicy`, tested in virtual time); this
/// class feeds it datagrams, fetch outcomes and timers with the time, and does the I/O its actions ask for.
public final class SSDPDiscoveryService: @unchecked Sendable {
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
    /// The beacon client, its source the pinned address (replaced by ``move(to:port:)``; loop-confined).
    private var client: BeaconHTTPClient
    let server: BeaconHTTPServer
    /// Connections from peers that an app serving the beacons itself reported (``noteInboundUnicast()``).
    private let inboundUnicastReported = NIOLockedValueBox(0)

    // Loop-confined state. The policy decides; the service only does the I/O its actions ask for.
    private var policy: SSDPDiscoveryPolicy
    private var started = false
    private var multicastChannel: Channel?
    private var unicastChannel: Channel?
    /// The pinned interface address (for the group join).
    private var device: SocketAddress?
    private var groupSocketAddress: SocketAddress?
    /// The policy's timers not fired yet, cancelled at stop (so that none keeps the service alive).
    private var armed: [UInt64: Scheduled<Void>] = [:]
    private var nextTimerID: UInt64 = 0

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
        self.policy = SSDPDiscoveryPolicy(configuration: configuration)
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
        try configuration.validate()
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
                self.policy.serve(at: BeaconLocation(host: self.configuration.interfaceAddress, port: httpPort))
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
        try await eventLoop.submit { _ = self.perform(self.policy.start(advertising: beacons != nil, now: .now())) }.get()
    }

    /// Advertises a new beacon stream (nil: none). Sends byebye for the old USN, then alive for a new one.
    public func advertise(_ beacons: [UInt8]?) async {
        server.setBeacons(beacons)
        try? await eventLoop.submit {
            guard self.started, !self.policy.isStopped else { return }
            self.perform(self.policy.advertise(beacons != nil))
        }.get()
    }

    /// The interface's address changed (a phone joined another access point): discovery moves to
    /// `address` and keeps its USN. The byebye for the USN leaves from the old socket first, where the
    /// old address still reaches the segment (counted in `byebyesUnsent` when it cannot); the sockets
    /// reopen on `address` (the group joined there); the alive for the same USN at the new LOCATION goes
    /// out at once, so listeners move the USN's entry and drop the old location (`spec/ssdp.md` §4.3);
    /// and a search goes out, as on joining. The port announced stays the one the app serves on
    /// (``SSDPDiscoveryConfiguration/BeaconServer/external(port:)``), or `port` when given (the app's
    /// port moved too). Throws ``StartError/noInterface(address:)`` when no interface has `address`.
    public func move(to address: String, port: Int? = nil) async throws {
        guard IPv4Text(Substring(address)) != nil else { throw StartError.invalidAddress(address) }
        guard case .external = configuration.beaconServer else { throw MoveError.builtInServer }
        guard LocalAddress.isLocal(address) else { throw StartError.noInterface(address: address) }
        let device = try SocketAddress(ipAddress: address, port: 0)
        let moved = { var moved = self.configuration; moved.interfaceAddress = address; return moved }()
        let (old, byebyeSent) = try await eventLoop.submit { () throws -> ([Channel], EventLoopFuture<Void>?) in
            guard self.started, !self.policy.isStopped else { throw MoveError.notRunning }
            let location = BeaconLocation(host: address, port: port ?? self.policy.location.port)
            let byebye = self.policy.moving(to: location).map { self.send($0) }
            let old = [self.multicastChannel, self.unicastChannel].compactMap { $0 }
            (self.multicastChannel, self.unicastChannel) = (nil, nil)
            self.device = device
            var clientConfiguration = moved.client
            if clientConfiguration.sourceAddress == nil || clientConfiguration.sourceAddress == self.configuration.interfaceAddress {
                clientConfiguration.sourceAddress = address
            }
            // The round trips learnt stay: the hosts fetched from are the same, only our address moved.
            self.client = BeaconHTTPClient(configuration: clientConfiguration, group: self.group, roundTrips: self.client.roundTrips)
            return (old, byebye)
        }.get()
        do {
            try await byebyeSent?.get()
        } catch {
            // The old address is gone (EADDRNOTAVAIL/EINVAL): the alive for the same USN at the new
            // LOCATION, below, is what drops the old location at listeners.
            _ = try? await eventLoop.submit { self.policy.counters.byebyesUnsent += 1 }.get()
        }
        for channel in old { try? await channel.close() }
        let unicast = try await SSDPSockets.openUnicast(configuration: moved, on: eventLoop) { [self] envelope in received(envelope) }.get()
        let keep = try await eventLoop.submit { () -> Bool in
            guard !self.policy.isStopped else { return false }
            self.unicastChannel = unicast
            if self.policy.isReadingPaused { unicast.setOption(ChannelOptions.autoRead, value: false).whenFailure { _ in } }
            return true
        }.get()
        guard keep else {
            try? await unicast.close()
            return
        }
        // Discovery switched off by a flood rejoins when its cool-down ends; otherwise now.
        let discoveryOff = try await eventLoop.submit { self.policy.isDiscoveryOff }.get()
        if !discoveryOff { try await joinGroup().get() }
        try await eventLoop.submit { _ = self.perform(self.policy.moved(now: .now())) }.get()
    }

    /// Stops announcing for `period` (byebye now, alive again after it), reported as
    /// `.limitTriggered(.httpOverload)`: for an app serving the beacons itself
    /// (``SSDPDiscoveryConfiguration/BeaconServer/external(port:)``) whose port closed for an overload.
    public func pauseAnnouncing(for period: Duration) {
        httpOverloaded(for: period)
    }

    /// Switches between the foreground (500 ms) and background (60 s) announcement rates.
    public func setBackground(_ background: Bool) async {
        try? await eventLoop.submit {
            let actions = self.policy.setBackground(background, now: .now())
            if self.started { self.perform(actions) }  // before start, start arms the alive timer itself
        }.get()
    }

    /// Clean shutdown: byebye for our USN, then sockets and server closed; tracked peers reported as left.
    public func stop() async {
        let (channels, byebyeSent) = (try? await eventLoop.submit { () -> ([Channel], EventLoopFuture<Void>?) in
            guard self.started, !self.policy.isStopped else { return ([], nil) }
            let (byebye, actions) = self.policy.stop(now: .now())
            let byebyeSent = byebye.map { self.send($0) }
            for timer in self.armed.values { timer.cancel() }
            self.armed = [:]
            self.perform(actions)
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

    /// Tells discovery that the beacons fetched from `location` matched one of the app's contacts: its
    /// source keeps its place in a full table and its fetches go ahead of strangers' (spec/ssdp.md 7.2).
    /// At most `maxContactSources` sources are remembered, the latest first.
    public func markContact(at location: BeaconLocation) {
        eventLoop.execute { [self] in policy.markContact(host: location.host) }
    }

    /// Tells discovery that a peer on the network reached this one over unicast: for an app that serves
    /// the beacons itself (``SSDPDiscoveryConfiguration/BeaconServer/external(port:)``), once per
    /// connection it admits. Unicast that reaches us is not blocked, so the `unicastFailure` last resort
    /// (`spec/ssdp.md` §7) does not pause announcing while peers keep connecting, however many of our
    /// own fetches fail (a crowd that saturates this device). Cheap: a lock and an addition.
    public func noteInboundUnicast() {
        inboundUnicastReported.withLockedValue { $0 &+= 1 }
    }

    /// Reads `value` of the policy on the loop (`fallback` once the loop is gone).
    func read<Value: Sendable>(_ fallback: Value, _ value: @escaping @Sendable (SSDPDiscoveryPolicy) -> Value) async -> Value {
        (try? await eventLoop.submit { value(self.policy) }.get()) ?? fallback
    }

    // MARK: Sockets

    private func openUnicastChannel() -> EventLoopFuture<Channel> {
        SSDPSockets.openUnicast(configuration: configuration, on: eventLoop) { [self] envelope in received(envelope) }
    }

    /// Opens the multicast socket and joins the group on the pinned interface (reading paused if the
    /// policy pauses it).
    private func joinGroup() -> EventLoopFuture<Void> {
        eventLoop.flatSubmit { [self] in
            guard let groupSocketAddress, let device else { return eventLoop.makeSucceededVoidFuture() }
            return SSDPSockets.openMulticast(configuration: configuration, group: groupSocketAddress, device: device,
                                             on: eventLoop) { [self] envelope in received(envelope) }
                .map { [self] channel in
                    if policy.isStopped { channel.close(promise: nil) } else {
                        multicastChannel = channel
                        if policy.isReadingPaused { channel.setOption(ChannelOptions.autoRead, value: false).whenFailure { _ in } }
                    }
                }
        }
    }

    // MARK: The policy's actions

    /// Does what the policy asks, in order; returns the fetched beacons to hand to the consumer.
    @discardableResult
    private func perform(_ actions: [SSDPDiscoveryPolicy.Action]) -> [(SSDPPeer, [UInt8])] {
        var deliveries: [(SSDPPeer, [UInt8])] = []
        for action in actions {
            switch action {
            case .emit(let event): eventSink.yield(event)
            case .send(let message, let destination): send(message, to: destination)
            case .startFetch(let location, let serviceName): fetch(location, serviceName: serviceName)
            case .deliver(let peer, let bytes): deliveries.append((peer, bytes))
            case .arm(let timer, let deadline):
                let id = nextTimerID
                nextTimerID &+= 1
                armed[id] = eventLoop.scheduleTask(deadline: deadline) { [self] in
                    armed[id] = nil
                    perform(policy.timerFired(timer, now: .now(), date: Self.httpDate))
                }
            case .pauseReading(let paused):
                for channel in [multicastChannel, unicastChannel].compactMap({ $0 }) {
                    channel.setOption(ChannelOptions.autoRead, value: !paused).whenFailure { _ in }
                }
            case .closeMulticast:
                multicastChannel?.close(promise: nil)
                multicastChannel = nil
            case .rejoinGroup:
                joinGroup().whenComplete { [self] result in
                    if case .failure(let error) = result {
                        logger.error("SSDP could not rejoin the group", metadata: ["error": "\(error)"])
                    }
                    perform(policy.rejoined(now: .now()))
                }
            case .log(let level, let message, let metadata):
                logger.log(level: level, message, metadata: metadata)
            }
        }
        return deliveries
    }

    @discardableResult
    private func send(_ message: SSDPMessage, to destination: SocketAddress? = nil) -> EventLoopFuture<Void> {
        guard let channel = unicastChannel, let target = destination ?? groupSocketAddress else {
            return eventLoop.makeSucceededVoidFuture()
        }
        policy.countSent(message)
        let buffer = channel.allocator.buffer(bytes: message.serialize())
        return channel.writeAndFlush(AddressedEnvelope(remoteAddress: target, data: buffer))
    }

    private func received(_ envelope: AddressedEnvelope<ByteBuffer>) {
        perform(policy.received(datagram: envelope.data.readableBytesView, from: envelope.remoteAddress, now: .now()))
    }

    /// Fetches `location`'s beacons off the loop; the outcome goes back to the policy, the beacons to the
    /// consumer, and only then the fetch gives its slot back.
    private func fetch(_ location: BeaconLocation, serviceName: String) {
        let client = self.client
        Task {
            let result: Result<[UInt8], BeaconFetchError>
            do throws(BeaconFetchError) { result = .success(try await client.fetch(location)) } catch { result = .failure(error) }
            let deliveries = try? await self.eventLoop.submit {
                self.perform(self.policy.fetchFinished(serviceName, outcome: .init(result),
                                                       inboundUnicast: self.inboundUnicastCount, now: .now()))
            }.get()
            for (peer, bytes) in deliveries ?? [] { await self.consumer(peer, bytes) }
            self.eventLoop.execute { self.perform(self.policy.fetchEnded(now: .now())) }
        }
    }

    /// Peers that reached us over unicast so far: requests the built-in beacon server answered, and the
    /// connections an app serving the beacons itself reported.
    private var inboundUnicastCount: Int {
        server.counters.requestsAnswered + inboundUnicastReported.withLockedValue { $0 }
    }

    private func httpOverloaded(for period: Duration) {
        eventLoop.execute { [self] in
            guard started, !policy.isStopped else { return }
            perform(policy.pauseAnnouncing(for: TimeAmount(period), kind: .httpOverload, now: .now()))
        }
    }
}
