import Logging
import ThaliAdmission
import NIOConcurrencyHelpers
import NIOCore
import ThaliSSDP

/// The Wi-Fi binding: SSDP discovery on the pinned interface, announcing the node's one port, and
/// fetching the beacons of every peer heard (ThaliSSDP's `SSDPDiscoveryService`).
final class PeerWiFiBinding: PeerBindingService {
    let kind = PeerBindingKind.wifi
    private let configuration: PeerConfiguration
    private let group: any EventLoopGroup
    private let logger: Logger
    private let service = NIOLockedValueBox<SSDPDiscoveryService?>(nil)
    private let eventsTask = NIOLockedValueBox<Task<Void, Never>?>(nil)

    init(configuration: PeerConfiguration, group: any EventLoopGroup, logger: Logger) {
        self.configuration = configuration
        self.group = group
        self.logger = logger
    }

    func start(nodeHost: String, nodePort: Int, events: @escaping @Sendable (PeerBindingEvent) -> Void) async throws {
        var ssdp = SSDPDiscoveryConfiguration(interfaceAddress: nodeHost)
        ssdp.groupAddress = configuration.ssdpGroup
        ssdp.port = configuration.ssdpPort
        ssdp.beaconServer = .external(port: nodePort)
        ssdp.maxAge = configuration.maxAge
        ssdp.foregroundAliveInterval = configuration.aliveInterval
        ssdp.limits = configuration.discoveryLimits
        let service = SSDPDiscoveryService(configuration: ssdp, group: group, logger: logger) { peer, bytes in
            events(.beaconsFetched(origin: .wifi(peer.location), location: peer.location, bytes: bytes))
        }
        do {
            try await service.start(advertising: nil)
        } catch SSDPDiscoveryService.StartError.noInterface {
            throw NodeError.noUsableInterface(name: nodeHost)
        }
        self.service.withLockedValue { $0 = service }
        let limits = (configuration.discoveryLimits, configuration.admission)
        let task = Task {
            for await event in service.events {
                switch event {
                case .appeared(let peer):
                    events(.peerAppeared(origin: .wifi(peer.location)))
                case .left(let peer, let reason):
                    events(.peerLeft(origin: .wifi(peer.location), reason: PeerDepartureReason(reason)))
                case .limitTriggered(let kind):
                    events(.limitTriggered(Self.report(of: kind, limits: limits.0, admission: limits.1)))
                case .beaconFetchFailed(let peer, let failure):
                    events(.beaconFetchFailed(origin: .wifi(peer.location), kind: failure.kind))
                case .changed, .beaconsFetched:
                    break
                }
            }
        }
        eventsTask.withLockedValue { $0 = task }
    }

    func advertise(_ announcement: [UInt8]?, isRotation: Bool) async {
        // Each new stream gets a new USN, so listeners fetch it (a rotation included).
        await service.withLockedValue { $0 }?.advertise(announcement)
    }

    func pauseAnnouncing(for period: Duration) {
        service.withLockedValue { $0 }?.pauseAnnouncing(for: period)
    }

    /// A peer on the network reached our port (discovery's unicast rule: unicast is not blocked).
    func noteInboundUnicast() {
        service.withLockedValue { $0 }?.noteInboundUnicast()
    }

    func location() async -> PeerLocation? {
        guard let service = service.withLockedValue({ $0 }) else { return nil }
        return .wifi(await service.location())
    }

    func hasEnded(_ location: BeaconLocation) -> Bool { false }

    /// SSDP moves to `host`, keeping its USN (``SSDPDiscoveryService/move(to:port:)``): byebye from the
    /// old socket where it still can, the alive at the new LOCATION at once, and a search.
    func interfaceAddressChanged(to host: String, nodePort: Int) async {
        guard let service = service.withLockedValue({ $0 }) else { return }
        do {
            try await service.move(to: host, port: nodePort)
        } catch {
            logger.error("SSDP could not move to the new address", metadata: ["address": "\(host)", "error": "\(error)"])
        }
    }

    func ssdpHealth() async -> PeerSSDPHealth? {
        guard let service = service.withLockedValue({ $0 }) else { return nil }
        return PeerSSDPHealth(await service.counters())
    }

    func contactMatched(at location: BeaconLocation) {
        service.withLockedValue { $0 }?.markContact(at: location)
    }

    /// Wi-Fi peers come from anywhere on the segment: this binding claims no source (it is the default).
    func carries(remoteHost: String) -> Bool { false }

    func stop() async {
        await service.withLockedValue { $0 }?.stop()
        eventsTask.withLockedValue { $0 }?.cancel()
    }

    /// What a fired limit switched off, for how long, and why; each is that limit's last resort, but
    /// narrowing, which switches nothing off (its period: the quiet time that ends its episode).
    static func report(of kind: SSDPDiscoveryEvent.LimitKind, limits: SSDPDiscoveryLimits,
                       admission: AdmissionLimits) -> PeerLimitReport {
        func seconds(_ amount: Duration) -> String { "\(amount.components.seconds) s" }
        switch kind {
        case .announcementFlood:
            return PeerLimitReport(kind: PeerLimitKind(kind), effect: .discoveryOff, period: limits.discoveryCooldown,
                                   detail: "SSDP discovery off for \(seconds(limits.discoveryCooldown)) (last resort: more than \(limits.maxDatagramsPerWindow) datagrams per \(seconds(limits.floodWindow)))")
        case .narrowed:
            return PeerLimitReport(kind: PeerLimitKind(kind), effect: .discoveryNarrowed, period: limits.narrowingEpisodeGap,
                                   detail: "SSDP discovery narrowed to a sample of the crowd (more than \(limits.maxTrackedPeers) peers or \(limits.maxDatagramsReadPerWindow) datagrams per \(seconds(limits.floodWindow))); nothing switched off, reported again after \(seconds(limits.narrowingEpisodeGap)) without narrowing")
        case .unicastFailure:
            return PeerLimitReport(kind: PeerLimitKind(kind), effect: .announcingPaused, period: limits.unicastFailurePause,
                                   detail: "announcing paused for \(seconds(limits.unicastFailurePause)) (last resort: \(limits.unicastFailureThreshold) unicast failures)")
        case .httpOverload:
            return PeerLimitReport(kind: PeerLimitKind(kind), effect: .portClosed, period: admission.overloadClosePeriod,
                                   detail: "beacon and PSK-TLS port closed and announcing paused for \(seconds(admission.overloadClosePeriod)) (last resort: more than \(admission.maxConnectionsGlobal) connections per \(seconds(admission.globalWindow)) from sources each within its own bounds)")
        }
    }
}
