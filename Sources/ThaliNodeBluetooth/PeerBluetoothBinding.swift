import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import TCPMultiplexer
import ThaliBLEBinding
import ThaliNodeCore
import ThaliSSDP
import ThaliSupport

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
    /// After the node made the adapter discoverable, how long it waits for page scan to come on before it
    /// warns, and how often it reads it meanwhile.
    public var pageScanWait = PageScanWait()
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

/// How long a node waits for its adapter's page scan to come on, reading it every `interval`. Read, not
/// waited for: page scan is the controller's state (the kernel's `HCIGETDEVINFO` flags), and bluetoothd's
/// `Adapter1` has no property for it (`Discoverable` tells the mode bluetoothd set, not the controller's
/// scan). The kernel's management events would take a management socket of the node's own in the
/// transport, which no test could exercise without a radio.
public struct PageScanWait: Sendable, Hashable {
    /// How long to wait in all: 3 s by default (page scan comes on within a few hundred milliseconds).
    public var timeout: Duration
    /// How often to read it meanwhile: every 100 ms by default.
    public var interval: Duration

    /// Reads every `interval` for up to `timeout`.
    public init(timeout: Duration = .seconds(3), interval: Duration = .milliseconds(100)) {
        self.timeout = timeout
        self.interval = interval
    }

    /// Reads `isOn` now and every `interval` until it says true or `timeout` has passed (a last read
    /// then); returns whether it came on. Throws `CancellationError` when the task is cancelled.
    func until(_ isOn: () -> Bool) async throws -> Bool {
        let clock = ContinuousClock()
        let deadline = clock.now + timeout
        while !isOn() {
            let left = deadline - clock.now
            guard left > .zero else { return false }
            try await Task.sleep(for: min(max(interval, .milliseconds(1)), left))
        }
        return true
    }
}

/// The Bluetooth binding of a peer: advertises our adapter's address over BLE while we have beacons to
/// serve, scans for Thali advertisements, and reaches each peer found over RFCOMM, its handshake and a
/// multiplexer, so that the peer's beacons and its PSK-TLS port appear at a localhost port. Incoming
/// RFCOMM connections go the other way: each multiplexer stream becomes a connection to our own port.
/// Everything above (beacon matching, PSK-TLS, delivery) is the peer's and the same as over Wi-Fi.
///
/// Its lifetime is one task, started by `start` and cancelled and awaited by `stop`: a discarding task
/// group whose children read the relay server's events and the scan, turn page scan on, and pursue each
/// peer. Which peers are pursued, and what each pursuit does next, is ``BluetoothPursuitStateMachine``'s.
final class PeerBluetoothBinding: PeerBindingService {
    let kind = PeerBindingKind.bluetooth

    /// What the lifetime task is told to start beside what it runs from the outset.
    private enum Command: Sendable {
        /// Read the scan's discoveries.
        case scan(AsyncThrowingStream<ThaliPeerDiscovery, any Error>)
        /// Pursue this peer (it holds a link slot).
        case pursue(BluetoothAddress)
    }

    private struct State {
        var client: BlueZClient?
        var ownAddress: BluetoothAddress?
        var server: BluetoothRelayServer?
        var gateway: MultiplexedAppGateway?
        var connections: [BluetoothAddress: MultiplexedBluetoothConnection] = [:]
        /// The link slots and the peers waiting for one (from `start` on).
        var pursuits: BluetoothPursuitStateMachine?
        var advertising = false
        /// Whether we turned the adapter's `Discoverable` on (to get page scan): stop turns it off again.
        var madeDiscoverable = false
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
        /// The binding's one task, and how to tell it what to start.
        var lifetime: Task<Void, Never>?
        var commands: AsyncStream<Command>.Continuation?
        var stopped = false
    }

    let configuration: BluetoothPeerConfiguration
    private let group: any EventLoopGroup
    private let logger: Logger
    private let fetcher: BeaconHTTPClient
    private let state = NIOLockedValueBox(State())
    private let events = NIOLockedValueBox<@Sendable (PeerBindingEvent) -> Void>({ _ in })
    /// Open once page scan was turned on (or could not be): advertising waits for it.
    private let pageScanSettled = OneTimeSignal()

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
                $0.pursuits = BluetoothPursuitStateMachine(ownAddress: address, configuration: configuration)
            }
            try await server.start(channel: configuration.channel)
            let (commands, continuation) = AsyncStream.makeStream(of: Command.self)
            // Page scan beside the scan, not before it: the kernel takes a moment to turn it on.
            // Advertising waits for it, so that peers who see us can connect.
            let lifetime = Task {
                await self.run(commands: commands, server: server) {
                    await self.makeConnectable(client: client, adapter: adapter, transport: transport)
                }
            }
            let stopped = state.withLockedValue { state -> Bool in
                state.lifetime = lifetime
                state.commands = continuation
                return state.stopped
            }
            if stopped {
                continuation.finish()
                lifetime.cancel()
            }
            continuation.yield(.scan(try await client.scan()))
        } catch {
            await stop()
            client.close()
            throw error
        }
    }

    /// The binding's lifetime: reads the relay server's events, turns page scan on, and starts what it is
    /// told to (the scan's reader, pursuits), each a child task; ends when `stop` cancels it.
    private func run(commands: AsyncStream<Command>, server: BluetoothRelayServer,
                     makeConnectable: @escaping @Sendable () async -> Void) async {
        await withDiscardingTaskGroup { group in
            group.addTask {
                for await event in server.events { self.serverEvent(event) }
            }
            group.addTask {
                await makeConnectable()
                self.pageScanSettled.signal()
            }
            for await command in commands {
                switch command {
                case .scan(let discoveries):
                    group.addTask {
                        do {
                            for try await discovery in discoveries { self.discovered(discovery) }
                        } catch {
                            self.logger.error("Bluetooth scan ended", metadata: ["error": "\(error)"])
                        }
                    }
                case .pursue(let peer):
                    group.addTask { await self.pursue(peer) }
                }
            }
            group.cancelAll()
        }
        // Cancelled before it ran: nobody turns page scan on now.
        pageScanSettled.signal()
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
            let on = try await configuration.pageScanWait.until { transport.acceptsIncomingStreams(adapterIndex: index) == true }
            if on {
                logger.notice("""
                    Bluetooth adapter hci\(index) had page scan off; made it discoverable, which turns page scan on \
                    for as long as this node runs
                    """)
            } else {
                logger.warning("Bluetooth adapter hci\(index) is discoverable but page scan is still off: \(remedy)")
            }
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
        if state.withLockedValue({ $0.lifetime != nil }) { await pageScanSettled.wait() }
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
    func pauseAnnouncing(for period: Duration) {}

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
                || state.pursuits?.pursuedPeers.contains { $0.loopbackSource == remoteHost } == true
        }
    }

    func stop() async {
        let (lifetime, connections, server, gateway, client) = state.withLockedValue { state in
            state.stopped = true
            state.pursuits?.stop()
            state.commands?.finish()
            defer { state.connections = [:] }
            return (state.lifetime, Array(state.connections.values), state.server, state.gateway, state.client)
        }
        lifetime?.cancel()
        try? await client?.stopScanning()
        try? await client?.stopAdvertising()
        if state.withLockedValue({ $0.madeDiscoverable }) { try? await client?.setDiscoverable(false) }
        server?.stop()
        await gateway?.close()
        for connection in connections { await connection.close() }
        await lifetime?.value
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
            if ready { heard(peer, advertiser: nil) }
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
        heard(peer, advertiser: discovery.advertiserAddress)
    }

    /// `peer` was heard (from `advertiser`, or by its link to us): the schedule decides.
    private func heard(_ peer: BluetoothAddress, advertiser: BluetoothAddress?) {
        perform(state.withLockedValue { $0.pursuits?.heard(peer, advertiser: advertiser) ?? [] })
    }

    /// Starts the pursuits and forgets the advertisers the schedule asks for.
    private func perform(_ actions: [BluetoothPursuitStateMachine.Action]) {
        guard !actions.isEmpty else { return }
        let (commands, client) = state.withLockedValue { ($0.commands, $0.client) }
        for action in actions {
            switch action {
            case .pursue(let peer): commands?.yield(.pursue(peer))
            case .forget(let advertiser): client?.forget(advertiser)
            }
        }
    }

    /// Whether a peer waits for a link slot.
    private var peerWaiting: Bool { state.withLockedValue { $0.pursuits?.hasWaitingPeer == true } }

    /// Pursues `peer` (a child of the lifetime task): takes the schedule's steps (wait for the lower
    /// address's link, pause, reach) until it says the pursuit is over.
    private func pursue(_ peer: BluetoothAddress) async {
        report(.peerAppeared(origin: .bluetooth(peer)))
        let source = peer.loopbackSource
        let signal = LinkWakeSignal()
        var step = state.withLockedValue { state -> BluetoothPursuitStateMachine.Step in
            // While we advertise the lower address sees us and will come, unless its link is here already.
            let step = state.pursuits?.begin(peer, peerWillLinkToUs: state.advertising && state.incoming[source] == nil) ?? .end([])
            if case .awaitLink = step { state.linkWaiters[source] = signal }
            return step
        }
        while true {
            switch step {
            case .awaitLink(let bound):
                await signal.wait(upTo: bound)
                step = state.withLockedValue { state in
                    if state.linkWaiters[source] === signal { state.linkWaiters[source] = nil }
                    return state.pursuits?.waitEnded(peer) ?? .end([])
                }
            case .pause(let delay):
                try? await Task.sleep(for: delay)
                step = state.withLockedValue { $0.pursuits?.waitEnded(peer) ?? .end([]) }
            case .reach:
                let outcome = await reach(peer)
                step = state.withLockedValue { $0.pursuits?.reachEnded(peer, outcome) ?? .end([]) }
            case .end(let actions):
                perform(actions)
                return
            }
        }
    }

    /// A peer connected to us: its link also reaches its node, through `session.localPort`, so reaching
    /// that peer needs no second Bluetooth connection (``reach(_:)`` uses this one).
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
        if let announced { heard(announced, advertiser: nil) }
    }

    /// Reaches `peer` over the link it made to us if there is one, else connects (and that link carries
    /// the peer's streams to us too); then fetches its beacons now and every `beaconRefetchInterval`
    /// while the link lasts, or until it is idle while another peer waits for a slot.
    private func reach(_ peer: BluetoothAddress) async -> BluetoothPursuitStateMachine.ReachOutcome {
        let origin = PeerLocation.bluetooth(peer)
        let (own, advertising, incoming, node) = state.withLockedValue {
            ($0.ownAddress, $0.advertising, $0.incoming[peer.loopbackSource], $0.node)
        }
        if let incoming {
            logger.debug("reaching a Bluetooth peer over the link it made", metadata: ["peer": "\(peer)"])
            // The link is the peer's: giving our slot up only stops our fetches, its streams go on.
            let yielded = await fetchBeacons(of: peer, origin: origin, port: incoming.port, until: incoming.closeFuture) { true }
            return yielded ? .yielded : .ended
        }
        guard let own else { return .failed }
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
