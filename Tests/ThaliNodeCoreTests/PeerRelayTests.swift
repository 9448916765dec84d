import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing
@testable import ThaliNodeCore

/// Echoes every byte back (the "app" behind a relaying peer).
final class EchoHandler: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        context.writeAndFlush(data, promise: nil)
    }
}

/// Relay mode (`run --app-port`), in process: two peers on loopback, each relaying to a real TCP echo
/// server; the connecting side's local listener carries the app's connections over PSK-TLS and yamux.
@Suite("Peer relay mode", .serialized)
struct PeerRelayTests {
    @Test("connections to the relay port reach the contact's app over the authenticated session, and back")
    func relayReachesTheContactsApp() async throws {
        let group = MultiThreadedEventLoopGroup.singleton
        let echo = try await ServerBootstrap(group: group)
            .childChannelInitializer { $0.pipeline.addHandler(EchoHandler()) }
            .bind(host: "127.0.0.1", port: 0).get()
        let appPort = try #require(echo.localAddress?.port)
        let people = try TestPeople(["alice", "bob"], label: "relay")
        let ssdpPort = randomSSDPPort()
        let events = NIOLockedValueBox<[(String, PeerEvent)]>([])
        var peers: [ThaliPeer] = []
        for name in ["alice", "bob"] {
            var configuration = PeerConfiguration(interfaceAddress: "127.0.0.1")
            configuration.ssdpPort = ssdpPort
            configuration.appPort = appPort
            let person = try people[name]
            peers.append(try ThaliPeer(store: person.store, identity: person.key, configuration: configuration,
                                       logger: quietLogger, events: { event in events.withLockedValue { $0.append((name, event)) } }))
        }
        for peer in peers { try await peer.start() }

        // Bob finds Alice's beacon, connects, and offers a local port for Alice's app.
        let port = try await Self.waitUntil(seconds: 15) {
            events.withLockedValue { list in
                list.lazy.compactMap { who, event -> Int? in
                    if who == "bob", case .relayListening("alice", let port) = event { return port }
                    return nil
                }.first
            }
        }
        let status = await peers[1].status()
        #expect(status.matchedContacts.contains { $0.name == "alice" && $0.relayPort == port && $0.state == .connected })

        // Two app connections at once, each echoed through its own stream.
        for message in ["first connection", "second connection"] {
            let client = try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: port) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
                }
            }
            let echoed = try await client.executeThenClose { inbound, outbound in
                try await outbound.write(ByteBuffer(string: message))
                var received = ""
                for try await buffer in inbound {
                    received += String(buffer: buffer)
                    if received.utf8.count >= message.utf8.count { break }
                }
                return received
            }
            #expect(echoed == message)
        }
        // The app's connections went over the session: the contact was reached and used, so the session's end
        // starts a new run of failures rather than adding to one (a relay session never completes).
        #expect(peers[1].state.withLockedValue { $0.links.values.first { $0.contact.name == "alice" }?.machine.progressedThisSession } == true)
        #expect(events.withLockedValue { list in
            list.contains { who, event in
                if who == "alice", case .connected("bob", .accepting, .wifi, _) = event { return true } else { return false }
            }
        })
        for peer in peers { await peer.stop() }
        try await echo.close()
    }

    /// Alice and Bob in relay mode on loopback, Bob's (connecting side's) events recorded; `appPort` is
    /// what each relays to.
    private struct RelayPair {
        let people: TestPeople
        let ssdpPort = randomSSDPPort()
        let events = NIOLockedValueBox<[(String, PeerEvent)]>([])
        var peers: [String: ThaliPeer] = [:]
        let appPort: [String: Int]

        init(label: String, appPort: [String: Int]) throws {
            people = try TestPeople(["alice", "bob"], label: label)
            self.appPort = appPort
        }

        mutating func start(_ name: String) async throws {
            var configuration = PeerConfiguration(interfaceAddress: "127.0.0.1")
            configuration.ssdpPort = ssdpPort
            configuration.appPort = appPort[name]
            let events = self.events
            let peer = try ThaliPeer(store: try people[name].store, identity: try people[name].key, configuration: configuration,
                                     logger: quietLogger, events: { event in events.withLockedValue { $0.append((name, event)) } })
            try await peer.start()
            peers[name] = peer
        }

        /// Waits (up to `seconds`) for an event of `who` that `match` picks, and returns what it picks.
        func wait<Value>(for who: String, seconds: Int = 30, sourceLocation: SourceLocation = #_sourceLocation,
                         _ match: @escaping (PeerEvent) -> Value?) async throws -> Value {
            try await PeerRelayTests.waitUntil(seconds: seconds, sourceLocation: sourceLocation) {
                events.withLockedValue { list in list.lazy.compactMap { $0.0 == who ? match($0.1) : nil }.first }
            }
        }

        func stopAll() async {
            for peer in peers.values { await peer.stop() }
        }
    }

    /// Polls `check` every 20 ms until it returns a value, for up to `seconds`; the test fails if none comes.
    fileprivate static func waitUntil<Value>(seconds: Int, sourceLocation: SourceLocation = #_sourceLocation,
                                         _ check: () async -> Value?) async throws -> Value {
        try #require(try await waitForValue(timeout: .seconds(seconds), check), "nothing came within \(seconds) s",
                     sourceLocation: sourceLocation)
    }

    /// An async channel to 127.0.0.1:`port`.
    private static func connect(to port: Int) async throws -> NIOAsyncChannel<ByteBuffer, ByteBuffer> {
        try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton).connect(host: "127.0.0.1", port: port) { channel in
            channel.eventLoop.makeCompletedFuture { try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel) }
        }
    }

    /// A port nothing listens on (bound once, then closed).
    /// A loopback port nothing listens on, below the kernel's ephemeral range (32768 and up here): a
    /// port bound to 0 and closed is ephemeral, and the peers' own outgoing connections in the same
    /// test may take it as their source port, so a test that expects it free then finds it used.
    private static func deadPort() async throws -> Int {
        for _ in 0..<100 {
            let port = Int.random(in: 20_000..<32_768)
            guard let channel = try? await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .bind(host: "127.0.0.1", port: port).get() else { continue }
            try await channel.close()
            return port
        }
        throw ChannelError.unknownLocalAddress
    }

    static func echoServer() async throws -> Channel {
        try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelInitializer { $0.pipeline.addHandler(EchoHandler()) }
            .bind(host: "127.0.0.1", port: 0).get()
    }

    @Test("the relay port stays the same when the contact's node restarts; closed and reopened are reported; status counts the relay")
    func relayPortSurvivesReconnect() async throws {
        let echo = try await Self.echoServer()
        let appPort = try #require(echo.localAddress?.port)
        var pair = try RelayPair(label: "relay-stable", appPort: ["alice": appPort, "bob": appPort])
        try await pair.start("alice")
        try await pair.start("bob")
        let port = try await pair.wait(for: "bob") { event -> Int? in
            if case .relayListening("alice", let port) = event { return port } else { return nil }
        }

        // While an app connection is open, both sides count the session and the relayed connection.
        let running = pair.peers
        let client = try await Self.connect(to: port)
        try await client.executeThenClose { inbound, outbound in
            try await outbound.write(ByteBuffer(string: "ping"))
            var iterator = inbound.makeAsyncIterator()
            let echoed = try await iterator.next()
            #expect(echoed.map { String(buffer: $0) } == "ping")
            for name in ["alice", "bob"] {
                let peer = try #require(running[name])
                let status = try await Self.waitUntil(seconds: 10) { () -> PeerStatus? in
                    let status = await peer.status()
                    return status.relayConnections >= 1 ? status : nil
                }
                #expect(status.sessionsInFlight >= 1, "\(name): \(status)")
                // The status line, read back.
                guard case .status(let line) = try NodeEvent(jsonLine: PeerEventRecord(status).jsonLine()) else {
                    Issue.record("\(name): the status line is no status")
                    continue
                }
                #expect(line.relayConnections >= 1 && line.sessionsInFlight >= 1)
                #expect(line.port.admission["admitted"] != nil && line.port.admission["refused"] != nil, "\(line)")
                // Over Wi-Fi the status carries the SSDP service's own counters; this peer read its contact's beacons.
                #expect(line.discovery.beaconFetches >= 1, "\(line)")
                #expect(line.discovery.ssdp?["worst_loop_lag_ms"] != nil, "\(line)")
            }
        }

        // Alice's node restarts: Bob's listener closes, then reopens on the same port.
        await pair.peers["alice"]?.stop()
        _ = try await pair.wait(for: "bob") { event -> Bool? in
            if case .relayClosed("alice", port) = event { return true } else { return nil }
        }
        try await pair.start("alice")
        _ = try await pair.wait(for: "bob") { event -> Bool? in
            if case .relayReopened("alice", port) = event { return true } else { return nil }
        }
        let again = try await Self.connect(to: port)
        try await again.executeThenClose { inbound, outbound in
            try await outbound.write(ByteBuffer(string: "again"))
            var iterator = inbound.makeAsyncIterator()
            #expect(try await iterator.next().map { String(buffer: $0) } == "again")
        }
        let bob = try #require(pair.peers["bob"])
        #expect(await bob.status().matchedContacts.contains { $0.name == "alice" && $0.relayPort == port })
        #expect(PeerEventRecord(.relayClosed(contact: .sample("alice"), port: port))?.summary
                == "relay: the session with alice ended; 127.0.0.1:\(port) is closed until alice is reached again, then it reopens on the same port")
        await pair.stopAll()
        try await echo.close()
    }

    @Test("an item queued while the relay's session is up is delivered over that session, not after it ends")
    func itemQueuedMidSessionIsDeliveredOverTheOpenSession() async throws {
        let echo = try await Self.echoServer()
        let appPort = try #require(echo.localAddress?.port)
        var pair = try RelayPair(label: "relay-midsession", appPort: ["alice": appPort, "bob": appPort])
        try await pair.start("alice")
        try await pair.start("bob")
        _ = try await pair.wait(for: "bob") { event -> Int? in
            if case .relayListening("alice", let port) = event { return port } else { return nil }
        }
        // The session's first delivery found nothing to carry; Alice now queues a text for Bob. Her new
        // announcement matches on Bob's side while his session to her stays up for the relay.
        let item = try pair.people["alice"].store.enqueueText("while relaying", to: "bob", expiresAt: Date().addingTimeInterval(600))
        let received = try await pair.wait(for: "bob") { event -> InboxItem? in
            if case .delivery("alice", .received(let inbox)) = event, inbox.itemID == item.id { return inbox } else { return nil }
        }
        #expect(received.text == "while relaying")
        let connects = pair.events.withLockedValue { list in
            list.filter { who, event in
                if who == "bob", case .connected("alice", .connecting, _, _) = event { return true } else { return false }
            }.count
        }
        #expect(connects == 1, "Bob reached Alice again instead of using the session that was up")
        #expect(pair.events.withLockedValue { list in
            !list.contains { who, event in
                if who == "bob", case .relayClosed("alice", _) = event { return true } else { return false }
            }
        })
        await pair.stopAll()
        try await echo.close()
    }

    @Test("a relay port pinned for a contact is the one its listener opens on")
    func pinnedRelayPort() async throws {
        let echo = try await Self.echoServer()
        let appPort = try #require(echo.localAddress?.port)
        let pinned = try await Self.deadPort()
        let people = try TestPeople(["alice", "bob"], label: "relay-pinned")
        let ssdpPort = randomSSDPPort()
        let events = NIOLockedValueBox<[PeerEvent]>([])
        var peers: [ThaliPeer] = []
        for name in ["alice", "bob"] {
            var configuration = PeerConfiguration(interfaceAddress: "127.0.0.1")
            (configuration.ssdpPort, configuration.appPort) = (ssdpPort, appPort)
            if name == "bob" { configuration.relayPorts = ["alice": pinned] }
            let person = try people[name]
            peers.append(try ThaliPeer(store: person.store, identity: person.key, configuration: configuration, logger: quietLogger,
                                       events: { event in if name == "bob" { events.withLockedValue { $0.append(event) } } }))
        }
        for peer in peers { try await peer.start() }
        let port = try await Self.waitUntil(seconds: 30) {
            events.withLockedValue { $0.lazy.compactMap { event -> Int? in
                if case .relayListening("alice", let port) = event { return port } else { return nil }
            }.first }
        }
        #expect(port == pinned)
        for peer in peers { await peer.stop() }
        try await echo.close()
    }

    @Test("an app port nothing listens on: both nodes say so in words, naming the contact and the port")
    func deadAppPortIsReported() async throws {
        let echo = try await Self.echoServer()
        let dead = try await Self.deadPort()
        // Alice accepts Bob's relayed connections toward a port nothing listens on.
        var pair = try RelayPair(label: "relay-dead", appPort: ["alice": dead, "bob": try #require(echo.localAddress?.port)])
        try await pair.start("alice")
        try await pair.start("bob")
        let port = try await pair.wait(for: "bob") { event -> Int? in
            if case .relayListening("alice", let port) = event { return port } else { return nil }
        }
        let client = try await Self.connect(to: port)
        let ended = try await client.executeThenClose { inbound, outbound -> Bool in
            try? await outbound.write(ByteBuffer(string: "hello?"))
            do {
                for try await _ in inbound {}
            } catch {}
            return true
        }
        #expect(ended)
        let accepting = try await pair.wait(for: "alice") { event -> PeerConnectionError? in
            if case .relayAppUnreachable("bob", .accepting, let error?) = event { return error } else { return nil }
        }
        #expect(accepting.reason == .refused && accepting.address == "127.0.0.1:\(dead)")
        let acceptingRecord = try #require(PeerEventRecord(.relayAppUnreachable(contact: .sample("bob"), role: .accepting, error: accepting)))
        #expect(acceptingRecord.summary == "relay: app port 127.0.0.1:\(dead) refused the connection; the relayed connection from bob was closed")
        #expect(acceptingRecord.event == "relay_app_unreachable" && acceptingRecord.reason == "connection refused by 127.0.0.1:\(dead)")
        _ = try await pair.wait(for: "bob") { event -> Bool? in
            if case .relayAppUnreachable("alice", .connecting, .none) = event { return true } else { return nil }
        }
        let connectingRecord = try #require(PeerEventRecord(.relayAppUnreachable(contact: .sample("alice"), role: .connecting, error: nil)))
        #expect(connectingRecord.summary.contains("alice's node closed a relayed connection before any reply"))
        await pair.stopAll()
        try await echo.close()
    }
}
