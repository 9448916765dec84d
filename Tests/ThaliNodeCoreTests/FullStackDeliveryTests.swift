import Foundation
import NIOCore
import NIOPosix
import TCPMultiplexer
import Testing
import ThaliBeacons
import ThaliPSKTLS
@testable import ThaliNodeCore

/// The whole path below the delivery, without discovery: Alice advertises beacons for the contacts she
/// holds items for, Bob matches them, connects with the beacon's PSK over TLS, opens a yamux stream, and
/// the delivery runs on it — each side naming its peer from what the layer below authenticated.
@Suite("Delivery over PSK-TLS and the multiplexer")
struct FullStackDeliveryTests {
    @Test("beacon → PSK-TLS → yamux stream → delivery: the items arrive once, from the authenticated contact")
    func beaconsTLSMultiplexerDelivery() async throws {
        let limits = DeliveryLimits(chunkBytes: 16384, idleTimeout: .seconds(30))
        let aliceKey = PrivateKey(), bobKey = PrivateKey()
        let aliceHome = TemporaryHome("fs-alice"), bobHome = TemporaryHome("fs-bob")
        let alice = try NodeStore(home: aliceHome.home, limits: limits)
        let bob = try NodeStore(home: bobHome.home, limits: limits)
        try alice.addContact(name: "bob", publicKey: bobKey.publicKey.hexString(compressed: true))
        try alice.addContact(name: "carol", publicKey: PrivateKey().publicKey.hexString(compressed: true))
        try bob.addContact(name: "alice", publicKey: aliceKey.publicKey.base64String(compressed: false))
        let expiry = Date().addingTimeInterval(3600)
        try alice.enqueueText("over the whole stack", to: "bob", expiresAt: expiry)
        let file = randomBytes(300_000)
        try Data(file).write(to: URL(fileURLWithPath: aliceHome.home.path + "/photo.jpg"))
        try alice.enqueueFile(at: aliceHome.home.path + "/photo.jpg", to: "bob", expiresAt: expiry)

        // Alice advertises for the contacts she holds items for (only Bob) and remembers the PSKs.
        let pending = try alice.contactsWithPendingItems()
        #expect(pending.map(\.name) == ["bob"])
        let announcement = try BeaconGenerator(identity: aliceKey)
            .makeAnnouncement(for: try pending.map { try $0.identityKey() }, validity: .seconds(60))
        let table = AdvertisedPSKTable()
        table.register(announcement)

        // Alice's TLS server: each stream Bob opens becomes a sender session for the contact the PSK names.
        let group = MultiThreadedEventLoopGroup.singleton
        let serverContext = try PSKTLSContext(role: .server, configuration: PSKTLSConfiguration(dhGroup: .ffdhe2048))
        let (sessions, sessionSink) = AsyncStream.makeStream(of: (DeliveryChannel.AsyncFrames, Contact).self)
        let contacts = Dictionary(uniqueKeysWithValues: try alice.contacts().map { ($0.publicKey, $0) })
        let server = try await ServerBootstrap(group: group).bind(host: "127.0.0.1", port: 0) { child in
            AuthenticatedSession.configureServer(on: child, context: serverContext, lookup: { identity in
                guard let advertised = table.lookup(identity: identity),
                      let contact = contacts[advertised.contact.hexString(compressed: true)] else { return nil }
                return (advertised.psk, contact)
            }, inboundStream: { stream, contact in
                stream.eventLoop.makeCompletedFuture {
                    sessionSink.yield((try DeliveryChannel.configureSynchronously(stream, limits: limits), contact))
                }
            }).map { _ in child }
        }
        let port = try #require(server.channel.localAddress?.port)

        // Bob matches the beacon: it names Alice and gives the PSK identity and secret.
        let receiver = BeaconReceiver(identity: bobKey)
        try receiver.addressBook.add(aliceKey.publicKey)
        let match = try receiver.receive(announcement.stream)
        let aliceAtBob = try #require(try bob.contact(for: match.sender))
        #expect(aliceAtBob.name == "alice")

        let clientContext = try PSKTLSContext(role: .client)
        let client = try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: port) { channel in
            AuthenticatedSession.configureClient(on: channel, context: clientContext, identity: match.pskIdentity, psk: match.psk)
        }
        _ = try await client.handshake.get()
        let session = client.session
        let (opened, openedSink) = AsyncStream.makeStream(of: DeliveryChannel.AsyncFrames.self)
        _ = try await session.openStream { stream in
            stream.eventLoop.makeCompletedFuture {
                openedSink.yield(try DeliveryChannel.configureSynchronously(stream, limits: limits))
            }
        }.get()
        var openedIterator = opened.makeAsyncIterator()
        let bobFrames = try #require(await openedIterator.next())
        var sessionIterator = sessions.makeAsyncIterator()
        let (aliceFrames, bobAtAlice) = try #require(await sessionIterator.next())
        #expect(bobAtAlice.name == "bob")

        let progress = EventLog()
        async let received = DeliveryReceiver(store: bob, authenticatedPeer: aliceAtBob, limits: limits,
                                              events: progress.handler, logger: quietLogger).run(on: bobFrames)
        let sent = try await DeliverySender(store: alice, authenticatedPeer: bobAtAlice, limits: limits,
                                            logger: quietLogger).run(on: aliceFrames)
        let summary = try await received
        #expect(sent.delivered.count == 2)
        #expect(summary.received.count == 2)

        let inbox = try bob.inbox()
        #expect(inbox.compactMap(\.text) == ["over the whole stack"])
        let photo = try #require(inbox.first { $0.kind == .file })
        #expect(try Data(contentsOf: URL(fileURLWithPath: try #require(photo.filePath))) == Data(file))
        #expect(inbox.allSatisfy { $0.fromPublicKey == aliceKey.publicKey.hexString(compressed: true) })
        #expect(try alice.outbox().isEmpty)
        #expect(try alice.contactsWithPendingItems().isEmpty)
        #expect(progress.events.contains(.progress(id: photo.itemID, bytes: 300_000, total: 300_000)))

        sessionSink.finish()
        try? await session.close().get()
        try await server.channel.close()
    }
}
