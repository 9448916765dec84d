import Foundation
import NIOCore
import NIOPosix
import Testing
import ThaliBeacons
import ThaliSSDP
@testable import ThaliNodeCore

/// People for peer tests: each a data directory with an identity, all of them each other's contacts.
final class TestPeople: @unchecked Sendable {
    struct Person {
        let name: String
        let temporary: TemporaryHome
        let key: PrivateKey
        let store: NodeStore
        var home: NodeHome { temporary.home }
        var publicKey: String { key.publicKey.hexString(compressed: true) }
    }

    let people: [Person]

    init(_ names: [String], label: String) throws {
        people = try names.map { name in
            let temporary = TemporaryHome("\(label)-\(name)")
            try temporary.home.create()
            let key = try NodeIdentity.create(in: temporary.home)
            return Person(name: name, temporary: temporary, key: key, store: try NodeStore(home: temporary.home))
        }
        for person in people {
            for other in people where other.name != person.name {
                try person.store.addContact(name: other.name, publicKey: other.publicKey)
            }
        }
    }

    /// The person called `name`; the test fails if there is none.
    subscript(_ name: String) -> Person {
        get throws {
            let person = people.first { $0.name == name }
            return try #require(person, "no test person named \(name)")
        }
    }

    /// What each inbox holds, as (sender name, item id) pairs, in arrival order.
    func inbox(of name: String) throws -> [(from: String, id: UUID)] {
        let byKey = Dictionary(uniqueKeysWithValues: people.map { ($0.publicKey, $0.name) })
        return try self[name].store.inbox().map { (byKey[$0.fromPublicKey] ?? "?", $0.itemID) }
    }
}

/// A random port for SSDP multicast, so concurrent runs do not hear each other.
func randomSSDPPort() -> Int { Int.random(in: 20000...60000) }

/// A quiet `ThaliPeer` for `person`, pinned to 127.0.0.1 with `ssdpPort`; `configure` adjusts the rest.
func loopbackPeer(_ person: TestPeople.Person, ssdpPort: Int,
                  _ configure: (inout PeerConfiguration) -> Void = { _ in }) throws -> ThaliPeer {
    var configuration = PeerConfiguration(interfaceAddress: "127.0.0.1")
    configuration.ssdpPort = ssdpPort
    configure(&configuration)
    return try ThaliPeer(store: person.store, identity: person.key, configuration: configuration, logger: quietLogger)
}

/// The `thali-node` built beside this test bundle.
var thaliNodeExecutable: String { CommandLineTests.executable }

/// A host on 127.0.0.1 that re-serves a copy of `sender`'s announcement for `receiver` over SSDP from
/// its own port: the beacons over HTTP, and each PSK-TLS connection set up by `secure` (an attacker
/// without the PSK, a host that stalls the handshake, ...).
struct AnnouncementCopyHost {
    let listener: Channel
    let discovery: SSDPDiscoveryService
    /// Where the receiver finds the copy.
    let location: PeerLocation

    init(copying sender: TestPeople.Person, for receiver: TestPeople.Person, ssdpPort: Int,
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
    func stop() async {
        await discovery.stop()
        try? await listener.close()
    }
}
