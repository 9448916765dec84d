import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import TCPMultiplexer
import ThaliAdmission
import ThaliBeacons
import ThaliPSKTLS
import ThaliSSDP

/// The Thali peer: keeps a node on the network. While it holds items for contacts it advertises beacons
/// for them through its bindings (Wi-Fi: SSDP; Bluetooth through ``PeerConfiguration/extraBindings``);
/// it takes other peers' beacons from every binding and, when one names it from a contact, connects to
/// that peer with the beacon's PSK over TLS (Wi-Fi first, then Bluetooth) and receives over the
/// multiplexer. The peer that advertised accepts on the same port that serves its beacons, names the
/// contact from the PSK, and sends. In relay mode (``PeerConfiguration/appPort``) the authenticated
/// streams go to a local app instead.
///
/// `start()` then `stop()`, or ``run()`` under a swift-service-lifecycle `ServiceGroup`; ``status()`` at
/// any time; ``events(bufferingNewest:)`` to follow what it does. Items reach only the contact the TLS
/// layer authenticated: each session is bound to the contact its PSK belongs to.
///
/// See <doc:RunningAPeerInYourApp> for an app embedding a peer.
public final class ThaliPeer: Sendable {
    /// Errors of `start`.
    public enum StartError: Error, Hashable, CustomStringConvertible {
        /// The node's key cannot serve as a beacon identity, or TLS cannot be set up.
        case setup(String)
        /// ``ThaliPeer/start()`` was called before on this peer: a peer starts once.
        case alreadyStarted
        /// The peer was stopped: its event streams have ended and its port is closed. Make a new
        /// `ThaliPeer` to run again.
        case stopped

        public var description: String {
            switch self {
            case .setup(let reason): "cannot start the peer: \(reason)"
            case .alreadyStarted: "cannot start the peer: it was started already (a peer starts once)"
            case .stopped: "cannot start the peer: it was stopped (make a new peer to run again)"
            }
        }
    }

    /// The connecting side of one matched contact: its state machine and (relay mode) its local port.
    /// Its backoff is a deadline of the schedule (``PeerSchedule/Timer/linkBackoff(contactKey:)``).
    struct Link: Sendable {
        var contact: Contact
        var machine: ContactLinkStateMachine
        /// While a session stays open (relay, app streams): asks it for another delivery stream.
        var deliveryWanted: LinkWakeSignal?
        var relayPort: Int?
    }

    struct Advertised: Sendable {
        var contacts: Set<String>
        var items: Set<UUID>
        var expiration: UInt64
        /// The announcement streams served in turn (one unless there are more contacts than one
        /// announcement holds), and the one being served.
        var streams: [[UInt8]]
        var serving = 0

        /// Whether a quarter of the announcement's validity or less is left at `nowMs`, for contacts.
        func needsRenewal(nowMs: UInt64, validityMs: UInt64) -> Bool {
            !contacts.isEmpty && expiration < nowMs + validityMs / 4
        }
    }

    struct State: Sendable {
        var advertised: Advertised?
        var advertisingFor: [String] = []
        var addressBookKeys: Set<String> = []
        var peersSeen: Set<PeerLocation> = []
        var links: [String: Link] = [:]
        var sessionsInFlight = 0
        /// Relay mode: the local port kept for each contact (by public key) across its reconnects.
        var relayPorts: [String: Int] = [:]
        /// Relay mode: relayed TCP connections open now (both roles).
        var relayConnections = 0
        /// App streams: the marked sessions they are opened on, the opens waiting for one, the
        /// ``ThaliPeer/handleStreams(protocol:)`` sequences, whether the app uses streams.
        var appStreams = AppStreamRegistry<MarkedSession, LinkWakeSignal, AsyncStream<PeerStream>.Continuation>()
        /// Whether the peer runs; what start and stop do.
        var lifecycle = PeerLifecycle()
        /// The peer's timers: announcement rotation, store checks, link backoffs, the port's reopening.
        var schedule = PeerSchedule<ContinuousClock.Instant>()
        /// The store's change stamp as of its last read (nil: read it at the next check).
        var lastStoreStamp: NodeStore.ChangeStamp?
        /// ``ThaliPeer/storeChanged()`` came while a store check ran: the next check runs as soon as that
        /// one ends, not a poll interval later (the read under way may have taken its stamp before the commit).
        var storeChangedDuringCheck = false
        /// A refresh of the announcement asked for by ``ThaliPeer/send(text:to:expiresIn:)`` runs; and
        /// whether another was asked for meanwhile (it runs once the first ends: sends at once share one).
        var advertisementRefreshRunning = false
        var advertisementRefreshWanted = false
        /// The delivery senders running now, with their contact's public key, each woken when items may
        /// have been queued for that contact (a lingering version 5 session then offers them on its open
        /// stream).
        var deliverySenders: [ObjectIdentifier: (contactKey: String, newItems: LinkWakeSignal)] = [:]
        /// Contacts (by public key) with a delivery session that lingers, and how many: their new items go
        /// on it, so they are not announced for until it ends.
        var lingeringWith: [String: Int] = [:]
        /// When the last announcement was served (nil: none yet): the next waits for
        /// ``PeerConfiguration/minimumAnnouncementInterval`` after it.
        var lastAnnouncedAt: ContinuousClock.Instant?
        var limitsTriggered: [PeerLimitKind: Int] = [:]
        var discovery = PeerDiscoveryCounters()
        /// When the first pending item expires (ms since 1970), as of the last read of the outbox.
        var nextItemExpiryMs: Int64?
        /// When the first item a receiver could not hold is due again (ms since 1970), as of the last read
        /// of the outbox: then it is offered again, under a new announcement.
        var nextRetryMs: Int64?
        /// Whether a stop began: nothing new starts.
        var stopped: Bool { lifecycle.isStopping }
        var channels: [ObjectIdentifier: Channel] = [:]
        /// Wi-Fi connections accepted from contacts, open now: the contact (public key) and the source host
        /// (``ThaliPeer/acceptedWiFiConnection(_:from:contact:)``).
        var acceptedWiFi: [ObjectIdentifier: (contactKey: String, host: String, channel: Channel)] = [:]
        /// The single port's listening socket (nil while closed for an overload) and its number.
        var listener: Channel?
        var boundPort: Int?
        /// The address the port, SSDP and outgoing connections are bound to: the configuration's, until
        /// the followed interface moves (``PeerConfiguration/followsInterface``).
        var address = ""
        /// What to do when the followed interface's addresses change.
        var addressPlan: InterfaceAddressPlan?
    }

    /// The node's store.
    public let store: NodeStore
    /// The configuration in force.
    public let configuration: PeerConfiguration
    let identity: PrivateKey
    let logger: Logger
    let emit: PeerEventHandler
    let broadcaster = PeerEventBroadcaster()
    let group: MultiThreadedEventLoopGroup
    let generator: BeaconGenerator
    let receiver: BeaconReceiver
    let table: AdvertisedPSKTable
    let clientContext: PSKTLSContext
    let serverContext: PSKTLSContext
    let state = NIOLockedValueBox(State())
    /// The one task that owns every task of the peer, and its clock.
    let lifetime = PeerLifetime()
    /// Open once the start has ended (a stop during it waits for it) and once the stop has.
    let startEnded = OneTimeSignal()
    let stopEnded = OneTimeSignal()
    /// The single port's admission gate: per source, then global.
    let admission: AdmissionController<String>
    let portCounters = NIOLockedValueBox(PeerPortCounters())
    /// The bindings running, faster first (Wi-Fi, Bluetooth).
    let bindingsBox = NIOLockedValueBox<[any PeerBindingService]>([])
    /// Every contact by its normalised public key, as of the last ``refreshAddressBook()``: what the
    /// PSK-TLS server resolves an advertised beacon's contact with, on the event loop, without the store.
    let contactsByKey = NIOLockedValueBox<[String: Contact]>([:])
    /// Watches the followed interface's addresses while the peer runs (``PeerConfiguration/followsInterface``).
    let addressWatcher = NIOLockedValueBox<InterfaceAddressWatcher?>(nil)

    /// The address the peer is bound to now: ``PeerConfiguration/interfaceAddress`` until the followed
    /// interface loses it.
    var boundAddress: String { state.withLockedValue { $0.address } }

    /// A peer for the node whose store and identity are given; `events` receives everything it does,
    /// synchronously on the peer's tasks and event loops (keep it short; or use
    /// ``events(bufferingNewest:)``). Throws ``StartError/setup(_:)`` when TLS cannot be set up. Without
    /// `logger` the peer logs nothing (``silentLogger``).
    ///
    /// One peer at a time runs on a data directory: ``start()`` takes the directory's ``RunLock`` (and
    /// ``stop()`` lets it go), unless `runLock` is one the caller already holds on the store's directory
    /// (as `thali-node run` takes it before anything else).
    public init(store: NodeStore, identity: PrivateKey, configuration: PeerConfiguration,
                logger: Logger = ThaliPeer.silentLogger, runLock: RunLock? = nil,
                events: @escaping PeerEventHandler = { _ in }) throws {
        self.store = store
        heldLock = NIOLockedValueBox(runLock)
        self.identity = identity
        self.configuration = configuration
        // NIO's shared loops, one per core: every peer of a process shares them (a crowd of 500 in one
        // bench process too), and the app never sees an event-loop type.
        self.group = .singleton
        self.logger = logger
        let broadcaster = self.broadcaster
        self.emit = { event in
            events(event)
            broadcaster.yield(event)
        }
        generator = BeaconGenerator(identity: identity, profile: configuration.beaconProfile)
        // Room for two rounds of every advertised contact's PSKs: the current and the previous announcements.
        table = AdvertisedPSKTable(capacity: max(BeaconLimits().pskTableCapacity, 2 * configuration.maxAdvertisedContacts))
        receiver = BeaconReceiver(identity: identity, profile: configuration.beaconProfile)
        if let problem = configuration.admission.problem { throw StartError.setup("admission limits: \(problem)") }
        // The gate reports an overload back here; a weak link, so the gate does not keep the peer alive.
        let overloadTarget = NIOLockedValueBox(WeakPeer())
        admission = AdmissionController(limits: configuration.admission) { period in
            overloadTarget.withLockedValue { $0.peer }?.portOverloaded(for: period)
        }
        do {
            let tls = configuration.streams.tlsConfiguration(configuration.tls)
            clientContext = try PSKTLSContext(role: .client, configuration: tls)
            serverContext = try PSKTLSContext(role: .server, configuration: tls)
        } catch {
            throw StartError.setup("\(error)")
        }
        overloadTarget.withLockedValue { $0.peer = self }
        state.withLockedValue { $0.address = configuration.interfaceAddress }
    }

    private struct WeakPeer: Sendable { weak var peer: ThaliPeer? }

    /// The logger of a peer given none: silent, whatever the process's logging system, so that an app
    /// that asked for no logs gets no lines on its standard error. Pass a `Logger` to see them.
    public static var silentLogger: Logger { Logger(label: "thali.node.peer") { _ in SwiftLogNoOpLogHandler() } }

    /// The data directory's lock while the peer runs (given, or taken by ``start()``).
    let heldLock: NIOLockedValueBox<RunLock?>

    var bindings: [any PeerBindingService] { bindingsBox.withLockedValue { $0 } }

    /// Starts discovery and the single port, then keeps announcing what the outbox holds. Throws
    /// ``NodeError/portInUse(host:port:)`` when the port is taken, ``NodeError/addressNotLocal(_:reason:)``
    /// when no interface carries the configured address. A peer starts once: a second call throws
    /// ``StartError/alreadyStarted``, and one after ``stop()`` ``StartError/stopped``, changing nothing.
    public func start() async throws {
        if let refusal = state.withLockedValue({ $0.lifecycle.start() }) { throw refusal }
        defer {
            state.withLockedValue { $0.lifecycle.startEnded() }
            startEnded.signal()
        }
        lifetime.start { [weak self] in self?.deadlinesReached() }
        // A second peer on the same data directory would advertise and deliver the same items.
        if heldLock.withLockedValue({ $0 == nil }) {
            let lock = try RunLock(home: store.home)
            heldLock.withLockedValue { $0 = lock }
        }
        try await refreshAddressBook()
        try NodeInterface.validateLocalAddress(configuration.interfaceAddress)
        // The node owns its one port (beacons and PSK-TLS behind one admission gate); discovery only
        // announces it.
        let port: Int
        do {
            port = try await bindPort()
        } catch {
            throw NodeError.mapBindError(error, host: configuration.interfaceAddress, port: configuration.port)
        }
        try await startBindings(port: port)
        startFollowingInterface()
        try await refreshAdvertisement()
        // More contacts than one announcement holds: the announcements are served in turn.
        arm(.rotateAnnouncement, after: configuration.announcementRotationInterval)
        arm(.checkStore, after: configuration.outboxPollInterval)
    }

    /// Starts the configured bindings, faster first. A binding that cannot start is reported
    /// (`bindingUnavailable`) and the others go on; when none can, the start fails with the last one's
    /// reason (Bluetooth's as ``NodeError/bluetoothUnavailable(reason:)``).
    private func startBindings(port: Int) async throws {
        var planned: [any PeerBindingService] = []
        if configuration.wifi { planned.append(PeerWiFiBinding(configuration: configuration, group: group, logger: logger)) }
        planned += configuration.extraBindings.map { $0.makeBinding(logger: logger) }
        if let reason = configuration.wifiUnavailableReason {
            emit(.bindingUnavailable(binding: .wifi, reason: reason))
        }
        var started: [any PeerBindingService] = []
        for (index, binding) in planned.enumerated() {
            do {
                try await binding.start(nodeHost: boundAddress, nodePort: port) { [weak self] event in
                    self?.bindingEvent(event)
                }
                started.append(binding)
            } catch {
                await binding.stop()
                let reported: any Error = binding.kind == .bluetooth ? NodeError.bluetoothUnavailable(reason: "\(error)") : error
                if started.isEmpty && index == planned.count - 1 {
                    await closePort()
                    throw reported
                }
                emit(.bindingUnavailable(binding: binding.kind, reason: "\(error)"))
            }
        }
        bindingsBox.withLockedValue { $0 = started }
        if let first = started.first, let location = await first.location() { emit(.started(location: location)) }
    }

    var isStopped: Bool { state.withLockedValue { $0.stopped } }

    /// Why a session ended with `error`: when this peer is stopping, the stop is the reason, whichever layer
    /// (the multiplexer's close, the TLS close, the delivery stream) noticed it first.
    func sessionEndError(_ error: any Error, address: String) -> PeerConnectionError {
        if isStopped || Task.isCancelled { return PeerConnectionError(.cancelled, address: address) }
        return PeerConnectionError(error, address: address)
    }

    /// Keeps `channel` (a PSK-TLS connection, either role) until it closes, so that `stop()` can close it.
    func register(_ channel: Channel) {
        let id = ObjectIdentifier(channel)
        let open = state.withLockedValue { state -> Bool in
            guard !state.stopped else { return false }
            state.channels[id] = channel
            return true
        }
        guard open else { return channel.close(promise: nil) }
        channel.closeFuture.whenComplete { [weak self] _ in
            _ = self?.state.withLockedValue { $0.channels.removeValue(forKey: id) }
        }
    }

    /// Runs `body` as a task of the peer's lifetime: cancelled and awaited by `stop()`.
    func spawn(_ body: @escaping @Sendable () async -> Void) {
        lifetime.run(body)
    }

    /// A snapshot for the status view.
    public func status() async -> PeerStatus {
        let location = await bindings.first?.location()
        var ssdp: PeerSSDPHealth?
        for binding in bindings where ssdp == nil { ssdp = await binding.ssdpHealth() }
        var port = portCounters.withLockedValue { $0 }
        port.admission = admission.counters
        let counts = try? await blocking { [store] in (inbox: try store.inboxCount(), outbox: try store.outboxCount()) }
        let (inbox, outbox) = (counts?.inbox ?? 0, counts?.outbox ?? 0)
        return state.withLockedValue { state in
            var discovery = state.discovery
            discovery.ssdp = ssdp
            return PeerStatus(location: location, advertisingFor: state.advertisingFor,
                              peersSeen: state.peersSeen.sorted { $0.description < $1.description },
                              matchedContacts: state.links.values.map {
                                  let route = $0.machine.currentRoute
                                  return PeerStatus.ContactState(name: $0.contact.name, state: $0.machine.state.phase,
                                                                 location: route?.origin ?? $0.machine.lastOrigin,
                                                                 binding: route?.binding, relayPort: $0.relayPort)
                              }.sorted { $0.name < $1.name },
                              sessionsInFlight: state.sessionsInFlight, relayConnections: state.relayConnections,
                              inboxCount: inbox, outboxCount: outbox, limitsTriggered: state.limitsTriggered, port: port,
                              discovery: discovery)
        }
    }

    // MARK: Discovery

    private func bindingEvent(_ event: PeerBindingEvent) {
        switch event {
        case .peerAppeared(let origin):
            let fresh = state.withLockedValue { $0.peersSeen.insert(origin).inserted }
            if fresh { emit(.peerAppeared(location: origin)) }
        case .peerLeft(let origin, let reason):
            let known = state.withLockedValue { $0.peersSeen.remove(origin) != nil }
            if known { emit(.peerLeft(location: origin, reason: reason)) }
        case .beaconsFetched(let origin, let location, let bytes):
            beaconsFetched(origin: origin, location: location, bytes)
            // Counted once handled: whoever sees the count has seen the outcome too (a match's event).
            state.withLockedValue { $0.discovery.beaconFetches += 1 }
        case .beaconFetchFailed(_, let kind):
            state.withLockedValue { state in
                state.discovery.beaconFetchFailures += 1
                state.discovery.beaconFetchFailuresByKind[kind, default: 0] += 1
            }
        case .limitTriggered(let report):
            state.withLockedValue { $0.limitsTriggered[report.kind, default: 0] += 1 }
            emit(.limitTriggered(report))
        }
    }

    /// Keeps the beacon receiver's address book equal to the contacts (another process may add some);
    /// on the thread pool, off the caller's.
    func refreshAddressBook() async throws {
        try await blocking { [self] in try refreshAddressBookNow() }
    }

    /// ``refreshAddressBook()``'s work. Blocks on the store.
    private func refreshAddressBookNow() throws {
        let contacts = try store.contacts()
        contactsByKey.withLockedValue { $0 = Dictionary(contacts.map { ($0.publicKey, $0) }, uniquingKeysWith: { first, _ in first }) }
        let keys = Set(contacts.map(\.publicKey))
        let known = state.withLockedValue { $0.addressBookKeys }
        guard keys != known else { return }
        for contact in contacts where !known.contains(contact.publicKey) {
            try receiver.addressBook.add(try contact.identityKey())
        }
        for gone in known.subtracting(keys) {
            if let key = try? ContactKey.parse(gone) { _ = receiver.addressBook.remove(key) }
        }
        state.withLockedValue { $0.addressBookKeys = keys }
    }

    /// A fetched beacon stream: a match from a known contact starts (or re-targets) the link to it; anything
    /// else — not for us, from a stranger, a replay — is ignored without a word.
    /// `origin` names where the beacons came from (an SSDP location, or the peer's Bluetooth address); `location` is where its single port is reached (over Bluetooth: the relay's local port).
    private func beaconsFetched(origin: PeerLocation, location: BeaconLocation, _ bytes: [UInt8]) {
        let match: BeaconMatch
        do throws(BeaconRejection) {
            // Keyed by where it was fetched: a copy re-served from elsewhere cannot make the genuine
            // announcement a replay, and a Bluetooth peer reached again (a new relay port) matches anew.
            match = try receiver.receive(bytes, from: location.description)
        } catch {
            logger.debug("beacons not for us", metadata: ["origin": "\(origin)", "reason": "\(error.reason.rawValue)"])
            return
        }
        // On the binding's event loop: the contacts as of the last refresh, not the store.
        guard let contact = contactsByKey.withLockedValue({ $0[match.sender.hexString(compressed: true)] }) else { return }
        bindings.first { $0.kind == origin.binding }?.contactMatched(at: location)
        emit(.beaconMatched(contact: contact.identity, location: origin))
        let route = ContactRoute(origin: origin, location: location, match: match)
        let retry = configuration.retry
        let (outcome, link) = state.withLockedValue { state -> (ContactLinkStateMachine.MatchOutcome, Link?) in
            guard !state.stopped else { return (.none, nil) }
            var link = state.links[contact.publicKey]
                ?? Link(contact: contact, machine: ContactLinkStateMachine(maxAttempts: retry.maxAttempts,
                                                                           rest: retry.restAfterMaxAttempts,
                                                                           delay: { retry.delay(after: $0) }))
            link.contact = contact
            let outcome = link.machine.matched(route)
            state.links[contact.publicKey] = link
            return (outcome, link)
        }
        switch outcome {
        case .startTask: spawn { [self] in await runLink(contact) }
        case .wake: wakeLink(contact)
        case .deliverOverSession: link?.deliveryWanted?.signal()
        case .sessionMoved(let old): closeSessions(to: old)
        case .none: break
        }
    }

    // MARK: Advertising

    /// Whether time alone asks for ``refreshAdvertisement()``: a pending item expired, an item a receiver
    /// could not hold is due again, or a quarter of the announcement's validity is left.
    func advertisementDueByTime() -> Bool {
        let nowMs = UInt64(Date().timeIntervalSince1970 * 1000)
        let validityMs = UInt64(configuration.beaconValidity.components.seconds * 1000)
        return state.withLockedValue { state in
            if let expiry = state.nextItemExpiryMs, expiry <= Int64(nowMs) { return true }
            if let retry = state.nextRetryMs, retry <= Int64(nowMs) { return true }
            return state.advertised?.needsRenewal(nowMs: nowMs, validityMs: validityMs) ?? false
        }
    }

    /// Announces beacons for the contacts the outbox holds items for (in relay mode, or when the app
    /// uses streams: every contact) when that set changes, when a new item arrives, or when a quarter of
    /// the announcement's validity is left. An item deferred after a temporary refusal counts from its
    /// retry time on, and then gets a new announcement (new beacons: the contact connects again).
    func refreshAdvertisement() async throws {
        // The store's queries and the beacons (an ECDH per contact) run off the cooperative pool: with 300
        // contacts they took 71-79 ms, all of it on the thread of the app that called send().
        switch try await blocking({ [self] in try prepareAdvertisement() }) {
        case .unchanged:
            return
        case .paced(let until):
            // A burst of sends announces twice, not once per send: each announcement costs every
            // listening contact a fetch (a connection to our port, counted by its admission).
            arm(.pacedAnnouncement, after: until - ContinuousClock.now)
        case .serve(let update):
            for binding in bindings { await binding.advertise(update.stream, isRotation: false) }
            emit(.advertising(contacts: update.contacts))
        }
    }

    /// What ``prepareAdvertisement()`` decided.
    enum AdvertisementPlan: Sendable {
        /// Nothing to change, or nothing runs to advertise on.
        case unchanged
        /// A new announcement is due but the last one is younger than
        /// ``PeerConfiguration/minimumAnnouncementInterval``: ask again at `until`.
        case paced(until: ContinuousClock.Instant)
        /// Serve this (a new announcement, or a withdrawal).
        case serve(AdvertisementUpdate)
    }

    /// What ``refreshAdvertisement()`` serves: the first announcement (nil: withdraw) and the names it is for.
    struct AdvertisementUpdate: Sendable {
        var stream: [UInt8]?
        var contacts: [String]
    }

    /// The synchronous half of ``refreshAdvertisement()``: reads the store, makes the announcements and
    /// records them, unless nothing is to change or the last announcement is too recent. Blocks: call it
    /// from a thread pool.
    private func prepareAdvertisement() throws -> AdvertisementPlan {
        _ = try store.sweepExpired()
        let checked = Date()
        let retryDue = state.withLockedValue { $0.nextRetryMs.map { $0 <= checked.millisecondsSinceEpoch } ?? false }
        let nextRetry = try store.nextRetryTime(now: checked)
        state.withLockedValue { $0.nextRetryMs = nextRetry?.millisecondsSinceEpoch }
        // A contact whose session lingers gets its new items on it: announcing them would only make it
        // fetch, match and, once that session ends, open another with nothing left to carry.
        let lingering = state.withLockedValue { $0.lingeringWith }
        let pendingFor = try store.contactsWithPendingItems(now: checked)
        // Items another process queued (the store check found its commit), or whose retry time came: the
        // senders of those contacts look again, and only those (a crowd's peer holds a few hundred).
        wakeDeliverySenders(of: Set(pendingFor.map(\.publicKey)))
        let withItems = pendingFor.filter { lingering[$0.publicKey] == nil }
        let contacts = keepsSessionsOpen ? try store.contacts() : withItems
        var items = Set<UUID>()
        var nextExpiry: Int64?
        for contact in pendingFor {
            let pending = try store.pendingItems(for: contact)
            if lingering[contact.publicKey] == nil { items.formUnion(pending.map(\.id)) }
            nextExpiry = ([nextExpiry].compactMap { $0 } + pending.map(\.expiresAtMs)).min()
        }
        state.withLockedValue { $0.nextItemExpiryMs = nextExpiry }
        let keys = Set(contacts.map(\.publicKey))
        let now = UInt64(Date().timeIntervalSince1970 * 1000)
        let validityMs = UInt64(configuration.beaconValidity.components.seconds * 1000)
        let needed = state.withLockedValue { state -> Bool in
            guard let advertised = state.advertised else { return !keys.isEmpty }
            if advertised.contacts != keys || !items.isSubset(of: advertised.items) || retryDue { return true }
            return advertised.needsRenewal(nowMs: now, validityMs: validityMs)
        }
        guard needed, !bindings.isEmpty else { return .unchanged }
        if contacts.isEmpty {
            // A withdrawal (byebye) costs listeners no fetch: not paced.
            state.withLockedValue {
                $0.advertised = nil
                $0.advertisingFor = []
            }
            return .serve(AdvertisementUpdate(stream: nil, contacts: []))
        }
        let instant = ContinuousClock.now
        let pacedUntil = state.withLockedValue { state -> ContinuousClock.Instant? in
            guard let last = state.lastAnnouncedAt, instant < last + configuration.minimumAnnouncementInterval else {
                state.lastAnnouncedAt = instant
                return nil
            }
            return last + configuration.minimumAnnouncementInterval
        }
        if let pacedUntil { return .paced(until: pacedUntil) }
        // One announcement holds at most `maximumBeaconsPerAnnouncement` beacons (64): more contacts are
        // split over several announcements, served in turn (``rotateAnnouncement()``).
        var advertisedContacts = contacts
        if advertisedContacts.count > configuration.maxAdvertisedContacts {
            logger.error("more contacts to advertise than the limit; the rest wait for a later round",
                         metadata: ["contacts": "\(contacts.count)", "limit": "\(configuration.maxAdvertisedContacts)"])
            advertisedContacts = Array(advertisedContacts.prefix(configuration.maxAdvertisedContacts))
        }
        let perAnnouncement = max(1, generator.limits.maximumBeaconsPerAnnouncement)
        var announcements: [BeaconAnnouncement] = []
        for start in stride(from: 0, to: advertisedContacts.count, by: perAnnouncement) {
            let chunk = advertisedContacts[start..<min(start + perAnnouncement, advertisedContacts.count)]
            let announcement = try generator.makeAnnouncement(for: try chunk.map { try $0.identityKey() },
                                                              validity: configuration.beaconValidity)
            table.register(announcement)
            announcements.append(announcement)
        }
        let names = advertisedContacts.map(\.name).sorted()
        let expiration = announcements.map(\.expiration).min() ?? 0
        state.withLockedValue {
            $0.advertised = Advertised(contacts: keys, items: items, expiration: expiration,
                                       streams: announcements.map(\.stream))
            $0.advertisingFor = names
        }
        return .serve(AdvertisementUpdate(stream: announcements.first?.stream, contacts: names))
    }

    /// Serves the next announcement when the contacts span several (each new USN makes listeners fetch it).
    func rotateAnnouncement() async {
        let next = state.withLockedValue { state -> [UInt8]? in
            guard var advertised = state.advertised, advertised.streams.count > 1 else { return nil }
            advertised.serving = (advertised.serving + 1) % advertised.streams.count
            state.advertised = advertised
            return advertised.streams[advertised.serving]
        }
        guard let next else { return }
        for binding in bindings { await binding.advertise(next, isRotation: true) }
    }

    /// Applies `change` to `contact`'s link state machine (if the contact has a link) and returns its result.
    @discardableResult
    func updateLink<Result>(_ contact: Contact, _ change: (inout ContactLinkStateMachine) -> Result) -> Result? {
        state.withLockedValue { state in
            guard var link = state.links[contact.publicKey] else { return nil }
            defer { state.links[contact.publicKey] = link }
            return change(&link.machine)
        }
    }

    /// Relay mode: the local port whose connections reach `contact`'s app (nil: none right now).
    func setRelayPort(_ contact: Contact, _ port: Int?) {
        state.withLockedValue { $0.links[contact.publicKey]?.relayPort = port }
    }

    func sessionStarted() { state.withLockedValue { $0.sessionsInFlight += 1 } }
    /// Items may have been queued for the contacts with these public keys: their delivery senders look at
    /// their outbox again.
    func wakeDeliverySenders(of contactKeys: Set<String>) {
        let senders = state.withLockedValue { state in
            state.deliverySenders.values.filter { contactKeys.contains($0.contactKey) }.map(\.newItems)
        }
        for sender in senders { sender.signal() }
    }

    /// Wakes the delivery senders of the contact `item` is for (this process's `send` queued it).
    func wakeDeliverySenders(for item: OutboxItem) {
        guard let key = contactsByKey.withLockedValue({ $0.values.first { $0.id == item.contactID }?.publicKey }) else { return }
        wakeDeliverySenders(of: [key])
    }
    func sessionFinished() { state.withLockedValue { $0.sessionsInFlight -= 1 } }

    /// Relay mode: counts `stream` as a relayed connection until it closes.
    func relayConnectionOpened(_ stream: Channel) {
        state.withLockedValue { $0.relayConnections += 1 }
        stream.closeFuture.whenComplete { [weak self] _ in
            self?.state.withLockedValue { $0.relayConnections -= 1 }
        }
    }
}
