import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import TCPMultiplexer
import ThaliAdmission
import ThaliBLEBinding
import ThaliNodeCore
import ThaliSSDP

/// How a `ThaliPeer` uses Bluetooth (`PeerConfiguration.bluetooth`).
public struct BluetoothPeerConfiguration: Sendable {
    /// The RFCOMM channel a node listens on unless told otherwise.
    public static let defaultChannel: UInt8 = 9

    /// The adapter (`hci0`), or nil for the first powered one.
    public var adapter: String?
    /// The system bus (bluetoothd's), as a D-Bus address.
    public var busAddress: String = "unix:path=/run/dbus/system_bus_socket"
    /// The RFCOMM channel this node listens on and connects to on its peers.
    public var channel: UInt8 = BluetoothPeerConfiguration.defaultChannel
    /// The binding's DoS bounds and timeouts (handshake, incoming rate, relay idle time).
    public var limits = BluetoothBindingLimits()
    /// The multiplexer below TLS on every Bluetooth connection (bounded: nobody is authenticated yet).
    public var multiplexer: MultiplexerConfiguration = .beforeAuthentication
    /// While connected to a peer, how often its beacons are fetched again: its BLE advertisement carries
    /// only its address, which does not change when its beacons do.
    public var beaconRefetchInterval: Duration = .seconds(5)
    /// The most peers connected at once (each holds one RFCOMM link and its relay). In a crowd, peers
    /// heard while every slot is taken wait in turn (`maxWaitingPeers`), and a link gives its slot up
    /// to the first of them whenever it would wait: idle after a beacon fetch (no stream open on it), or
    /// pausing after a failed connect; its peer then queues again at the back.
    public var maxConnectedPeers: Int = 8
    /// The most peers remembered, oldest first, while they wait for a link slot. One heard when this
    /// many already wait is not remembered: its next advertisement report offers it again.
    public var maxWaitingPeers: Int = 64
    /// After a connection to a peer ended or failed, the pause before reaching it again (doubled, up to
    /// 16 times, after each failure in a row; jittered); also how long the higher of two addresses lets
    /// the lower connect first when the lower cannot know about it (we do not advertise).
    public var reconnectDelay: Duration = .seconds(2)
    /// While this node advertises, how long the higher of two addresses waits for the lower one's link
    /// before connecting itself: the lower one sees our advertisement and connects at once, and two
    /// connects that cross collide and both fail after the kernel's connect timeout (about 30 s; seen on
    /// emulated controllers). The lower one's link ends the wait.
    public var yieldToLowerAddress: Duration = .seconds(5)
    /// Connects to one peer that may fail in a row before it is left until its next advertisement report.
    public var maxConnectAttempts: Int = 4
    /// Whether the node turns the adapter's page scan on when bluetoothd left it off (by making the adapter
    /// discoverable for its `DiscoverableTimeout`; page scan stays on afterwards, until the node stops).
    /// Without page scan no peer can connect to this node. Off: the node only warns.
    public var makeConnectable = true
    /// Makes the RFCOMM streams, given our adapter's address: the kernel's RFCOMM bound to that adapter.
    /// Tests on machines without a radio put a stand-in transport here; nothing above it changes.
    public var transport: @Sendable (BluetoothAddress) -> any BluetoothTransport = { RFCOMMTransport(localAddress: $0) }

    /// The pause before reaching a peer again after its connection ended (retry 1) or after `n` failed
    /// connects in a row (retry n + 1): `reconnectDelay` doubling up to 16 times it, ±50 %.
    public var reconnectBackoff: Backoff {
        Backoff(base: reconnectDelay, cap: reconnectDelay * 16, jitter: 0.5)
    }

    /// The short pause of the higher address when it cannot wait for the lower one's link:
    /// `reconnectDelay` ±25 %.
    public var yieldPause: Backoff {
        Backoff(base: reconnectDelay, cap: reconnectDelay, jitter: 0.25)
    }

    /// Bluetooth on `adapter` (nil: the first powered one), defaults elsewhere.
    public init(adapter: String? = nil) {
        self.adapter = adapter
    }
}

/// The Bluetooth binding of a peer: advertises our adapter's address over BLE while we have beacons to
/// serve, scans for Thali advertisements, and reaches each peer found over RFCOMM, its handshake and a
/// multiplexer, so that the peer's beacons and its PSK-TLS port appear at a localhost port. Incoming
/// RFCOMM connections go the other way: each multiplexer stream becomes a connection to our own port.
/// Everything above (beacon matching, PSK-TLS, delivery) is the peer's and the same as over Wi-Fi.
final class PeerBluetoothBinding: PeerBindingService {
    let kind = PeerBindingKind.bluetooth

    /// A peer to reach, or waiting for a link slot: the advertiser BlueZ reported it as (nil for a peer
    /// that connected to us), and its failed connects in a row so far (carried across its turns, so that
    /// a peer that went away still runs out of attempts).
    private struct Candidate {
        var peer: BluetoothAddress
        var advertiser: BluetoothAddress?
        var failures = 0
    }

    /// How a pursuit of a peer ended.
    private enum PursuitEnd {
        /// `maxConnectAttempts` connects failed in a row, or the binding stopped.
        case gaveUp
        /// It gave its slot to a waiting peer, with this many failed connects in a row.
        case yielded(failures: Int)
    }

    /// How one attempt to reach a peer ended.
    private enum ReachOutcome {
        /// No link: the connect failed.
        case failed
        /// The link came up and has ended.
        case ended
        /// The link was idle while another peer waited for a slot: closed (or left to its owner).
        case yielded
    }

    private struct State {
        var client: BlueZClient?
        var ownAddress: BluetoothAddress?
        var server: BluetoothRelayServer?
        var gateway: MultiplexedAppGateway?
        var connections: [BluetoothAddress: MultiplexedBluetoothConnection] = [:]
        /// Peers being reached or connected (one task each).
        var pursued: Set<BluetoothAddress> = []
        /// Peers heard while every link slot was taken, in the order they get one.
        var waiting: [Candidate] = []
        var advertising = false
        /// Whether we turned the adapter's `Discoverable` on (to get page scan): stop turns it off again.
        var madeDiscoverable = false
        /// Turning page scan on, if it was off: advertising waits for it.
        var connectable: Task<Void, Never>?
        /// Local relay ports handed out, newest last (the last 256): `hasEnded` tells ours from others.
        var issuedPorts: [Int] = []
        /// Links peers made to us, by the source their relayed connections come from (their
        /// `loopbackSource`): the local port that reaches their node over the same link, and its end.
        var incoming: [String: (port: Int, closeFuture: EventLoopFuture<Void>)] = [:]
        /// Peers that connected to us saying they hold notifications, by their `loopbackSource`, until
        /// their session reaches the gateway: reaching them before that would open a second link.
        var awaitingSession: [String: BluetoothAddress] = [:]
        /// Pursuits of a lower address waiting for its link to us, by its `loopbackSource`.
        var linkWaiters: [String: LinkWakeSignal] = [:]
        /// Our node's port, where streams from peers go.
        var node: (host: String, port: Int)?
        var tasks: [UUID: Task<Void, Never>] = [:]
        var stopped = false

        /// Queues `candidate` for a slot unless it waits already; false when `limit` peers wait.
        mutating func enqueue(_ candidate: Candidate, limit: Int) -> Bool {
            if waiting.contains(where: { $0.peer == candidate.peer }) { return true }
            guard waiting.count < limit else { return false }
            waiting.append(candidate)
            return true
        }
    }

    let configuration: BluetoothPeerConfiguration
    private let group: any EventLoopGroup
    private let logger: Logger
    private let fetcher: BeaconHTTPClient
    private let state = NIOLockedValueBox(State())
    private let events = NIOLockedValueBox<@Sendable (PeerBindingEvent) -> Void>({ _ in })

    init(configuration: BluetoothPeerConfiguration, group: any EventLoopGroup, logger: Logger) {
        self.configuration = configuration
        self.group = group
        self.logger = logger
        // Over a relay the first response takes longer than on a LAN.
        var fetch = BeaconHTTPClientConfiguration()
        fetch.connectTimeout = .seconds(5)
        fetch.responseTimeout = .seconds(10)
        self.fetcher = BeaconHTTPClient(configuration: fetch, group: group)
    }

    /// Our adapter's address, once started.
    var ownAddress: BluetoothAddress? { state.withLockedValue { $0.ownAddress } }

    /// Checks that the kernel has Bluetooth, finds the adapter, listens on RFCOMM (streams joined to
    /// `nodeHost:nodePort`) and starts scanning. Throws a `BluetoothTransportError` or `BlueZError` whose
    /// description says what is missing, the most basic first: the kernel, the bus, bluetoothd, the adapter.
    func start(nodeHost: String, nodePort: Int, events: @escaping @Sendable (PeerBindingEvent) -> Void) async throws {
        self.events.withLockedValue { $0 = events }
        try configuration.transport(.any).checkAvailable()
        var bluez = BlueZConfiguration(busAddress: configuration.busAddress, adapterName: configuration.adapter)
        bluez.limits = configuration.limits
        let client = try BlueZClient(configuration: bluez)
        do {
            let adapter = try await client.adapter()
            guard let address = adapter.address else {
                throw BlueZError.unexpectedReply("the adapter has no address")
            }
            let transport = configuration.transport(address)
            let gateway = try await MultiplexedAppGateway.start(
                group: group, configuration: configuration.multiplexer,
                streamInitializer: MultiplexerBridge.connectingInitializer(host: nodeHost, port: nodePort, fromCarrierSource: true),
                onSession: { [weak self] session in self?.incomingLink(session) })
            // Each peer's relayed connections come from its own loopback address (and the gateway's
            // streams from the same one), so our port's per-source admission limits count peers apart.
            let server = BluetoothRelayServer(transport: transport, group: group,
                                              appPort: gateway.port, limits: configuration.limits, sourcePerPeer: true)
            state.withLockedValue {
                $0.node = (nodeHost, nodePort)
                $0.client = client
                $0.ownAddress = address
                $0.gateway = gateway
                $0.server = server
            }
            try await server.start(channel: configuration.channel)
            // Beside the scan, not before it: the kernel takes a moment to turn page scan on. Advertising
            // waits for it, so that peers who see us can connect.
            let connectable = Task { [weak self] in _ = await self?.makeConnectable(client: client, adapter: adapter, transport: transport) }
            state.withLockedValue {
                $0.tasks[UUID()] = connectable
                $0.connectable = connectable
            }
            let serving = Task { [weak self] in
                for await event in server.events { self?.serverEvent(event) }
            }
            state.withLockedValue { $0.tasks[UUID()] = serving }
            let discoveries = try await client.scan()
            let scanning = Task { [weak self] in
                do {
                    for try await discovery in discoveries { self?.discovered(discovery) }
                } catch {
                    self?.logger.error("Bluetooth scan ended", metadata: ["error": "\(error)"])
                }
            }
            state.withLockedValue { $0.tasks[UUID()] = scanning }
        } catch {
            await stop()
            client.close()
            throw error
        }
    }

    /// Peers reach this node only if its controller has page scan on, which bluetoothd (with the kernel's
    /// connection control) leaves off unless the adapter is discoverable or has paired devices, so on a
    /// stock system nobody could connect to us. If it is off, turn `Discoverable` on: page scan comes on
    /// with it and stays on after the discoverable period; `stop` turns both off again. If that does not
    /// work, say what would.
    private func makeConnectable(client: BlueZClient, adapter: BlueZAdapter, transport: any BluetoothTransport) async {
        guard let index = adapter.index, transport.acceptsIncomingStreams(adapterIndex: index) == false else { return }
        let remedy = "peers cannot connect to this node until it is on (btmgmt --index \(index) connectable on)"
        guard configuration.makeConnectable else {
            logger.warning("Bluetooth adapter hci\(index) has page scan off: \(remedy)")
            return
        }
        do {
            try await client.setDiscoverable(true)
            state.withLockedValue { $0.madeDiscoverable = true }
            for _ in 0..<30 {
                if transport.acceptsIncomingStreams(adapterIndex: index) == true {
                    logger.notice("""
                        Bluetooth adapter hci\(index) had page scan off; made it discoverable, which turns page scan on \
                        for as long as this node runs
                        """)
                    return
                }
                try await Task.sleep(for: .milliseconds(100))
            }
            logger.warning("Bluetooth adapter hci\(index) is discoverable but page scan is still off: \(remedy)")
        } catch is CancellationError {
            return
        } catch {
            logger.warning("Bluetooth adapter hci\(index) has page scan off and could not be made discoverable (\(error)): \(remedy)")
        }
    }

    /// Advertises our adapter's address while the node has an announcement, re-registered on every
    /// change so that scanners report it anew (a rotation changes nothing on the air: peers refetch).
    func advertise(_ announcement: [UInt8]?, isRotation: Bool) async {
        guard !isRotation else { return }
        if let connectable = state.withLockedValue({ $0.connectable }) { await connectable.value }
        let on = announcement != nil
        let (client, address, was) = state.withLockedValue { ($0.client, $0.ownAddress, $0.advertising) }
        guard let client, let address else { return }
        do {
            if on {
                try await client.advertise(ThaliAdvertisement(payload: .bluetoothAddress(address)))
            } else if was {
                try await client.stopAdvertising()
            }
            state.withLockedValue { $0.advertising = on }
        } catch {
            logger.error("Bluetooth advertising failed", metadata: ["error": "\(error)"])
        }
    }

    /// Nothing to pause: a peer that connects while the port is closed finds its relayed connections
    /// refused, and the binding's own rate limits apply before that.
    func pauseAnnouncing(for period: TimeAmount) {}

    func location() async -> PeerLocation? {
        ownAddress.map(PeerLocation.bluetooth)
    }

    private func report(_ event: PeerBindingEvent) {
        events.withLockedValue { $0 }(event)
    }

    /// Whether `location` was one of our relay ports whose Bluetooth connection has ended: nothing will
    /// answer there again, so a link should wait for the peer's next match instead of retrying it.
    func hasEnded(_ location: BeaconLocation) -> Bool {
        state.withLockedValue { state in
            state.issuedPorts.contains(location.port)
                && !state.connections.values.contains { $0.localPort == location.port }
                && !state.incoming.values.contains { $0.port == location.port }
        }
    }

    /// A Bluetooth peer's streams reach our port from its `loopbackSource`, over its link to us or ours to it.
    func carries(remoteHost: String) -> Bool {
        state.withLockedValue { state in
            state.incoming[remoteHost] != nil || state.connections.keys.contains { $0.loopbackSource == remoteHost }
                || state.pursued.contains { $0.loopbackSource == remoteHost }
        }
    }

    func stop() async {
        let (tasks, connections, server, gateway, client) = state.withLockedValue { state in
            state.stopped = true
            defer {
                state.tasks = [:]
                state.connections = [:]
            }
            return (Array(state.tasks.values), Array(state.connections.values), state.server, state.gateway, state.client)
        }
        for task in tasks { task.cancel() }
        try? await client?.stopScanning()
        try? await client?.stopAdvertising()
        if state.withLockedValue({ $0.madeDiscoverable }) { try? await client?.setDiscoverable(false) }
        server?.stop()
        await gateway?.close()
        for connection in connections { await connection.close() }
        for task in tasks { await task.value }
        client?.close()
    }

    private func serverEvent(_ event: BluetoothServerEvent) {
        switch event {
        case .relayed(let peer, _):
            logger.debug("Bluetooth connection relayed to our port", metadata: ["peer": "\(peer)"])
        case .discoveredByConnection(let peer):
            // The seed's surprise connection: a peer that has beacons connected before we saw its
            // advertisement; reach it as if we had, over its link once the gateway has its session.
            let ready = state.withLockedValue { state -> Bool in
                // Bounded: past the cap, reach it at once (at worst over a second link).
                guard state.incoming[peer.loopbackSource] == nil,
                      state.awaitingSession.count < configuration.maxConnectedPeers else { return true }
                state.awaitingSession[peer.loopbackSource] = peer
                return false
            }
            if ready { pursueIfNew(Candidate(peer: peer)) }
        case .refused(let decision):
            logger.info("Bluetooth connection refused", metadata: ["decision": "\(decision)"])
        case .handshakeFailed(let peer, let violation):
            logger.info("Bluetooth handshake failed", metadata: ["peer": "\(peer)", "violation": "\(violation)"])
        case .appUnreachable(let peer):
            state.withLockedValue { _ = $0.awaitingSession.removeValue(forKey: peer.loopbackSource) }
            logger.error("our port was unreachable for a Bluetooth connection", metadata: ["peer": "\(peer)"])
        }
    }

    /// A Thali advertisement: pursue the peer unless we already do.
    private func discovered(_ discovery: ThaliPeerDiscovery) {
        guard let peer = discovery.peerAddress else { return }  // no address to connect to (iOS form)
        pursueIfNew(Candidate(peer: peer, advertiser: discovery.advertiserAddress))
    }

    /// Pursues `candidate` if a link slot is free, else queues it (a crowd: peers take turns).
    private func pursueIfNew(_ candidate: Candidate) {
        enum Start { case now, queued, notRemembered, no }
        let start = state.withLockedValue { state -> Start in
            guard !state.stopped, candidate.peer != state.ownAddress, !state.pursued.contains(candidate.peer) else { return .no }
            guard state.pursued.count < configuration.maxConnectedPeers else {
                return state.enqueue(candidate, limit: configuration.maxWaitingPeers) ? .queued : .notRemembered
            }
            state.pursued.insert(candidate.peer)
            state.waiting.removeAll { $0.peer == candidate.peer }  // reached now, not on a later turn
            return .now
        }
        switch start {
        case .now: break
        case .notRemembered:
            // BlueZ reports an unchanged advertisement once: let its next report offer this peer again.
            if let advertiser = candidate.advertiser { state.withLockedValue { $0.client }?.forget(advertiser) }
            return
        case .queued, .no: return
        }
        let id = UUID()
        let task = Task { [weak self] in
            guard let end = await self?.pursue(candidate.peer, failures: candidate.failures), let self else { return }
            let (next, remembered) = state.withLockedValue { state -> (Candidate?, Bool) in
                state.pursued.remove(candidate.peer)
                state.tasks.removeValue(forKey: id)
                let next = state.waiting.isEmpty ? nil : state.waiting.removeFirst()
                guard case .yielded(let failures) = end, !state.stopped else { return (next, false) }
                var again = candidate
                again.failures = failures
                // Nobody waits any more: it takes its slot straight back. Otherwise to the back of the queue.
                guard let next else { return (again, true) }
                return (next, state.enqueue(again, limit: configuration.maxWaitingPeers))
            }
            // Reports of an unchanged advertisement are not discoveries: a peer neither pursued nor waiting
            // is forgotten, so that its next report starts over if it is still there.
            if !remembered, let advertiser = candidate.advertiser { state.withLockedValue { $0.client }?.forget(advertiser) }
            if let next { pursueIfNew(next) }
        }
        state.withLockedValue { $0.tasks[id] = task }
    }

    /// Whether a peer waits for a link slot.
    private var peerWaiting: Bool { state.withLockedValue { !$0.waiting.isEmpty } }

    /// Reaches `peer` and keeps reaching it when the connection ends, until `maxConnectAttempts`
    /// attempts in a row fail (each after a doubling, jittered pause from `reconnectDelay`), or until it
    /// gives its slot to a waiting peer: when its link is idle, or instead of a pause.
    private func pursue(_ peer: BluetoothAddress, failures: Int) async -> PursuitEnd {
        report(.peerAppeared(origin: .bluetooth(peer)))
        guard let own = state.withLockedValue({ $0.ownAddress }) else { return .gaveUp }
        // Two peers that find each other connect to each other at once; under emulation (and on some
        // controllers) the crossing pages collide and both connects time out. The higher address lets
        // the lower one go first, so its own connect then rides on the link that already exists. While
        // we advertise the lower one sees us and will come: wait for its link (up to a bound); if we do
        // not, it may never come: a short pause.
        if own.octets.lexicographicallyPrecedes(peer.octets) == false {
            let source = peer.loopbackSource
            let waiter = state.withLockedValue { state -> LinkWakeSignal? in
                guard state.advertising, state.incoming[source] == nil else { return nil }
                let signal = LinkWakeSignal()
                state.linkWaiters[source] = signal
                return signal
            }
            if let waiter {
                await waiter.wait(upTo: configuration.yieldToLowerAddress)
                state.withLockedValue { state in
                    if state.linkWaiters[source] === waiter { state.linkWaiters[source] = nil }
                }
            } else {
                try? await Task.sleep(for: configuration.yieldPause.delay(beforeRetry: 1))
            }
        }
        var failures = failures
        while !Task.isCancelled, !state.withLockedValue({ $0.stopped }) {
            switch await reach(peer, from: own) {
            case .yielded: return .yielded(failures: 0)
            case .ended: failures = 0
            case .failed: failures += 1
            }
            if failures >= configuration.maxConnectAttempts { return .gaveUp }
            if peerWaiting { return .yielded(failures: failures) }
            try? await Task.sleep(for: configuration.reconnectBackoff.delay(beforeRetry: failures + 1))
        }
        return .gaveUp
    }

    /// A peer connected to us: its link also reaches its node, through `session.localPort`, so reaching
    /// that peer needs no second Bluetooth connection (``reach(_:from:)`` uses this one).
    private func incomingLink(_ session: MultiplexedAppGateway.Session) {
        guard let source = session.source else { return }
        let (announced, waiter) = state.withLockedValue { state -> (BluetoothAddress?, LinkWakeSignal?) in
            state.incoming[source] = (session.localPort, session.closeFuture)
            state.issuedPorts.append(session.localPort)
            if state.issuedPorts.count > 256 { state.issuedPorts.removeFirst() }
            return (state.awaitingSession.removeValue(forKey: source), state.linkWaiters.removeValue(forKey: source))
        }
        waiter?.signal()
        session.closeFuture.whenComplete { [weak self] _ in
            self?.state.withLockedValue { state in
                if state.incoming[source]?.port == session.localPort { state.incoming[source] = nil }
            }
        }
        if let announced { pursueIfNew(Candidate(peer: announced)) }
    }

    /// Reaches `peer` over the link it made to us if there is one, else connects (and that link carries
    /// the peer's streams to us too); then fetches its beacons now and every `beaconRefetchInterval`
    /// while the link lasts, or until it is idle while another peer waits for a slot.
    private func reach(_ peer: BluetoothAddress, from own: BluetoothAddress) async -> ReachOutcome {
        let origin = PeerLocation.bluetooth(peer)
        let (advertising, incoming, node) = state.withLockedValue { ($0.advertising, $0.incoming[peer.loopbackSource], $0.node) }
        if let incoming {
            logger.debug("reaching a Bluetooth peer over the link it made", metadata: ["peer": "\(peer)"])
            // The link is the peer's: giving our slot up only stops our fetches, its streams go on.
            let yielded = await fetchBeacons(of: peer, origin: origin, port: incoming.port, until: incoming.closeFuture) { true }
            return yielded ? .yielded : .ended
        }
        let connection: MultiplexedBluetoothConnection
        do {
            let client = MultiplexedBluetoothClient(transport: configuration.transport(own), group: group,
                                                    limits: configuration.limits, configuration: configuration.multiplexer)
            // The peer's streams over this link reach our port from its own loopback source, as over its links.
            let inbound = node.map { MultiplexerBridge.connectingInitializer(host: $0.host, port: $0.port, source: peer.loopbackSource) }
            connection = try await client.connect(to: peer, channel: configuration.channel, hasNotifications: advertising,
                                                  inboundStreamInitializer: inbound)
        } catch {
            logger.info("Bluetooth connect failed", metadata: ["peer": "\(peer)", "error": "\(error)"])
            return .failed
        }
        let kept = state.withLockedValue { state -> Bool in
            guard !state.stopped else { return false }
            state.connections[peer] = connection
            state.issuedPorts.append(connection.localPort)
            if state.issuedPorts.count > 256 { state.issuedPorts.removeFirst() }
            return true
        }
        guard kept else {
            await connection.close()
            return .ended
        }
        connection.closeFuture.whenComplete { [weak self] _ in
            // At once, so that a link failing on the dead port sees it ended (hasEnded).
            self?.state.withLockedValue { state in
                if state.connections[peer]?.localPort == connection.localPort { state.connections[peer] = nil }
            }
        }
        // Idle: no stream open in either direction (a PSK-TLS session, the peer's fetch of our beacons).
        let yielded = await fetchBeacons(of: peer, origin: origin, port: connection.localPort, until: connection.closeFuture) {
            (try? await connection.session.metrics().get().openStreams) == 0
        }
        await connection.close()
        return yielded ? .yielded : .ended
    }

    /// Fetches the beacons behind local `port` now and every `beaconRefetchInterval`, until `end`; or,
    /// while another peer waits for a link slot, until the link `isIdle` between two fetches. Returns
    /// whether it stopped to give the slot up.
    private func fetchBeacons(of peer: BluetoothAddress, origin: PeerLocation, port: Int, until end: EventLoopFuture<Void>,
                              isIdle: @Sendable () async -> Bool) async -> Bool {
        let location = BeaconLocation(host: "127.0.0.1", port: port)
        let ended = NIOLockedValueBox(false)
        let wake = LinkWakeSignal()
        end.whenComplete { _ in
            ended.withLockedValue { $0 = true }
            wake.signal()
        }
        while !Task.isCancelled, !ended.withLockedValue({ $0 }) {
            if let bytes = try? await fetcher.fetch(location) {
                report(.beaconsFetched(origin: origin, location: location, bytes: bytes))
            }
            await wake.wait(upTo: configuration.beaconRefetchInterval)
            if !ended.withLockedValue({ $0 }), peerWaiting, await isIdle() {
                logger.info("Bluetooth link idle while another peer waits: giving its slot up", metadata: ["peer": "\(peer)"])
                return true
            }
        }
        logger.info("Bluetooth connection ended", metadata: ["peer": "\(peer)"])
        return false
    }
}
