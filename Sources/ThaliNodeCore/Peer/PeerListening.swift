import NIOCore
import NIOPosix
import ThaliAdmission
import ThaliSSDP

/// What the node's single port has done, for ``PeerStatus``.
public struct PeerPortCounters: Sendable, Hashable, Codable {
    /// The admission gate's counts: admitted, authenticated, refusals by reason, overloads.
    public var admission = AdmissionCounters()
    /// Connections recognised as beacon requests (HTTP).
    public var beaconRequests = 0
    /// Connections recognised as PSK-TLS (first byte 0x16).
    public var tlsConnections = 0
    /// Connections cut because they sent no request (or no TLS record) within
    /// ``PeerConfiguration/firstByteTimeout``, or did not finish their beacon request within it.
    public var timedOut = 0

    /// All zero.
    public init() {}
}

extension ThaliPeer {
    /// Binds the node's one TCP port: every connection passes the admission gate (per source, then
    /// global) before a byte is read, and a source in its refusal period is dropped by the kernel
    /// before it is accepted (``ListenerSourceFilter``); its first byte sends it to the beacon server (HTTP) or to PSK-TLS.
    /// Returns the bound port.
    /// `port` (nil: the one bound before, else the configuration's) on ``boundAddress``.
    func bindPort(port requested: Int? = nil) async throws -> Int {
        let channel = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .serverChannelOption(.backlog, value: 256)
            .childChannelInitializer { [weak self] channel in
                guard let self else { return channel.close() }
                return self.admitConnection(channel)
            }
            .bind(host: boundAddress, port: requested ?? state.withLockedValue { $0.boundPort } ?? configuration.port).get()
        // Sources in their refusal period are refused by the kernel too: no accept, no close.
        ListenerSourceFilter.attach(to: channel, admission: admission)
        let port = channel.localAddress?.port ?? configuration.port
        let keep = state.withLockedValue { state -> Bool in
            guard !state.stopped else { return false }
            state.listener = channel
            state.boundPort = port
            return true
        }
        if !keep { try? await channel.close() }
        return port
    }

    /// Closes the listening socket (the connections it accepted stay).
    func closePort() async {
        let listener = state.withLockedValue { state -> Channel? in
            defer { state.listener = nil }
            return state.listener
        }
        try? await listener?.close()
    }

    /// The gate's verdict, then the sniffer: nothing is read from a connection the gate refused.
    private func admitConnection(_ channel: Channel) -> EventLoopFuture<Void> {
        let source = channel.remoteAddress?.ipAddress ?? "?"
        let ticket: AdmissionTicket<String>
        switch admission.admit(source) {
        case .success(let admitted):
            ticket = admitted
        case .failure:
            return channel.close()
        }
        // From the network, not a Bluetooth peer's relay on loopback: unicast to us works.
        let bindings = self.bindings
        if !bindings.contains(where: { $0.kind != .wifi && $0.carries(remoteHost: source) }) {
            for case let wifi as PeerWiFiBinding in bindings { wifi.noteInboundUnicast() }
        }
        ticket.release(when: channel.closeFuture)
        // Until its first byte (and, for HTTP, until its answer), a connection has firstByteTimeout, longer
        // on a path whose handshake the kernel measured slow.
        let (configuration, counters) = (self.configuration, portCounters)
        let timeout = channel.kernelRoundTrip().map { roundTrip in
            channel.eventLoop.scheduleTask(in: TimeAmount(configuration.firstByteTimeout(roundTrip: roundTrip?.retransmissionTimeout))) {
                counters.withLockedValue { $0.timedOut += 1 }
                channel.close(promise: nil)
            }
        }
        channel.closeFuture.whenComplete { _ in timeout.whenSuccess { $0.cancel() } }
        let http: @Sendable (Channel) throws -> Void = { [weak self] channel in
            guard let self else { throw ChannelError.ioOnClosedChannel }
            portCounters.withLockedValue { $0.beaconRequests += 1 }
            try BeaconHTTPServer.configureRequestHandling(on: channel, beacons: { [weak self] in self?.servedStream },
                                                          retryAfterIfBusy: { [admission] in admission.retryAfterIfBusy() })
        }
        let secure: @Sendable (Channel) -> EventLoopFuture<Void> = { [weak self] channel in
            // PSK-TLS bounds its own time (the handshake timeout); the gate holds its unauthenticated slot
            // until the handshake succeeds.
            timeout.whenSuccess { $0.cancel() }
            guard let self else { return channel.close() }
            portCounters.withLockedValue { $0.tlsConnections += 1 }
            return acceptSecureConnection(channel, onAuthenticated: { ticket.authenticated() })
        }
        return channel.eventLoop.makeCompletedFuture {
            try channel.pipeline.syncOperations.addHandler(ConnectionKindSniffer(http: http, secure: secure))
        }
    }

    /// The announcement served now (nil: nothing advertised, the request gets 204).
    var servedStream: [UInt8]? {
        state.withLockedValue { state in
            guard let advertised = state.advertised, advertised.streams.indices.contains(advertised.serving) else { return nil }
            return advertised.streams[advertised.serving]
        }
    }

    /// The last resort of the port's admission: more connections than the global rate allows, from
    /// sources each within its own bounds. The port closes for `period` (the kernel refuses instead of
    /// us) and announcing pauses, so that listeners stop coming; then both resume.
    func portOverloaded(for period: Duration) {
        let listener = state.withLockedValue { state -> Channel? in
            guard !state.stopped else { return nil }
            defer { state.listener = nil }
            return state.listener
        }
        guard let listener else { return }
        logger.warning("single port overloaded; closed", metadata: ["seconds": "\(period.components.seconds)"])
        listener.close(promise: nil)
        for binding in bindings { binding.pauseAnnouncing(for: period) }
        arm(.reopenPort, after: period)
    }

    /// The overload's period is over: the port opens again.
    func reopenPort() async {
        guard !isStopped else { return }
        do {
            _ = try await bindPort()
        } catch {
            logger.error("single port could not reopen", metadata: ["error": "\(error)"])
        }
    }
}
