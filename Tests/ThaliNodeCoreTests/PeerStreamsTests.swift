import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import TCPMultiplexer
import Testing
@testable import ThaliNodeCore

/// Stream marking between two real peers on loopback (spec/node.md, "Stream marking"): delivery and a
/// relay on one session, a relay asked of a node that has no app port, a peer from before marking, and
/// an app's own streams in process.
@Suite("Peer streams", .serialized)
struct PeerStreamsTests {
    /// Alice and Bob on loopback with their events recorded.
    final class Pair: @unchecked Sendable {
        let people: TestPeople
        let ssdpPort = randomSSDPPort()
        let events = NIOLockedValueBox<[(String, PeerEvent)]>([])
        var peers: [String: ThaliPeer] = [:]

        init(label: String) throws {
            people = try TestPeople(["alice", "bob"], label: label)
        }

        @discardableResult
        func make(_ name: String, _ configure: (inout PeerConfiguration) -> Void = { _ in }) throws -> ThaliPeer {
            var configuration = PeerConfiguration(interfaceAddress: "127.0.0.1")
            configuration.ssdpPort = ssdpPort
            configure(&configuration)
            let events = self.events
            let peer = try ThaliPeer(store: try people[name].store, identity: try people[name].key, configuration: configuration,
                                     logger: quietLogger, events: { event in events.withLockedValue { $0.append((name, event)) } })
            peers[name] = peer
            return peer
        }

        func queue(_ text: String, from sender: String, to receiver: String) throws {
            try people[sender].store.enqueueText(text, to: receiver, expiresAt: Date().addingTimeInterval(600))
        }

        func startAll() async throws {
            for name in peers.keys.sorted() { try await peers[name]?.start() }
        }

        func stopAll() async {
            for peer in peers.values { await peer.stop() }
        }

        /// The events of `who` that `match` picks.
        func picked<Value>(_ who: String, _ match: (PeerEvent) -> Value?) -> [Value] {
            events.withLockedValue { list in list.compactMap { $0.0 == who ? match($0.1) : nil } }
        }

        /// Waits (up to `seconds`) for an event of `who` that `match` picks, and returns what it picks.
        func wait<Value>(for who: String, seconds: Int = 30, sourceLocation: SourceLocation = #_sourceLocation,
                         _ match: @escaping (PeerEvent) -> Value?) async throws -> Value {
            try await PeerStreamsTests.waitUntil(seconds: seconds, sourceLocation: sourceLocation) { self.picked(who, match).first }
        }

        /// Waits until `receiver`'s inbox holds a text from `sender`.
        func waitForDelivery(from sender: String, to receiver: String, seconds: Int = 30,
                             sourceLocation: SourceLocation = #_sourceLocation) async throws {
            _ = try await PeerStreamsTests.waitUntil(seconds: seconds, sourceLocation: sourceLocation) { () -> Bool? in
                (try? self.people.inbox(of: receiver))?.contains { $0.from == sender } == true ? true : nil
            }
        }
    }

    /// Polls `check` every 20 ms until it returns a value, for up to `seconds`; the test fails if none comes.
    static func waitUntil<Value>(seconds: Int, sourceLocation: SourceLocation = #_sourceLocation,
                                 _ check: () async -> Value?) async throws -> Value {
        try #require(try await waitForValue(timeout: .seconds(seconds), check), "nothing came within \(seconds) s",
                     sourceLocation: sourceLocation)
    }

    /// `body`'s result, or a failure after `seconds`: a stream that never answers fails the test, not hangs it.
    static func within<Value: Sendable>(seconds: Int = 20, _ body: @escaping @Sendable () async throws -> Value) async throws -> Value {
        try #require(try await withTimeout(.seconds(seconds), body), "no answer within \(seconds) s")
    }

    /// Sends `message` to 127.0.0.1:`port` and reads until as many bytes came back (or the end).
    static func echo(_ message: String, at port: Int) async throws -> String {
        try await within { try await echoUnbounded(message, at: port) }
    }

    private static func echoUnbounded(_ message: String, at port: Int) async throws -> String {
        let client = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton).connect(host: "127.0.0.1", port: port) { channel in
            channel.eventLoop.makeCompletedFuture { try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel) }
        }
        return try await client.executeThenClose { inbound, outbound in
            try await outbound.write(ByteBuffer(string: message))
            var received = ""
            do {
                for try await buffer in inbound {
                    received += String(buffer: buffer)
                    if received.utf8.count >= message.utf8.count { break }
                }
            } catch {}
            return received
        }
    }

    /// Writes `message` on an app stream and reads as many bytes back.
    static func echo(_ message: String, over stream: PeerStream) async throws -> String {
        try await within { try await echoUnbounded(message, over: stream) }
    }

    private static func echoUnbounded(_ message: String, over stream: PeerStream) async throws -> String {
        try await stream.withStream { inbound, outbound in
            try await outbound.write(message)
            var received = ""
            for try await bytes in inbound {
                received += String(decoding: bytes, as: UTF8.self)
                if received.utf8.count >= message.utf8.count { break }
            }
            return received
        }
    }

    @Test("a relay node and a delivery node deliver to each other; a relay asked of the one without an app port is one refusal on each side")
    func relayNodeAndDeliveryNode() async throws {
        let echo = try await PeerRelayTests.echoServer()
        let pair = try Pair(label: "streams-mixed")
        try pair.make("alice") { $0.appPort = echo.localAddress?.port }
        try pair.make("bob")
        try pair.queue("from alice, relaying", from: "alice", to: "bob")
        try pair.queue("from bob, delivering", from: "bob", to: "alice")
        try await pair.startAll()
        // Before marking, Bob's delivery stream reached Alice's app and Alice's relay listener was all she
        // opened toward Bob: neither text arrived.
        try await pair.waitForDelivery(from: "alice", to: "bob")
        try await pair.waitForDelivery(from: "bob", to: "alice")

        let port = try await pair.wait(for: "alice") { event -> Int? in
            if case .relayListening("bob", let port) = event { return port } else { return nil }
        }
        // Bob has no app: nothing comes back (the connection may even be reset before it is up).
        let echoed = try? await Self.echo("hello?", at: port)
        #expect(echoed ?? "" == "")
        let connecting = try await pair.wait(for: "alice") { event -> StreamRefusal? in
            if case .streamRefused("bob", .connecting, "relay", let refusal, false) = event { return refusal } else { return nil }
        }
        let accepting = try await pair.wait(for: "bob") { event -> StreamRefusal? in
            if case .streamRefused("alice", .accepting, "relay", let refusal, true) = event { return refusal } else { return nil }
        }
        #expect(connecting == accepting)
        #expect(connecting.code == .notServed && connecting.reason == "relay is not served: this node has no app port")
        let record = try #require(PeerEventRecord(.streamRefused(contact: .sample("bob"), role: .connecting, kind: "relay", refusal: connecting, byThisNode: false)))
        #expect(record.summary == "stream: bob's node refused a relay stream: relay is not served: this node has no app port (not-served)")
        // One event each: no retry storm.
        let refusals = { (who: String) in pair.picked(who) { event -> Bool? in if case .streamRefused = event { true } else { nil } }.count }
        #expect(refusals("alice") == 1 && refusals("bob") == 1)
        await pair.stopAll()
        try await echo.close()
    }

    @Test("two relay nodes deliver to each other and relay both ways on the same sessions")
    func relayAndDeliveryAtOnce() async throws {
        let echo = try await PeerRelayTests.echoServer()
        let pair = try Pair(label: "streams-both")
        for name in ["alice", "bob"] { try pair.make(name) { $0.appPort = echo.localAddress?.port } }
        try pair.queue("from alice", from: "alice", to: "bob")
        try pair.queue("from bob", from: "bob", to: "alice")
        try await pair.startAll()
        try await pair.waitForDelivery(from: "alice", to: "bob")
        try await pair.waitForDelivery(from: "bob", to: "alice")
        for (who, contact) in [("alice", "bob"), ("bob", "alice")] {
            let port = try await pair.wait(for: who) { event -> Int? in
                if case .relayListening(contact, let port) = event { return port } else { return nil }
            }
            let echoed = try await Self.echo("through \(contact)'s node", at: port)
            #expect(echoed == "through \(contact)'s node")
        }
        #expect(pair.picked("alice") { event -> Bool? in if case .streamRefused = event { true } else { nil } }.isEmpty)
        await pair.stopAll()
        try await echo.close()
    }

    @Test("a peer from before marking (no ALPN offered or accepted) and a marking peer deliver both ways")
    func legacyPeerStillDelivers() async throws {
        let pair = try Pair(label: "streams-legacy")
        try pair.make("alice") { $0.streams.marking = false }
        try pair.make("bob")
        try pair.queue("from the old alice", from: "alice", to: "bob")
        try pair.queue("from the new bob", from: "bob", to: "alice")
        try await pair.startAll()
        try await pair.waitForDelivery(from: "alice", to: "bob")
        try await pair.waitForDelivery(from: "bob", to: "alice")
        await pair.stopAll()
    }

    /// Makes Alice and Bob in `pair`, each echoing every stream of app protocol `echo`; the tasks end
    /// when the peers stop.
    static func echoServers(for pair: Pair) throws -> [Task<Void, Never>] {
        try ["alice", "bob"].map { name in
            let streams = try pair.make(name).handleStreams(protocol: "echo")
            return Task {
                await withDiscardingTaskGroup { group in
                    for await stream in streams {
                        group.addTask {
                            try? await stream.withStream { inbound, outbound in
                                for try await bytes in inbound { try await outbound.write(bytes) }
                            }
                        }
                    }
                }
            }
        }
    }

    @Test("apps open streams to contacts in process and echo both ways; a protocol nobody handles is refused on both sides")
    func appStreamsEchoBothWays() async throws {
        let pair = try Pair(label: "streams-app")
        let servers = try Self.echoServers(for: pair)
        #expect(throws: PeerStreamError.alreadyHandled(protocol: "echo")) { try pair.peers["bob"]?.handleStreams(protocol: "echo") }
        try await pair.startAll()
        let alice = try #require(pair.peers["alice"]), bob = try #require(pair.peers["bob"])

        let toBob = try await alice.openStream(to: "bob", protocol: "echo")
        #expect(toBob.contact == "bob" && toBob.protocolName == "echo")
        #expect(try await Self.echo("hello bob", over: toBob) == "hello bob")
        let toAlice = try await bob.openStream(to: "alice", protocol: "echo")
        #expect(try await Self.echo("hello alice", over: toAlice) == "hello alice")

        let unserved = try await alice.openStream(to: "bob", protocol: "nobody")
        let refusal = StreamRefusal(.notServed, reason: "app protocol nobody is not served here")
        // Its first read fails with the refusal (a write after the answer came fails as on any closed channel).
        await #expect(throws: refusal) {
            try await unserved.withStream { inbound, _ in for try await _ in inbound {} }
        }
        _ = try await pair.wait(for: "bob") { event -> Bool? in
            if case .streamRefused("alice", _, "app/nobody", refusal, true) = event { true } else { nil }
        }
        _ = try await pair.wait(for: "alice") { event -> Bool? in
            if case .streamRefused("bob", _, "app/nobody", refusal, false) = event { true } else { nil }
        }
        await pair.stopAll()
        for server in servers { await server.value }
    }

    @Test("an app stream half-closes as TCP does: the accepting app answers after the opener's FIN, and the opener reads the answer")
    func acceptingSideAnswersAfterOpenersFIN() async throws {
        let pair = try Pair(label: "streams-halfclose")
        // Bob's app reads everything the opener sends, to its end, and only then answers.
        let streams = try pair.make("bob").handleStreams(protocol: "count")
        let server = Task {
            for await stream in streams {
                try? await stream.withStream { inbound, outbound in
                    var count = 0
                    for try await bytes in inbound { count += bytes.count }
                    try await outbound.write("got \(count) bytes")
                }
            }
        }
        try pair.make("alice")
        try await pair.startAll()
        let alice = try #require(pair.peers["alice"])
        let stream = try await alice.openStream(to: "bob", protocol: "count")
        let answer = try await Self.within {
            try await stream.withStream { inbound, outbound in
                try await outbound.write("hello")
                outbound.finish()  // half-close: the end of our input to bob, not of the stream
                var answer = ""
                for try await bytes in inbound { answer += String(decoding: bytes, as: UTF8.self) }
                return answer
            }
        }
        #expect(answer == "got 5 bytes")
        await pair.stopAll()
        server.cancel()
        await server.value
    }

    /// Before, the connecting side decided at connect time whether to keep the session after delivery:
    /// an app that opened its first stream during the delivery could get that session, which then closed
    /// when the delivery ended, and the app's next write failed with "session closed".
    @Test("an app stream opened on a session while its delivery runs outlives the delivery")
    func streamOpenedDuringDeliveryOutlivesIt() async throws {
        let pair = try Pair(label: "streams-during-delivery")
        // Bob sends Alice a file slowly (about 2 s), and echoes app streams.
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("streams-during-delivery-\(UUID().uuidString)").path
        try Data(repeating: 7, count: 256 * 1024).write(to: URL(fileURLWithPath: file))
        defer { try? FileManager.default.removeItem(atPath: file) }
        _ = try pair.people["bob"].store.enqueueFile(at: file, to: "alice", expiresAt: Date().addingTimeInterval(600))
        let bob = try pair.make("bob") {
            $0.sendThrottleBytesPerSecond = 128 * 1024
            $0.deliveryLimits.lingerInterval = .zero  // the delivery ends once the file is delivered
        }
        let streams = try bob.handleStreams(protocol: "echo")
        let server = Task {
            await withDiscardingTaskGroup { group in
                for await stream in streams {
                    group.addTask {
                        try? await stream.withStream { inbound, outbound in
                            for try await bytes in inbound { try await outbound.write(bytes) }
                        }
                    }
                }
            }
        }
        let alice = try pair.make("alice")
        try await pair.startAll()
        // Alice connected to receive; her app opens its first stream while the file is on its way.
        _ = try await pair.wait(for: "alice") { event -> Bool? in
            if case .delivery("bob", .progress) = event { true } else { nil }
        }
        let stream = try await alice.openStream(to: "bob", protocol: "echo")
        _ = try await pair.wait(for: "alice") { event -> Bool? in
            if case .sessionEnded("bob", .connecting, nil) = event { true } else { nil }
        }
        #expect(pair.picked("alice") { event -> Bool? in if case .delivery("bob", .received) = event { true } else { nil } }.count == 1)
        #expect(try await Self.echo("still here after the delivery", over: stream) == "still here after the delivery")
        #expect(pair.picked("alice") { event -> Bool? in
            if case .disconnected("bob", .connecting, _, _, _) = event { true } else { nil }
        }.isEmpty, "the session stays up while the app uses streams")
        await pair.stopAll()
        await server.value
    }

    /// Before, returning from `executeThenClose` while the other side still had its output open reset
    /// the stream, and the lines just written were lost: the reader got "stream reset by peer".
    @Test("an app stream's close is orderly: lines written just before a close that does not wait for the other side all arrive, then the end")
    func closeDeliversWhatWasWritten() async throws {
        let pair = try Pair(label: "streams-orderly-close")
        // Bob's app writes its lines and returns at once, without waiting for Alice's end.
        let lines = (1...200).map { "line \($0) of what bob says before he hangs up\n" }
        let streams = try pair.make("bob").handleStreams(protocol: "talk")
        let server = Task {
            for await stream in streams {
                try? await stream.withStream { _, outbound in
                    for line in lines { try await outbound.write(line) }
                }
            }
        }
        try pair.make("alice")
        try await pair.startAll()
        let alice = try #require(pair.peers["alice"])
        let stream = try await alice.openStream(to: "bob", protocol: "talk")
        let heard = try await Self.within {
            try await stream.withStream { inbound, _ in
                // Alice keeps her output open: Bob's close comes while she could still send.
                var heard = ""
                for try await bytes in inbound { heard += String(decoding: bytes, as: UTF8.self) }
                return heard
            }
        }
        #expect(heard == lines.joined())
        await pair.stopAll()
        server.cancel()
        await server.value
    }

    @Test("a session going away is passed over: openStream uses another session with the contact")
    func openStreamPassesOverASessionGoingAway() async throws {
        let pair = try Pair(label: "streams-goaway")
        let servers = try Self.echoServers(for: pair)
        try await pair.startAll()
        let alice = try #require(pair.peers["alice"]), bob = try #require(pair.peers["bob"])
        let (aliceKey, bobKey) = (try pair.people["alice"].publicKey, try pair.people["bob"].publicKey)
        // Both advertise to each other and keep sessions open: each holds two sessions with the other
        // (hers and his). Bob sends GoAway on the one Alice would pick first.
        let first = try await Self.waitUntil(seconds: 30) { () -> MarkedSession? in
            alice.state.withLockedValue { state in
                guard state.appStreams.sessions[bobKey]?.count == 2 else { return nil }
                return state.appStreams.session(for: bobKey)?.session
            }
        }
        // Bob's end of the same connection: its remote address is Alice's local one (a role alone could
        // name a newer session, should one have replaced the other in between).
        let end = first.session.channel.localAddress
        let counterpart = try await Self.waitUntil(seconds: 30) { () -> MultiplexerSession? in
            bob.state.withLockedValue { state in
                state.appStreams.sessions[aliceKey]?.map(\.session).first { $0.role != first.role && $0.session.channel.remoteAddress == end }?.session
            }
        }
        counterpart.goAway()
        // Bob's loop sends the GoAway before it answers a ping that Alice sends after it.
        _ = try await first.session.ping().get()
        await #expect(throws: MultiplexerError.goingAway) { try await first.session.openStream().get() }
        let stream = try await alice.openStream(to: "bob", protocol: "echo", timeout: .seconds(5))
        #expect(try await Self.echo("over the other session", over: stream) == "over the other session")
        await pair.stopAll()
        for server in servers { await server.value }
    }
}
