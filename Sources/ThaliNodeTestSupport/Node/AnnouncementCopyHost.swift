import NIOCore
import NIOPosix
import Testing
import ThaliBeacons
import ThaliNodeCore
import ThaliSSDP

/// A host on 127.0.0.1 that re-serves a copy of `sender`'s announcement for `receiver` over SSDP from
/// its own port: the beacons over HTTP, and each PSK-TLS connection set up by `secure` (an attacker
/// without the PSK, a host that stalls the handshake, ...).
public struct AnnouncementCopyHost: Sendable {
    public let listener: Channel
    public let discovery: SSDPDiscoveryService
    /// Where the receiver finds the copy.
    public let location: PeerLocation

    public init(copying sender: TestPeople.Person, for receiver: TestPeople.Person, ssdpPort: Int,
                secure: @escaping @Sendable (Channel) -> EventLoopFuture<Void>) async throws {
        let stream = try BeaconGenerator(identity: sender.key).makeAnnouncement(for: [receiver.key.publicKey], validity: .seconds(600)).stream
        listener = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(ConnectionKindSniffer(
                        http: { try BeaconHTTPServer.configureRequestHandling(on: $0) { stream } }, secure: secure))
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        var ssdp = SSDPDiscoveryConfiguration(interfaceAddress: "127.0.0.1")
        ssdp.port = ssdpPort
        ssdp.beaconServer = .external(port: try #require(listener.localAddress?.port))
        discovery = SSDPDiscoveryService(configuration: ssdp, group: MultiThreadedEventLoopGroup.singleton, logger: quietLogger) { _, _ in }
        try await discovery.start(advertising: stream)
        location = .wifi(await discovery.location())
    }

    /// Withdraws the announcement and closes the port (not the connections it accepted).
    public func stop() async {
        await discovery.stop()
        try? await listener.close()
    }
}
