import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import TCPMultiplexer
import ThaliBeacons
import ThaliMutants
import ThaliPSKTLS
import ThaliSSDP

extension ThaliPeer {
    /// The connecting side of one contact: performs what its ``ContactLinkStateMachine`` decides
    /// (connect over the preferred route, fall back, back off, give up) until it has nothing left to do.
    /// A link task ends where its machine waits: the backoff is a deadline of the schedule, and the task
    /// that runs the link next is started when it passes (``PeerSchedule/Timer/linkBackoff(contactKey:)``)
    /// or when a new match ends it early (``wakeLink(_:)``).
    func runLink(_ contact: Contact) async {
        let key = PeerSchedule<ContinuousClock.Instant>.Timer.linkBackoff(contactKey: contact.publicKey)
        while true {
            let now = ContinuousClock.now
            let action = state.withLockedValue { state -> ContactLinkStateMachine.Action in
                guard var link = state.links[contact.publicKey] else { return .finish }
                defer { state.links[contact.publicKey] = link }
                if state.stopped || Task.isCancelled {
                    link.machine.stopped()
                    return .finish
                }
                let action = link.machine.nextAction()
                // Armed in the same step as the machine's decision: a match between them finds it armed.
                if case .wait(let delay) = action { state.schedule.arm(key, at: now + delay) }
                return action
            }
            switch action {
            case .finish:
                return
            case .wait(let delay):
                lifetime.wake(at: now + delay)
                return
            case .connect(let route, let attempt):
                emit(.connecting(contact: contact.identity, location: route.origin, attempt: attempt))
                do {
                    try await connect(contact, route)
                    updateLink(contact) { $0.sessionCompleted() }
                } catch {
                    // Stopping cancels the link and closes its connection: that is no failure to report,
                    // and the retry it would announce will not happen (the loop ends the link).
                    if isStopped || Task.isCancelled { continue }
                    let nowMs = UInt64(Date().timeIntervalSince1970 * 1000)
                    // unknown_psk_identity: the peer at that location no longer holds (or never held) this
                    // beacon's PSK; retrying cannot help (spec/psk-tls.md), only a new announcement can.
                    // Nor can a Bluetooth relay port whose connection ended: the next match brings a new one.
                    let spent = route.match.expiration <= nowMs || Self.isUnknownIdentity(error)
                        || bindings.contains { $0.kind == route.binding && $0.hasEnded(route.location) }
                    let retryIn = updateLink(contact) { $0.attemptFailed(spent ? .routeSpent : .retryable) } ?? nil
                    emit(.connectionFailed(contact: contact.identity, reason: PeerConnectionError(error, connectingTo: route.location),
                                           retryIn: retryIn))
                }
            }
        }
    }

    /// A new match ends `contact`'s backoff early: its machine tries its routes again. When the link's task
    /// has ended into the backoff's deadline, a new one starts; when it is still on its way there, it finds
    /// the routes to try in its next step.
    func wakeLink(_ contact: Contact) {
        let key = PeerSchedule<ContinuousClock.Instant>.Timer.linkBackoff(contactKey: contact.publicKey)
        let waiting = state.withLockedValue { state -> Bool in
            guard !state.stopped else { return false }
            state.links[contact.publicKey]?.machine.backoffEnded()
            return state.schedule.disarm(key)
        }
        if waiting { spawn { [self] in await runLink(contact) } }
    }

    /// Whether `error` is the server's `unknown_psk_identity` alert.
    static func isUnknownIdentity(_ error: any Error) -> Bool {
        (error as? PSKTLSError)?.reason == .alertReceived(.unknownPSKIdentity)
    }

    /// One connection: PSK-TLS as the client with the match's identity and PSK, a yamux session, then the
    /// delivery receiver on one stream (or, in relay mode, a local listener until the session ends). On a
    /// marked session both run in relay mode, and the session stays open while the app uses streams.
    private func connect(_ contact: Contact, _ route: ContactRoute) async throws {
        let (match, location) = (route.match, route.location)
        let clientContext = self.clientContext
        let emit = self.emit
        // From the pinned interface's address: the one this peer announces, and the source the other
        // peer's per-source admission sees.
        var bootstrap = ClientBootstrap(group: group)
        // A Bluetooth peer's port appears on 127.0.0.1 (its relay): that one is reached from loopback.
        if route.binding == .wifi {
            bootstrap = bootstrap.bind(to: try SocketAddress(ipAddress: boundAddress, port: 0))
        }
        // A route holds an address (SSDP's LOCATION must name its sender's; Bluetooth's relay is on
        // loopback): connected to directly, not resolved by name and raced Happy-Eyeballs style.
        let target = try SocketAddress(ipAddress: location.host, port: location.port)
        let address = "\(location.host):\(location.port)"
        // Streams the contact's node opens on a marked session (an app's): served by their kind.
        let inbound: @Sendable (Channel, PSKTLSNegotiatedParameters) -> EventLoopFuture<Void> = { [weak self] stream, parameters in
            guard let self, Self.isMarked(parameters) else {
                return stream.eventLoop.makeFailedFuture(MultiplexerError.sessionClosed)
            }
            return self.serveMarkedStream(stream, for: contact, from: address, role: .connecting)
        }
        let client = try await bootstrap
            .connectTimeout(TimeAmount(configuration.tls.connectTimeout))
            .connect(to: target) { channel in
                AuthenticatedSession.configureClient(on: channel, context: clientContext, identity: match.pskIdentity,
                                                     psk: match.psk, negotiatedInboundStream: inbound)
                    .flatMapThrowing { client in
                        // Reported only once the handshake authenticated the contact.
                        try channel.pipeline.syncOperations.addHandler(ConnectionEndRecorder { error in
                            client.handshake.whenSuccess { _ in
                                emit(.disconnected(contact: contact.identity, role: .connecting, binding: route.binding,
                                                   remote: "\(location.host):\(location.port)", reason: error.map { PeerConnectionError($0, connectingTo: location) }))
                            }
                        })
                        return client
                    }
            }
        let session = client.session
        register(session.channel)
        let marked: Bool
        do {
            marked = Self.isMarked(try await client.handshake.get())
        } catch {
            try? await session.channel.close()
            throw error
        }
        emit(.connected(contact: contact.identity, role: .connecting, binding: route.binding, remote: "\(location.host):\(location.port)"))
        updateLink(contact) { $0.connected() }
        if marked { registerMarkedSession(session, contact: contact, role: .connecting) }
        if configuration.opensRelayListeners {
            // Marked: delivery beside the relay; its failure leaves the relay's session up.
            if marked {
                let wanted = keepSessionOpen(contact)
                spawn { [self] in await receiveWhileOpen(from: contact, over: session, at: route.location, binding: route.binding, wanted: wanted) }
            }
            try await relay(contact, over: session, at: route.location, marked: marked)
        } else {
            // Kept open when the app uses streams, decided when delivery ends: an app that opened its first
            // stream during the delivery may have opened it on this session.
            let kept = try await receive(from: contact, over: session, at: route.location, binding: route.binding, marked: marked,
                                         keepingSession: marked && keepsSessionsOpen)
            guard kept else { return }
            let wanted = keepSessionOpen(contact)
            await withTaskCancellationHandler {
                await receiveWhileOpen(from: contact, over: session, at: route.location, binding: route.binding, wanted: wanted, afterFirst: true)
            } onCancel: {
                session.channel.close(promise: nil)
            }
        }
    }

    /// Closes `session` after its delivery unless it is `marked` and the app uses streams (or began to
    /// meanwhile); returns whether it stays open. Decided in the same step that takes the session out of
    /// the ones ``openStream(to:protocol:timeout:)`` picks from, so that no app stream is opened on a
    /// session that is closing: before, one opened just as its delivery ended failed with "session closed".
    private func closeUnlessKept(_ session: MultiplexerSession, contact: Contact, marked: Bool) async -> Bool {
        let relaying = configuration.appPort != nil
        let kept = state.withLockedValue {
            $0.appStreams.keepsAfterDelivery(ObjectIdentifier(session), contactKey: contact.publicKey, marked: marked, relaying: relaying)
        }
        if !kept { try? await session.close().get() }
        return kept
    }

    /// The delivery receiver on a stream this side opens. The session is closed when delivery ends,
    /// unless `keepingSession` (relay, app streams) or the app began to use streams meanwhile; returns
    /// whether it stays open. A failure is thrown either way.
    @discardableResult
    private func receive(from contact: Contact, over session: MultiplexerSession, at location: BeaconLocation,
                         binding: PeerBindingKind, marked: Bool, keepingSession: Bool) async throws -> Bool {
        let limits = deliveryLimits(over: binding)
        let writer = marked ? markingWriter(.delivery, contact: contact, role: .connecting) : nil
        sessionStarted()
        defer { sessionFinished() }
        do {
            let frames = try await DeliveryChannel.openStream(on: session, limits: limits) { stream in
                if let writer { try stream.pipeline.syncOperations.addHandler(writer()) }
            }
            // The first item moved forward tells the link (once per session): its failure then starts a
            // new run of failures (ContactLinkStateMachine.sessionProgressed).
            let progressed = NIOLockedValueBox(false)
            _ = try await DeliveryReceiver(store: store, authenticatedPeer: contact, limits: limits,
                                           events: { [emit, weak self] event in
                                               emit(.delivery(contact: contact.identity, event))
                                               guard event.movesAnItemForward,
                                                     progressed.withLockedValue({ seen in defer { seen = true }; return !seen }) else { return }
                                               self?.updateLink(contact) { $0.sessionProgressed() }
                                           },
                                           logger: logger).run(on: frames)
            emit(.sessionEnded(contact: contact.identity, role: .connecting, error: nil))
            return keepingSession ? true : await closeUnlessKept(session, contact: contact, marked: marked)
        } catch {
            if Mutant.streamsRetryRefused.isActive, marked, session.channel.isActive, !isStopped, !Task.isCancelled {
                return try await receive(from: contact, over: session, at: location, binding: binding, marked: marked, keepingSession: keepingSession)
            }
            emit(.sessionEnded(contact: contact.identity, role: .connecting, error: sessionEndError(error, address: "\(location.host):\(location.port)")))
            if !keepingSession { _ = await closeUnlessKept(session, contact: contact, marked: marked) }
            throw error
        }
    }

    /// Delivery over a session that stays open (a relay, app streams): a receiver on a new stream now
    /// (unless `afterFirst`: one already ran) and again each time the contact's beacons match anew (new
    /// announcements, perhaps new items), until the session closes. A failed delivery is reported as the
    /// session's end and waits for the next match, like a completed one: the session itself goes on.
    private func receiveWhileOpen(from contact: Contact, over session: MultiplexerSession, at location: BeaconLocation,
                                  binding: PeerBindingKind, wanted: LinkWakeSignal, afterFirst: Bool = false) async {
        defer {
            state.withLockedValue { state in
                if state.links[contact.publicKey]?.deliveryWanted === wanted { state.links[contact.publicKey]?.deliveryWanted = nil }
            }
        }
        session.channel.closeFuture.whenComplete { _ in wanted.signal() }
        var first = !afterFirst
        while session.channel.isActive, !Task.isCancelled, !isStopped {
            // The session's close signals too; the bound only keeps a lost wake-up from lasting.
            if !first { await wanted.wait(upTo: .seconds(600)) }
            first = false
            guard session.channel.isActive, !Task.isCancelled, !isStopped else { return }
            _ = try? await receive(from: contact, over: session, at: location, binding: binding, marked: true, keepingSession: true)
        }
    }

    /// Tells `contact`'s link that its session stays open, and returns the signal by which a new match
    /// asks that session for another delivery (set in the same step, so that no match falls between).
    private func keepSessionOpen(_ contact: Contact) -> LinkWakeSignal {
        let wanted = LinkWakeSignal()
        state.withLockedValue { state in
            state.links[contact.publicKey]?.machine.sessionKeptOpen()
            state.links[contact.publicKey]?.deliveryWanted = wanted
        }
        return wanted
    }

    /// Relay mode: connections to a local port become streams to the contact's app, until the session
    /// ends (then the link retries while the contact's beacon is valid). The port is the one the user
    /// pinned for the contact (``PeerConfiguration/relayPorts``), else the one first bound for it, so an
    /// app configured with it keeps working across reconnects.
    private func relay(_ contact: Contact, over session: MultiplexerSession, at location: BeaconLocation, marked: Bool) async throws {
        let address = "\(location.host):\(location.port)"
        let listener = try await openRelayListener(for: contact, over: session, address: address, marked: marked)
        let port = listener.localAddress?.port ?? 0
        sessionStarted()
        await withTaskCancellationHandler {
            try? await session.channel.closeFuture.get()
        } onCancel: {
            session.channel.close(promise: nil)
        }
        try? await listener.close()
        sessionFinished()
        setRelayPort(contact, nil)
        emit(.relayClosed(contact: contact.identity, port: port))
        throw PeerConnectionError(.relayClosed, address: address)
    }

    /// Binds the contact's relay listener on its pinned or kept port (a free one the first time) and
    /// reports it: ``PeerEvent/relayListening(contact:port:)`` the first time,
    /// ``PeerEvent/relayReopened(contact:port:)`` on the same port after a reconnect. A kept port taken
    /// meanwhile, pinned or kept, gives way to a free one (delivery on the session goes on), reported as
    /// ``PeerEvent/relayPortUnavailable(contact:port:reason:instead:)``; the next reconnect tries it again.
    private func openRelayListener(for contact: Contact, over session: MultiplexerSession, address: String,
                                   marked: Bool) async throws -> Channel {
        let pinned = configuration.relayPorts[contact.name]
        let kept = state.withLockedValue { $0.relayPorts[contact.publicKey] }
        let observer = relayStreamObserver(for: contact, marked: marked)
        let listen = { (port: Int) in
            try await MultiplexerBridge.listen(host: "127.0.0.1", port: port, forwardingTo: session,
                                               streamInitializer: observer).get()
        }
        var listener: Channel
        if let wanted = pinned ?? kept {
            do {
                listener = try await listen(wanted)
            } catch {
                // A port taken meanwhile, pinned or kept, never stops delivery: the session stays up and the
                // relay listens on a free port until the next reconnect finds its own port free again.
                let reason = "\(NodeError.mapBindError(error, host: "127.0.0.1", port: wanted))"
                listener = try await listen(0)
                emit(.relayPortUnavailable(contact: contact.identity, port: wanted, reason: reason,
                                           instead: listener.localAddress?.port ?? 0))
            }
        } else {
            listener = try await listen(0)
        }
        let port = listener.localAddress?.port ?? 0
        let reopened = state.withLockedValue { state -> Bool in
            defer { state.relayPorts[contact.publicKey] = port }
            return state.relayPorts[contact.publicKey] == port
        }
        setRelayPort(contact, port)
        emit(reopened ? .relayReopened(contact: contact.identity, port: port) : .relayListening(contact: contact.identity, port: port))
        return listener
    }

    /// Watches each relayed stream to `contact`: counts it while open, and reports a stream the
    /// contact's node did not take to its app. Marked: the stream starts with a relay header, and the
    /// answer says; unmarked: a reset before any byte came back says (its app port did not take the
    /// connection).
    private func relayStreamObserver(for contact: Contact, marked: Bool) -> MultiplexerHandler.StreamInitializer {
        let writer = marked ? markingWriter(.relay, contact: contact, role: .connecting) : nil
        return { [weak self] stream in
            stream.eventLoop.makeCompletedFuture {
                guard let self else { return }
                self.relayConnectionOpened(stream)
                // An app's connection carried over the session is the contact reached and used: the session
                // ending later starts a new run of failures (a relay session never completes, so without this
                // every break over a day of roaming added to one run, and the sixth made the link rest).
                _ = self.updateLink(contact) { $0.sessionProgressed() }
                if let writer { return try stream.pipeline.syncOperations.addHandler(writer()) }
                try stream.pipeline.syncOperations.addHandler(RelayStreamObserver { [weak self] in
                    self?.emit(.relayAppUnreachable(contact: contact.identity, role: .connecting, error: nil))
                })
            }
        }
    }
}

/// On a relayed stream of the connecting side, before the handler that joins it to the app's
/// connection: calls `onRefused` when the peer resets the stream before sending a byte, which is how the
/// accepting node answers a stream its app port did not take.
final class RelayStreamObserver: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer

    private var replied = false
    private let onRefused: @Sendable () -> Void

    init(onRefused: @escaping @Sendable () -> Void) { self.onRefused = onRefused }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        replied = true
        context.fireChannelRead(data)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if case MultiplexerError.streamReset = error, !replied { onRefused() }
        context.fireErrorCaught(error)
    }
}
