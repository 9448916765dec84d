import Foundation
import NIOCore
import TCPMultiplexer
import ThaliBLEBinding
import ThaliSSDP

/// Where and how the suite reaches the implementation under test over Bluetooth instead of Wi-Fi
/// (spec/conformance.md, "Peer mode over Bluetooth"): its address and RFCOMM channel, and the transport
/// that opens the stream (RFCOMM on a radio, a stand-in in tests).
public struct SuiteBluetoothTarget: Sendable {
    /// The implementation's Bluetooth address.
    public var address: BluetoothAddress
    /// The RFCOMM channel it listens on.
    public var channel: UInt8 = BluetoothConformanceConfiguration.defaultChannel
    /// How the suite opens Bluetooth streams; its local address is the suite's.
    public var transport: any BluetoothTransport
    /// The binding's bounds on the suite's side of the link (handshake timeout, relay accept timeout).
    public var limits = BluetoothBindingLimits()

    /// The implementation at `address`, reached through `transport`.
    public init(address: BluetoothAddress, transport: any BluetoothTransport) {
        self.address = address
        self.transport = transport
    }
}

/// Errors of the suite's Bluetooth link.
public enum SuiteBluetoothLinkError: Error, CustomStringConvertible, Sendable {
    /// The machine cannot open Bluetooth streams at all (the transport's reason).
    case unavailable(String)
    /// The stream, its handshake or the multiplexer over it could not be set up (the reason).
    case notOpened(String)

    /// What went wrong, in words.
    public var description: String {
        switch self {
        case .unavailable(let reason): "no Bluetooth here: \(reason)"
        case .notOpened(let reason): "no Bluetooth link: \(reason)"
        }
    }
}

/// One multiplexed Bluetooth link from the suite to the implementation (spec/ble-binding.md §4, "Both
/// ways over one link"): the suite is the central and says `00` (it has beacons), so the implementation
/// must treat it as discovered (BLE-3.4) and fetch its beacons over the same link. Each connection to
/// ``location`` becomes a stream to the implementation's port, so every case that connects to a peer's
/// location runs over the link unchanged; each stream the implementation opens toward the suite is
/// joined to a local port of the suite's (its beacon and PSK-TLS server).
public struct SuiteBluetoothLink: Sendable {
    private let connection: MultiplexedBluetoothConnection

    private init(connection: MultiplexedBluetoothConnection) {
        self.connection = connection
    }

    /// The implementation's port as a location: `http://127.0.0.1:PORT`, a local port of the suite's
    /// whose every connection is a stream over the link.
    public var location: BeaconLocation { BeaconLocation(host: "127.0.0.1", port: connection.localPort) }

    /// Completes when the Bluetooth stream has closed.
    public var closeFuture: EventLoopFuture<Void> { connection.closeFuture }

    /// Opens the link to `target`, joining every stream the implementation opens to `host:localPort`.
    /// Bounded by the transport's connect and the handshake timeout (`target.limits`).
    /// - Throws: ``SuiteBluetoothLinkError``.
    public static func open(_ target: SuiteBluetoothTarget, joiningInboundTo localPort: Int, on host: String = "127.0.0.1",
                            group: any EventLoopGroup) async throws -> SuiteBluetoothLink {
        do {
            try target.transport.checkAvailable()
        } catch {
            throw SuiteBluetoothLinkError.unavailable("\(error)")
        }
        let client = MultiplexedBluetoothClient(transport: target.transport, group: group, limits: target.limits)
        let connection: MultiplexedBluetoothConnection
        do {
            connection = try await client.connect(
                to: target.address, channel: target.channel, hasNotifications: true,
                inboundStreamInitializer: MultiplexerBridge.connectingInitializer(host: host, port: localPort))
        } catch {
            throw SuiteBluetoothLinkError.notOpened("\(target.address) channel \(target.channel): \(error)")
        }
        // Bytes from us at once: a relay that waits for its client's first bytes keeps the link.
        _ = connection.session.ping()
        return SuiteBluetoothLink(connection: connection)
    }

    /// Ends the link: its streams, the session and the Bluetooth stream.
    public func close() async {
        await connection.close()
    }
}

extension PeerConformance {
    /// Peer mode over one Bluetooth link to `target` (spec/conformance.md, "Peer mode over Bluetooth"):
    /// the link's local port is the implementation's location for every case, and the streams the
    /// implementation opens over it reach `server`, so it finds the suite by the `00` hello (BLE-3.4)
    /// and delivers to it over the same link. No SSDP: its cases are N/A. No link at all fails the
    /// beacon fetch (silence is not conformance) and leaves the rest INCONCLUSIVE.
    func runOverBluetooth(_ run: ConformanceRun, _ target: SuiteBluetoothTarget, server: PeerSuiteServer, queuedIDs: [UUID],
                          events: AdapterEventFollower?) async {
        let started = NIODeadline.now()
        let link: SuiteBluetoothLink
        do {
            link = try await SuiteBluetoothLink.open(target, joiningInboundTo: server.port, on: configuration.address, group: group)
        } catch {
            await server.close()
            run.note("\(error)")
            run.record(Cases.discovered, .notApplicable, expected: Cases.discovered.title, actual: Self.overBluetooth)
            if case SuiteBluetoothLinkError.notOpened = error {
                run.record(Cases.beaconFetch, .fail, expected: "\(Cases.beaconFetch.title), over a Bluetooth link",
                           actual: "\(error)", started: started)
            }
            run.recordRemaining(Cases.all, .inconclusive, because: "\(error)")
            return
        }
        var linked = configuration
        linked.location = link.location
        run.note("over Bluetooth: one link to \(target.address) channel \(target.channel), its port at \(link.location)")
        let (fetched, sink) = AsyncStream.makeStream(of: (SSDPPeer, [UInt8]).self)
        sink.finish()
        await PeerConformance(configuration: linked, group: group).roles(run, server: server, discovery: nil, fetched: fetched,
                                                                         queuedIDs: queuedIDs, events: events)
        await link.close()
    }
}
