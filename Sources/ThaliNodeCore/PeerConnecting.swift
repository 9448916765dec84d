import Foundation
import NIOCore
import NIOPosix
import TCPMultiplexer
import ThaliBeacons
import ThaliPSKTLS
import ThaliSSDP

extension ThaliPeer {
    /// The connecting side of one contact: performs what its ``ContactLinkStateMachine`` decides
    /// (connect over the preferred route, fall back, back off, give up) until it has nothing left to do.
    func runLink(_ contact: Contact) async {
        while true {
            let step = state.withLockedValue { state -> (ContactLinkStateMachine.Action, LinkWakeSignal?) in
                guard var link = state.links[contact.publicKey] else { return (.finish, nil) }
                defer { state.links[contact.publicKey] = link }
                if state.stopped || Task.isCancelled {
                    link.machine.stopped()
                    return (.finish, nil)
                }
                return (link.machine.nextAction(), link.wake)
            }
            switch step.0 {
            case .finish:
                return
            case .wait(let delay):
                await step.1?.wait(upTo: delay)
                updateLink(contact) { $0.backoffEnded() }
            case .connect(let route, let attempt):
                emit(.connecting(contact: contact.name, location: route.origin, attempt: attempt))
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
                    emit(.connectionFailed(contact: contact.name, reason: PeerConnectionError(error, connectingTo: route.location),
                                           retryIn: retryIn))
                }
            }
        }
    }

    /// Whether `error` is the server's `unknown_psk_identity` alert.
    static func isUnknownIdentity(_ error: any Error) -> Bool {
        (error as? PSKTLSError)?.reason == .alertReceived(.unknownPSKIdentity)
    }

    /// One connection: PSK-TLS as the client with the match's identity and PSK, a yamux session, then the
    /// delivery receiver on one stream (or, in relay mode, a local listener until the session ends).
    private func connect(_ contact: Contact, _ route: ContactRoute) async throws {
        let (match, location) = (route.match, route.location)
        let clientContext = self.clientContext
        let emit = self.emit
        // From the pinned interface's address: the one this peer announces, and the source the other
        // peer's per-source admission sees.
        var bootstrap = ClientBootstrap(group: group)
        // A Bluetooth peer's port appears on 127.0.0.1 (its relay): that one is reached from loopback.
        if route.binding == .wifi {
            bootstrap = bootstrap.bind(to: try SocketAddress(ipAddress: configuration.interfaceAddress, port: 0))
        }
        let client = try await bootstrap
            .connectTimeout(configuration.tls.connectTimeout)
            .connect(host: location.host, port: location.port) { channel in
                AuthenticatedSession.configureClient(on: channel, context: clientContext, identity: match.pskIdentity,
                                                     psk: match.psk)
                    .flatMapThrowing { client in
                        // Reported only once the handshake authenticated the contact.
                        try channel.pipeline.syncOperations.addHandler(ConnectionEndRecorder { error in
                            client.handshake.whenSuccess { _ in
                                emit(.disconnected(contact: contact.name, role: .connecting, binding: route.binding,
                                                   reason: error.map { PeerConnectionError($0, connectingTo: location) }))
                            }
                        })
                        return client
                    }
            }
        let session = client.session
        register(session.channel)
        do {
            _ = try await client.handshake.get()
        } catch {
            try? await session.channel.close()
            throw error
        }
        emit(.connected(contact: contact.name, role: .connecting, binding: route.binding))
        updateLink(contact) { $0.connected() }
        if configuration.appPort != nil {
            try await relay(contact, over: session, at: route.location)
        } else {
            try await receive(from: contact, over: session, at: route.location)
        }
    }

    private func receive(from contact: Contact, over session: MultiplexerSession, at location: BeaconLocation) async throws {
        let limits = configuration.deliveryLimits
        sessionStarted()
        defer { sessionFinished() }
        do {
            let frames = try await DeliveryChannel.openStream(on: session, limits: limits)
            _ = try await DeliveryReceiver(store: store, authenticatedPeer: contact, limits: limits,
                                           events: { [emit] in emit(.delivery(contact: contact.name, $0)) },
                                           logger: logger).run(on: frames)
            emit(.sessionEnded(contact: contact.name, role: .connecting, error: nil))
            try? await session.close().get()
        } catch {
            emit(.sessionEnded(contact: contact.name, role: .connecting, error: sessionEndError(error, address: "\(location.host):\(location.port)")))
            try? await session.close().get()
            throw error
        }
    }

    /// Relay mode: connections to a local port become streams to the contact's app, until the session
    /// ends (then the link retries while the contact's beacon is valid).
    private func relay(_ contact: Contact, over session: MultiplexerSession, at location: BeaconLocation) async throws {
        let listener = try await MultiplexerBridge.listen(host: "127.0.0.1", port: 0, forwardingTo: session).get()
        let port = listener.localAddress?.port ?? 0
        setRelayPort(contact, port)
        emit(.relayListening(contact: contact.name, port: port))
        await withTaskCancellationHandler {
            try? await session.channel.closeFuture.get()
        } onCancel: {
            session.channel.close(promise: nil)
        }
        try? await listener.close()
        setRelayPort(contact, nil)
        throw PeerConnectionError(.relayClosed, address: "\(location.host):\(location.port)")
    }
}
