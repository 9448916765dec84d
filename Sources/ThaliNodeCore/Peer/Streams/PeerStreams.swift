import Foundation
import NIOConcurrencyHelpers
import NIOCore
import TCPMultiplexer
import ThaliPSKTLS

/// Why ``ThaliPeer/openStream(to:protocol:timeout:)`` or ``ThaliPeer/handleStreams(protocol:)`` failed.
public enum PeerStreamError: Error, Hashable, Sendable, CustomStringConvertible {
    /// No marked session with the contact came up within the timeout (the contact is not around, or
    /// its node predates stream marking).
    case noSession(contact: String, waited: Duration)
    /// Streams of this protocol are handled already on this peer.
    case alreadyHandled(protocol: String)
    /// The protocol name cannot be carried in a stream header.
    case invalidProtocol(String, StreamHeaderError)
    /// The peer was stopped.
    case stopped

    public var description: String {
        switch self {
        case .noSession(let contact, let waited):
            "no session with \(contact) within \(waited): it was not found, or its node does not mark streams"
        case .alreadyHandled(let name): "streams of app protocol \"\(name)\" are handled already on this peer"
        case .invalidProtocol(let name, let error): "app protocol \"\(name)\" cannot be named in a stream header: \(error)"
        case .stopped: "the peer was stopped"
        }
    }
}

extension ThaliPeer {
    /// The most inbound streams of one protocol that wait for the app to take them from
    /// ``handleStreams(protocol:)``; more are refused (``StreamRefusal/Code/notServed``).
    public static let maximumWaitingStreams = 64

    /// Streams contacts open to this node for the app protocol `name` (kind `app/<name>`), as they
    /// arrive; the sequence ends when the peer stops. One handler per protocol: a second call throws
    /// ``PeerStreamError/alreadyHandled(protocol:)``. From the call on, the peer advertises to every
    /// contact and keeps its sessions open, so that contacts can reach it. Streams of a protocol nobody
    /// handles are refused with ``StreamRefusal/Code/notServed``.
    ///
    /// ```swift
    /// for await stream in try peer.handleStreams(protocol: "echo") {
    ///     Task { try await stream.withStream { inbound, outbound in
    ///         for try await bytes in inbound { try await outbound.write(bytes) }
    ///     } }
    /// }
    /// ```
    public func handleStreams(protocol name: String) throws -> AsyncStream<PeerStream> {
        do { _ = try StreamKind.app(name) } catch { throw PeerStreamError.invalidProtocol(name, error) }
        let (stream, continuation) = AsyncStream.makeStream(of: PeerStream.self,
                                                            bufferingPolicy: .bufferingOldest(Self.maximumWaitingStreams))
        let refusal = state.withLockedValue { state -> PeerStreamError? in
            if state.stopped { return .stopped }
            return state.appStreams.addHandler(continuation, for: name).map { _ in .alreadyHandled(protocol: name) }
        }
        if let refusal {
            continuation.finish()
            throw refusal
        }
        continuation.onTermination = { [weak self] _ in
            self?.state.withLockedValue { $0.appStreams.removeHandler(for: name) }
        }
        wantAppStreams()
        return stream
    }

    /// Opens a stream to the contact named `contact` for the app protocol `name` over a session with it
    /// (either side's), waiting up to `timeout` (default ``PeerStreamConfiguration/openTimeout``) for one
    /// to come up. From the call on, the peer advertises to every contact and keeps its sessions open.
    /// The header goes out with the stream's first bytes: nothing waits for the contact's answer, and a
    /// refusal fails the stream's first read with a ``StreamRefusal``. A session going away (GoAway) is
    /// passed over for another one with the contact, or for the next to come up. Throws
    /// ``NodeError/unknownContact(_:)``, ``PeerStreamError/noSession(contact:waited:)``.
    public func openStream(to contact: String, protocol name: String, timeout: Duration? = nil) async throws -> PeerStream {
        let kind: StreamKind
        do { kind = try StreamKind.app(name) } catch { throw PeerStreamError.invalidProtocol(name, error) }
        let found = try await blocking { [store] in try store.contact(named: contact) }
        wantAppStreams()
        let waited = timeout ?? configuration.streams.openTimeout
        let deadline = ContinuousClock.now + waited
        let wake = LinkWakeSignal()
        let waiterID = UUID()
        state.withLockedValue { $0.appStreams.addWaiter(waiterID, contactKey: found.publicKey, wake: wake) }
        defer { state.withLockedValue { $0.appStreams.removeWaiter(waiterID) } }
        while true {
            if isStopped { throw PeerStreamError.stopped }
            if let usable = state.withLockedValue({ $0.appStreams.session(for: found.publicKey) }) {
                let id = usable.id
                do {
                    return try await openAppStream(kind, to: found, over: usable.session)
                } catch MultiplexerError.sessionClosed {
                    continue  // it closed meanwhile; another may be up, or come
                } catch MultiplexerError.goingAway {
                    // It takes no new streams again (its open ones carry on): no open picks it any more.
                    forgetMarkedSession(id, of: found.publicKey)
                    continue
                }
            }
            let left = deadline - ContinuousClock.now
            guard left > .zero else { throw PeerStreamError.noSession(contact: contact, waited: waited) }
            await wake.wait(upTo: left)
        }
    }

    private func openAppStream(_ kind: StreamKind, to contact: Contact, over marked: MarkedSession) async throws -> PeerStream {
        let opened = NIOLockedValueBox<NIOAsyncChannel<ByteBuffer, ByteBuffer>?>(nil)
        let header = markingWriter(kind, contact: contact, role: marked.role)
        let linger = configuration.streams.closeLinger
        _ = try await marked.session.openStream(initializer: { stream in
            stream.eventLoop.makeCompletedFuture {
                try stream.pipeline.syncOperations.addHandler(header())
                let channel = try Self.wrapAppStream(stream, linger: linger)
                opened.withLockedValue { $0 = channel }
            }
        }).get()
        guard let channel = opened.withLockedValue({ $0 }) else { throw MultiplexerError.sessionClosed }
        return PeerStream(contact: contact.name, protocolName: kind.appProtocol ?? kind.name, channel: channel)
    }

    private static func wrapAppStream(_ stream: Channel, linger: Duration) throws -> NIOAsyncChannel<ByteBuffer, ByteBuffer> {
        try stream.syncOptions?.setOption(.allowRemoteHalfClosure, value: true)
        try stream.pipeline.syncOperations.addHandler(OrderlyCloseHandler(linger: TimeAmount(linger)), position: .first)
        return try NIOAsyncChannel(wrappingChannelSynchronously: stream,
                                   configuration: .init(isOutboundHalfClosureEnabled: true))
    }

    /// From the first ``handleStreams(protocol:)`` or ``openStream(to:protocol:timeout:)`` on: advertise to
    /// every contact and keep sessions open.
    private func wantAppStreams() {
        guard state.withLockedValue({ $0.appStreams.wantStreams() }) else { return }
        spawn { [self] in
            guard !bindings.isEmpty, !isStopped else { return }
            try? await refreshAdvertisement()
        }
    }

    /// Whether sessions stay open after delivery and every contact is advertised to: relay mode, or an
    /// app that uses streams.
    var keepsSessionsOpen: Bool {
        configuration.appPort != nil || state.withLockedValue { $0.appStreams.streamsWanted }
    }

    // MARK: Sessions

    /// Keeps a marked session with `contact` for ``openStream(to:protocol:timeout:)`` until it closes, and
    /// wakes the opens that wait for one.
    func registerMarkedSession(_ session: MultiplexerSession, contact: Contact, role: PeerEvent.Role) {
        let id = ObjectIdentifier(session)
        let waiting = state.withLockedValue {
            $0.appStreams.sessionUp(id, MarkedSession(session: session, role: role), contactKey: contact.publicKey)
        }
        for wake in waiting { wake.signal() }
        session.channel.closeFuture.whenComplete { [weak self] _ in
            self?.forgetMarkedSession(id, of: contact.publicKey)
        }
    }

    /// Takes a session out of the ones ``openStream(to:protocol:timeout:)`` picks from: it closed, or it
    /// answered GoAway.
    private func forgetMarkedSession(_ id: ObjectIdentifier, of contactKey: String) {
        state.withLockedValue { $0.appStreams.forgetSession(id, contactKey: contactKey) }
    }

    /// Ends every ``handleStreams(protocol:)`` sequence (the peer stops).
    func finishStreamHandlers() {
        let handlers = state.withLockedValue { $0.appStreams.takeHandlers() }
        for handler in handlers { handler.finish() }
    }

    // MARK: Marking

    /// Whether a handshake agreed on marked streams.
    static func isMarked(_ parameters: PSKTLSNegotiatedParameters) -> Bool {
        parameters.applicationProtocol == StreamHeader.alpnProtocol
    }

    /// Makes the opener's handler for a stream of `kind` to `contact` (first in the stream's pipeline):
    /// a refusal or a bad answer is reported as ``PeerEvent/streamRefused(contact:role:kind:refusal:byThisNode:)``
    /// (a relay's dead app port as ``PeerEvent/relayAppUnreachable(contact:role:error:)``, as before).
    func markingWriter(_ kind: StreamKind, contact: Contact, role: PeerEvent.Role) -> @Sendable () -> StreamHeaderWriter {
        let timeout = TimeAmount(configuration.streams.headerTimeout)
        let emit = self.emit
        return {
            StreamHeaderWriter(header: StreamHeader(kind: kind), timeout: timeout) { error in
                let refusal = error as? StreamRefusal ?? StreamRefusal(.badHeader, reason: "\(error)")
                if kind == .relay, refusal.code == .appUnreachable {
                    emit(.relayAppUnreachable(contact: contact.identity, role: role, error: nil))
                } else {
                    emit(.streamRefused(contact: contact.identity, role: role, kind: kind.name, refusal: refusal, byThisNode: false))
                }
            }
        }
    }

    /// The side that did not open a marked stream: reads its header and serves its kind.
    func serveMarkedStream(_ stream: Channel, for contact: Contact, from address: String, role: PeerEvent.Role) -> EventLoopFuture<Void> {
        let emit = self.emit
        return stream.eventLoop.makeCompletedFuture {
            try stream.pipeline.syncOperations.addHandler(StreamHeaderReader(
                timeout: TimeAmount(configuration.streams.headerTimeout),
                dispatch: { [self] kind, stream in dispatch(kind, stream, for: contact, from: address, role: role) },
                refused: { kind, refusal in
                    // A relay whose app port is dead was reported as relayAppUnreachable already.
                    guard refusal.code != .appUnreachable else { return }
                    emit(.streamRefused(contact: contact.identity, role: role, kind: kind?.name, refusal: refusal, byThisNode: true))
                }))
        }
    }

    /// Sets a stream of `kind` up, or says why not.
    private func dispatch(_ kind: StreamKind, _ stream: Channel, for contact: Contact, from address: String,
                          role: PeerEvent.Role) -> EventLoopFuture<StreamStatus> {
        let loop = stream.eventLoop
        switch kind {
        case .delivery:
            return serveDelivery(stream, for: contact, from: address, role: role).map { .accepted }
        case .relay:
            guard let port = configuration.appPort else {
                return loop.makeSucceededFuture(.refused(StreamRefusal(
                    .notServed, reason: "relay is not served: this node has no app port")))
            }
            return relayToApp(stream, port: port, for: contact).map { .accepted }.recover { error in
                let failure = PeerConnectionError(error, address: "127.0.0.1:\(port)")
                return .refused(StreamRefusal(.appUnreachable, reason: "the app port \(failure.address) did not take the connection: \(failure)"))
            }
        default:
            guard let name = kind.appProtocol else {
                return loop.makeSucceededFuture(.refused(StreamRefusal(.unknownKind, reason: "unknown stream kind \(kind.name)")))
            }
            let handler = state.withLockedValue { $0.appStreams.handlers[name] }
            guard let handler else {
                return loop.makeSucceededFuture(.refused(StreamRefusal(.notServed, reason: "app protocol \(name) is not served here")))
            }
            let linger = configuration.streams.closeLinger
            return loop.makeCompletedFuture {
                let channel = try Self.wrapAppStream(stream, linger: linger)
                if case .enqueued = handler.yield(PeerStream(contact: contact.name, protocolName: name, channel: channel)) {
                    return .accepted
                }
                return .refused(StreamRefusal(.notServed, reason: "app protocol \(name): too many streams wait for the app"))
            }
        }
    }
}

/// A session whose streams are marked, with the side this peer is on.
struct MarkedSession: Sendable {
    let session: MultiplexerSession
    let role: PeerEvent.Role
}
