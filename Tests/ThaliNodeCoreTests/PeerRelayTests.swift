import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing
@testable import ThaliNodeCore

/// Echoes every byte back (the "app" behind a relaying peer).
private final class EchoHandler: ChannelInboundHandler, Sendable {
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
        let clock = ContinuousClock()
        let end = clock.now + .seconds(15)
        var relayPort: Int?
        while clock.now < end, relayPort == nil {
            relayPort = events.withLockedValue { list in
                list.lazy.compactMap { who, event -> Int? in
                    if who == "bob", case .relayListening("alice", let port) = event { return port }
                    return nil
                }.first
            }
            if relayPort == nil { try await Task.sleep(for: .milliseconds(50)) }
        }
        let port = try #require(relayPort)
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
        #expect(events.withLockedValue { list in
            list.contains { who, event in
                if who == "alice", case .connected("bob", .accepting, .wifi) = event { return true } else { return false }
            }
        })
        for peer in peers { await peer.stop() }
        try await echo.close()
    }
}
