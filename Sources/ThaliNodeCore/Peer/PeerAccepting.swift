import Foundation
import NIOConcurrencyHelpers
import NIOCore
import TCPMultiplexer
import ThaliBeacons
import ThaliPSKTLS

extension ThaliPeer {
    /// The accepting side, on a connection the beacon port recognised as TLS: an ``AuthenticatedSession``
    /// whose PSKs are the beacons we advertised, each naming its contact. On a marked session each stream
    /// the peer opens names its kind (delivery, relay, an app protocol) and is served by it; on an
    /// unmarked one each runs a delivery sender for that contact (or, in relay mode, a connection to the
    /// app port).
    /// `onAuthenticated` runs when the handshake succeeded (the admission gate frees the connection's
    /// unauthenticated slot).
    func acceptSecureConnection(_ channel: Channel, onAuthenticated: @escaping @Sendable () -> Void) -> EventLoopFuture<Void> {
        let table = self.table
        let contacts = self.contactsByKey
        let binding = bindingCarrying(channel)
        let address = channel.remoteAddress.map { "\($0.ipAddress ?? "?"):\($0.port ?? 0)" } ?? "?"
        register(channel)
        return AuthenticatedSession.configureServer(on: channel, context: serverContext, lookup: { identity in
            // On the event loop, during the handshake: tables only, no store.
            guard let advertised = table.lookup(identity: identity),
                  let contact = contacts.withLockedValue({ $0[advertised.contact.hexString(compressed: true)] }) else {
                return nil
            }
            return (advertised.psk, contact)
        }, inboundStream: { [self] (stream: Channel, contact: Contact, parameters: PSKTLSNegotiatedParameters) in
            if Self.isMarked(parameters) { return serveMarkedStream(stream, for: contact, from: address, role: .accepting) }
            return serveUnmarkedStream(stream, for: contact, from: address)
        }).flatMapThrowing { [self, emit] server in
            server.peer.and(server.handshake).whenSuccess { [self] contact, parameters in
                onAuthenticated()
                if binding == .wifi, let host = channel.remoteAddress?.ipAddress {
                    acceptedWiFiConnection(channel, from: host, contact: contact)
                }
                if Self.isMarked(parameters) { registerMarkedSession(server.session, contact: contact, role: .accepting) }
                emit(.connected(contact: contact.identity, role: .accepting, binding: binding, remote: address))
                // In relay mode the session itself is the work in flight (its streams come and go).
                if configuration.appPort != nil {
                    sessionStarted()
                    channel.closeFuture.whenComplete { [weak self] _ in self?.sessionFinished() }
                }
            }
            // Reported only for a connection that authenticated a contact.
            try channel.pipeline.syncOperations.addHandler(ConnectionEndRecorder { error in
                server.peer.whenSuccess { contact in
                    emit(.disconnected(contact: contact.identity, role: .accepting, binding: binding, remote: address,
                                       reason: error.map { PeerConnectionError($0, address: address) }))
                }
            })
        }
    }

    /// The binding an accepted connection came over: the one that recognises its source (a Bluetooth
    /// peer's relayed connections come from its own loopback address), else Wi-Fi when it runs.
    private func bindingCarrying(_ channel: Channel) -> PeerBindingKind {
        let bindings = self.bindings
        if let host = channel.remoteAddress?.ipAddress, let carrier = bindings.first(where: { $0.carries(remoteHost: host) }) {
            return carrier.kind
        }
        return bindings.contains { $0.kind == .wifi } ? .wifi : .bluetooth
    }

    /// A stream of a session without marking: the node's mode decides what it carries, as before marking.
    private func serveUnmarkedStream(_ stream: Channel, for contact: Contact, from address: String) -> EventLoopFuture<Void> {
        if let appPort = configuration.appPort {
            return relayToApp(stream, port: appPort, for: contact)
        }
        return serveDelivery(stream, for: contact, from: address, role: .accepting)
    }

    /// Runs a delivery sender for `contact` on `stream` (whose opener receives).
    func serveDelivery(_ stream: Channel, for contact: Contact, from address: String, role: PeerEvent.Role) -> EventLoopFuture<Void> {
        // The stream's parent is the connection it was opened on.
        let limits = deliveryLimits(over: stream.parent.map(bindingCarrying) ?? .wifi)
        return stream.eventLoop.makeCompletedFuture {
            if let rate = configuration.sendThrottleBytesPerSecond {
                try stream.pipeline.syncOperations.addHandler(ThrottleHandler(bytesPerSecond: rate))
            }
            let frames = try DeliveryChannel.configureSynchronously(stream, limits: limits)
            // A version 5 session lingers once everything is answered, holding one of the port's
            // connections: only while at most half of them (globally, and from this source) are open.
            let host = String(address[..<(address.lastIndex(of: ":") ?? address.endIndex)])
            let mayLinger: @Sendable () -> Bool = { [admission] in
                admission.openConnections < admission.limits.maxOpenGlobal / 2
                    && admission.openConnections(of: host) < admission.limits.maxOpenPerSource / 2
            }
            let newItems = LinkWakeSignal()
            let lingered = NIOLockedValueBox(false)
            spawn { [self] in
                sessionStarted()
                senderStarted(newItems, contactKey: contact.publicKey)
                defer {
                    senderEnded(newItems, contactKey: contact.publicKey, lingered: lingered.withLockedValue { $0 })
                    sessionFinished()
                }
                do {
                    _ = try await DeliverySender(store: store, authenticatedPeer: contact, limits: limits,
                                                 events: { [emit] in emit(.delivery(contact: contact.identity, $0)) },
                                                 logger: logger, newItems: newItems, mayLinger: mayLinger,
                                                 onLinger: { [self] in
                                                     lingered.withLockedValue { $0 = true }
                                                     senderLingers(contactKey: contact.publicKey)
                                                 }).run(on: frames)
                    emit(.sessionEnded(contact: contact.identity, role: role, error: nil))
                } catch {
                    emit(.sessionEnded(contact: contact.identity, role: role, error: sessionEndError(error, address: address)))
                }
            }
        }
    }
}

extension ThaliPeer {
    /// The delivery limits of a session over `binding`. Over Bluetooth a session does not linger (version
    /// 5): a link is one of a few slots an adapter has, and holding one idle would keep the contacts
    /// waiting for a slot from being served in turn.
    func deliveryLimits(over binding: PeerBindingKind) -> DeliveryLimits {
        var limits = configuration.deliveryLimits
        if binding == .bluetooth { limits.lingerInterval = .zero }
        return limits
    }

    /// A delivery sender for the contact with `contactKey` began: ``wakeDeliverySenders(of:)`` reaches it
    /// through `newItems`.
    func senderStarted(_ newItems: LinkWakeSignal, contactKey: String) {
        state.withLockedValue { $0.deliverySenders[ObjectIdentifier(newItems)] = (contactKey, newItems) }
    }

    /// A delivery sender for the contact with `contactKey` lingers: its new items go on that session, and
    /// are not announced for until it ends.
    func senderLingers(contactKey: String) {
        state.withLockedValue { $0.lingeringWith[contactKey, default: 0] += 1 }
    }

    /// A delivery sender ended. If it had lingered, the items it did not carry are announced for again.
    func senderEnded(_ newItems: LinkWakeSignal, contactKey: String, lingered: Bool) {
        state.withLockedValue { state in
            state.deliverySenders[ObjectIdentifier(newItems)] = nil
            guard lingered, let count = state.lingeringWith[contactKey] else { return }
            state.lingeringWith[contactKey] = count > 1 ? count - 1 : nil
        }
        if lingered { announceIfRunning() }
    }
}

extension ThaliPeer {
    /// Relay mode: joins a stream the contact opened to a new connection to the app port, counted while
    /// open. When the app port does not take the connection, the stream is reset (the contact's node
    /// reports that to its app) and ``PeerEvent/relayAppUnreachable(contact:role:error:)`` says why.
    func relayToApp(_ stream: Channel, port: Int, for contact: Contact) -> EventLoopFuture<Void> {
        MultiplexerBridge.connectingInitializer(host: "127.0.0.1", port: port)(stream).map { [weak self] in
            self?.relayConnectionOpened(stream)
        }.flatMapErrorThrowing { [emit] error in
            emit(.relayAppUnreachable(contact: contact.identity, role: .accepting,
                                      error: PeerConnectionError(error, address: "127.0.0.1:\(port)")))
            throw error
        }
    }
}
