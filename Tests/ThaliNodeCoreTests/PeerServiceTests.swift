import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import ServiceLifecycle
import Testing
import ThaliBeacons
import ThaliPSKTLS
import ThaliSSDP
@testable import ThaliNodeCore

/// The peer as an app embeds it: a swift-service-lifecycle `Service`, an `AsyncSequence` of events,
/// async methods to queue items and read the inbox. Real peers on loopback, real SQLite stores.
@Suite("ThaliPeer as an embedded service", .serialized, .timeLimit(.minutes(1)))
struct PeerServiceTests {
    private func peer(_ person: TestPeople.Person, ssdpPort: Int, port: Int = 0) throws -> ThaliPeer {
        try loopbackPeer(person, ssdpPort: ssdpPort) { $0.port = port }
    }

    @Test("two peers under a ServiceGroup deliver a queued text; the event stream sees it and ends with stopped")
    func deliveryUnderServiceGroup() async throws {
        let people = try TestPeople(["alice", "bob"], label: "service")
        let ssdpPort = randomSSDPPort()
        let alice = try peer(people["alice"], ssdpPort: ssdpPort)
        let bob = try peer(people["bob"], ssdpPort: ssdpPort)
        let bobsEvents = bob.events()
        let alicesEvents = alice.events()
        let group = ServiceGroup(configuration: ServiceGroupConfiguration(
            services: [.init(service: alice), .init(service: bob)], logger: quietLogger))
        let running = Task { try await group.run() }

        let item = try await alice.send(text: "through the service", to: "bob")
        #expect(try await alice.outbox().map(\.id) == [item.id])
        var receivedID: UUID?
        var sawStarted = false
        for await event in bobsEvents {
            if case .started = event { sawStarted = true }
            if case .delivery(let contact, .received(let received)) = event {
                #expect(contact.name == "alice")
                receivedID = received.itemID
                break
            }
        }
        #expect(sawStarted, "a subscription made before start sees started")
        #expect(receivedID == item.id)
        #expect(try await bob.inbox().map(\.text) == ["through the service"])

        await group.triggerGracefulShutdown()
        try await running.value
        // Alice's stream ends after stopped (it is finite), and stopped is its last element.
        var aliceLog: [PeerEvent] = []
        for await event in alicesEvents { aliceLog.append(event) }
        #expect(aliceLog.last == .stopped)
        #expect(aliceLog.contains { if case .delivery(_, .delivered(item.id, _)) = $0 { true } else { false } })
        // A subscription after the stop ends at once.
        var late = alice.events().makeAsyncIterator()
        #expect(await late.next() == nil)
    }

    @Test("run() stops the peer and rethrows when it cannot start (port in use)")
    func runRethrowsStartFailures() async throws {
        let people = try TestPeople(["alice"], label: "service-port")
        let taken = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .bind(host: "127.0.0.1", port: 0).get()
        defer { taken.close(promise: nil) }
        let port = try #require(taken.localAddress?.port)
        let alice = try peer(people["alice"], ssdpPort: randomSSDPPort(), port: port)
        let events = alice.events()
        await #expect(throws: NodeError.portInUse(host: "127.0.0.1", port: port)) { try await alice.run() }
        var log: [PeerEvent] = []
        for await event in events { log.append(event) }
        #expect(log == [.stopped], "a failed start ends with stopped and nothing else")
    }

    @Test("a subscriber that never reads keeps only its newest events and never slows the peer")
    func slowSubscriberLosesOldestEvents() async throws {
        let people = try TestPeople(["alice", "bob"], label: "service-slow")
        let alice = try peer(people["alice"], ssdpPort: randomSSDPPort())
        let unread = alice.events(bufferingNewest: 2)
        let complete = alice.events()
        try await alice.start()
        _ = try await alice.send(text: "one", to: "bob")
        _ = try await alice.addContact(name: "carol", publicKey: PrivateKey().publicKey.hexString(compressed: true))
        _ = try await alice.send(text: "two", to: "carol")
        await alice.stop()
        var everything: [PeerEvent] = []
        for await event in complete { everything.append(event) }
        var newest: [PeerEvent] = []
        for await event in unread { newest.append(event) }
        #expect(everything.count > 2, "started, advertising twice, stopped: \(everything)")
        #expect(newest == Array(everything.suffix(2)))
    }

    @Test("send and addContact through the peer validate as the store does")
    func appMethodsValidate() async throws {
        let people = try TestPeople(["alice"], label: "service-validate")
        let alice = try peer(people["alice"], ssdpPort: randomSSDPPort())
        await #expect(throws: NodeError.unknownContact("nobody")) { try await alice.send(text: "x", to: "nobody") }
        await #expect(throws: NodeError.self) { try await alice.addContact(name: "self", publicKey: alice.publicKey) }
        #expect(try await alice.outbox().isEmpty)
    }

    @Test("a peer starts once: a second start, or one after stop, throws and changes nothing")
    func startsOnce() async throws {
        let people = try TestPeople(["alice", "bob"], label: "service-restart")
        let alice = try peer(people["alice"], ssdpPort: randomSSDPPort())
        let events = alice.events()
        try await alice.start()
        await #expect(throws: ThaliPeer.StartError.alreadyStarted) { try await alice.start() }
        await #expect(throws: ThaliPeer.StartError.alreadyStarted) { try await alice.run() }
        _ = try await alice.send(text: "before the stop", to: "bob")
        await alice.stop()
        await #expect(throws: ThaliPeer.StartError.stopped) { try await alice.start() }
        var log: [PeerEvent] = []
        for await event in events { log.append(event) }
        #expect(log.filter { if case .started = $0 { true } else { false } }.count == 1)
        #expect(log.last == .stopped)
        #expect(log.filter { $0 == .stopped }.count == 1)
    }

    /// Before, a stop during the start closed what was up so far and the start went on to start the
    /// bindings after it (announcing a stopped peer), and two stops both ran every step.
    @Test("stops meeting a start or each other: the start ends first, every step runs once, one stopped event")
    func stopsMeetingAStart() async throws {
        let people = try TestPeople(["alice", "bob"], label: "service-stop-race")
        let alice = try people["alice"]
        for round in 0..<5 {
            let peer = try peer(alice, ssdpPort: randomSSDPPort())
            let events = peer.events()
            let starting = Task { try await peer.start() }
            if round % 2 == 1 { await Task.yield() }
            await withTaskGroup(of: Void.self) { group in
                for _ in 0..<3 { group.addTask { await peer.stop() } }
            }
            // Started, then stopped; or stopped before it could start. Never half-started.
            let started = await starting.result
            if case .failure(let error) = started { #expect(error as? ThaliPeer.StartError == .stopped) }
            var log: [PeerEvent] = []
            for await event in events { log.append(event) }
            #expect(log.filter { $0 == .stopped }.count == 1, "round \(round): \(log)")
            #expect(peer.state.withLockedValue { $0.listener } == nil)
            #expect(peer.bindings.isEmpty || peer.isStopped)
            #expect(RunLock.holder(of: alice.store.home) == nil, "round \(round): the directory is free")
        }
    }

    /// Before, a second peer on the same data directory started silently beside the first (only the
    /// CLI took the directory's lock), and both advertised and delivered the same items.
    @Test("one peer at a time on a data directory: a second start is refused, naming the holder; after stop another starts")
    func oneRunningPeerPerDataDirectory() async throws {
        let people = try TestPeople(["alice", "bob"], label: "service-lock")
        let ssdpPort = randomSSDPPort()
        let alice = try people["alice"]
        let first = try peer(alice, ssdpPort: ssdpPort)
        let second = try peer(alice, ssdpPort: ssdpPort)
        try await first.start()
        await #expect(throws: NodeError.homeInUse(path: alice.store.home.path, pid: getpid())) { try await second.start() }
        #expect(RunLock.holder(of: alice.store.home) == getpid())
        await first.stop()
        #expect(RunLock.holder(of: alice.store.home) == nil, "stop lets the directory go")
        let third = try peer(alice, ssdpPort: ssdpPort)
        try await third.start()
        await third.stop()
        await second.stop()
    }

    @Test("stopping while connecting reports no failed connection and no retry it will not make")
    func stopWhileConnectingReportsNoFailure() async throws {
        let people = try TestPeople(["alice", "bob"], label: "service-stop-connecting")
        let ssdpPort = randomSSDPPort()
        // A host re-serving Alice's announcement for Bob whose TLS never answers: Bob's attempt hangs in
        // the handshake until he stops.
        let held = NIOLockedValueBox<[Channel]>([])
        let (helloArrived, hello) = AsyncStream<Void>.makeStream()
        let host = try await AnnouncementCopyHost(copying: people["alice"], for: people["bob"], ssdpPort: ssdpPort) { channel in
            held.withLockedValue { $0.append(channel) }
            hello.yield()
            return channel.eventLoop.makeSucceededVoidFuture()
        }
        defer { for channel in held.withLockedValue({ $0 }) { channel.close(promise: nil) } }

        let bob = try peer(people["bob"], ssdpPort: ssdpPort)
        let events = bob.events()
        try await bob.start()
        var log: [PeerEvent] = []
        for await event in events {
            log.append(event)
            if case .connecting("alice", _, 1) = event { break }
        }
        // Bob's ClientHello reached the stalling host: his attempt is in the handshake.
        for await _ in helloArrived { break }
        await bob.stop()
        await host.stop()
        for await event in events { log.append(event) }
        #expect(!log.contains { if case .connectionFailed = $0 { true } else { false } }, "\(log)")
        #expect(log.last == .stopped)
    }
}
