import Foundation
import NIOCore
import NIOPosix
import TCPMultiplexer
import ThaliBeacons
import ThaliPSKTLS
import ThaliSSDP

/// Why a link to a matched peer ended before its work was done.
struct LinkFailure: Error, CustomStringConvertible {
    let description: String
}

extension ThaliPeer {
    /// The connecting side of one contact: connects with the newest match, receives (or relays) until the
    /// session ends, and retries with backoff while the match is valid. A newer match (the contact
    /// re-announced, or restarted elsewhere) replaces the one in use at the next attempt.
    func runLink(_ contact: Contact) async {
        var attempt = 0
        var current: (match: BeaconMatch, location: BeaconLocation)?
        while !Task.isCancelled {
            // Take the newest match, or end the link if there is none and the current one is spent.
            let next = state.withLockedValue { state -> (match: BeaconMatch, location: BeaconLocation)?? in
                guard var link = state.links[contact.publicKey] else { return .none }
                if let pending = link.pending {
                    link.pending = nil
                    state.links[contact.publicKey] = link
                    return .some(pending)
                }
                return .some(nil)
            }
            guard let next else { break }
            if let fresh = next {
                current = fresh
                attempt = 0
            } else if attempt == 0 {
                // The last session completed and nothing newer arrived: done until the next announcement.
                if finishLink(contact, state: "idle") { break } else { continue }
            }
            guard let target = current else { break }
            attempt += 1
            emit(.connecting(contact: contact.name, location: target.location.description, attempt: attempt))
            setLinkState(contact, "connecting")
            do {
                try await connect(contact, target.match, target.location)
                attempt = 0
                setLinkState(contact, "idle")
            } catch {
                let nowMs = UInt64(Date().timeIntervalSince1970 * 1000)
                // unknown_psk_identity: the peer at that location no longer holds (or never held) this
                // beacon's PSK; retrying cannot help (spec/psk-tls.md), only a new announcement can.
                // Nor can a Bluetooth relay port whose connection ended: the peer's next match brings a new one.
                let canRetry = attempt < configuration.retry.maxAttempts && target.match.expiration > nowMs
                    && !Self.isUnknownIdentity(error) && !(bluetooth?.hasEnded(target.location) ?? false)
                let delay = canRetry ? configuration.retry.delay(after: attempt) : nil
                emit(.connectionFailed(contact: contact.name, reason: "\(error)", retryIn: delay))
                guard let delay else {
                    current = nil
                    attempt = 0
                    if finishLink(contact, state: "gave-up") { break } else { continue }
                }
                setLinkState(contact, "backoff")
                await backoff(delay, for: contact)
            }
        }
        _ = finishLink(contact, state: "idle", force: true)
    }

    /// Whether `error` is the server's `unknown_psk_identity` alert.
    static func isUnknownIdentity(_ error: any Error) -> Bool {
        (error as? PSKTLSError)?.reason == .alertReceived(.unknownPSKIdentity)
    }

    /// Waits `delay`, or less if a newer match for `contact` arrives (the contact restarted, or moved).
    private func backoff(_ delay: Duration, for contact: Contact) async {
        let clock = ContinuousClock()
        let end = clock.now + delay
        while clock.now < end, !Task.isCancelled {
            if state.withLockedValue({ $0.links[contact.publicKey]?.pending != nil }) { return }
            try? await Task.sleep(for: min(.milliseconds(100), end - clock.now))
        }
    }

    /// Marks the link not running unless a new match arrived meanwhile (then the caller goes on).
    private func finishLink(_ contact: Contact, state text: String, force: Bool = false) -> Bool {
        state.withLockedValue { state in
            guard var link = state.links[contact.publicKey] else { return true }
            if link.pending != nil && !force && !state.stopped { return false }
            link.running = false
            link.state = text
            state.links[contact.publicKey] = link
            return true
        }
    }

    /// One connection: PSK-TLS as the client with the match's identity and PSK, a yamux session, then the
    /// delivery receiver on one stream (or, in relay mode, a local listener until the session ends).
    private func connect(_ contact: Contact, _ match: BeaconMatch, _ location: BeaconLocation) async throws {
        let handshake = group.next().makePromise(of: PSKTLSNegotiatedParameters.self)
        let clientContext = self.clientContext
        let emit = self.emit
        let session: MultiplexerSession
        do {
            // From the pinned interface's address: the one this peer announces, and the source the other
            // peer's per-source admission sees.
            var bootstrap = ClientBootstrap(group: handshake.futureResult.eventLoop)
            // A Bluetooth peer's port appears on 127.0.0.1 (its relay): that one is reached from loopback.
            if location.host != "127.0.0.1" {
                bootstrap = bootstrap.bind(to: try SocketAddress(ipAddress: configuration.interfaceAddress, port: 0))
            }
            session = try await bootstrap
                .connectTimeout(configuration.tls.connectTimeout)
                .connect(host: location.host, port: location.port) { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(
                            PSKTLSHandler(clientContext: clientContext, identity: match.pskIdentity, psk: match.psk,
                                          handshakePromise: handshake))
                    }.flatMap {
                        MultiplexerSession.configure(on: channel, role: .client)
                    }.flatMapThrowing { session in
                        // Reported only once the handshake authenticated the contact.
                        try channel.pipeline.syncOperations.addHandler(ConnectionEndRecorder { reason in
                            handshake.futureResult.whenSuccess { _ in
                                emit(.disconnected(contact: contact.name, role: .connecting, reason: reason))
                            }
                        })
                        return session
                    }
                }
        } catch {
            handshake.fail(error)
            throw error
        }
        register(session.channel)
        do {
            _ = try await handshake.futureResult.get()
        } catch {
            try? await session.channel.close()
            throw error
        }
        emit(.connected(contact: contact.name, role: .connecting))
        setLinkState(contact, "connected")
        if configuration.appPort != nil {
            try await relay(contact, over: session)
        } else {
            try await receive(from: contact, over: session)
        }
    }

    private func receive(from contact: Contact, over session: MultiplexerSession) async throws {
        let limits = configuration.deliveryLimits
        sessionStarted()
        defer { sessionFinished() }
        do {
            let stream = try await session.openStream().get()
            let frames = try await stream.eventLoop.submit {
                try DeliveryChannel.configureSynchronously(stream, limits: limits)
            }.get()
            _ = try await DeliveryReceiver(store: store, authenticatedPeer: contact, limits: limits,
                                           events: { [emit] in emit(.delivery(contact: contact.name, $0)) },
                                           logger: logger).run(on: frames)
            emit(.sessionEnded(contact: contact.name, role: .connecting, error: nil))
            try? await session.close().get()
        } catch {
            emit(.sessionEnded(contact: contact.name, role: .connecting, error: "\(error)"))
            try? await session.close().get()
            throw error
        }
    }

    /// Relay mode: connections to a local port become streams to the contact's app, until the session
    /// ends (then the link retries while the contact's beacon is valid).
    private func relay(_ contact: Contact, over session: MultiplexerSession) async throws {
        let listener = try await MultiplexerBridge.listen(host: "127.0.0.1", port: 0, forwardingTo: session).get()
        let port = listener.localAddress?.port ?? 0
        setLinkState(contact, "connected", relayPort: .some(port))
        emit(.relayListening(contact: contact.name, port: port))
        await withTaskCancellationHandler {
            try? await session.channel.closeFuture.get()
        } onCancel: {
            session.channel.close(promise: nil)
        }
        try? await listener.close()
        setLinkState(contact, "connecting", relayPort: .some(nil))
        throw LinkFailure(description: "relay session with \(contact.name) closed")
    }
}
