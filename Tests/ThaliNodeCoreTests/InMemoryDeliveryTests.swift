import Foundation
import NIOCore
import NIOEmbedded
import Testing
@testable import ThaliNodeCore

/// A whole delivery over in-memory channels: the session only needs a NIO `Channel` carrying bytes, as a
/// multiplexer stream inside PSK-TLS will be.
@Suite("Delivery over in-memory channels")
struct InMemoryDeliveryTests {
    /// Moves every outbound buffer of `from` into `to`, and closes `to` when `from` closes (the way a
    /// connection's far end sees the close).
    static func pump(_ from: NIOAsyncTestingChannel, into to: NIOAsyncTestingChannel) -> Task<Void, Never> {
        Task {
            do {
                while true {
                    let buffer = try await from.waitForOutboundWrite(as: ByteBuffer.self)
                    try await to.writeInbound(buffer)
                }
            } catch {
                try? await to.close()
            }
        }
    }

    @Test("texts and a file cross a pair of NIOAsyncTestingChannels and are acknowledged")
    func sessionOverTestingChannels() async throws {
        let limits = DeliveryLimits(chunkBytes: 4096)
        let pair = try NodePair(limits: limits)
        let content = try DeliveryTests.queueItems(pair, fileBytes: 50_000)
        let senderSide = NIOAsyncTestingChannel()
        let receiverSide = NIOAsyncTestingChannel()
        let senderFrames = try await DeliveryChannel.configure(senderSide, limits: limits).get()
        let receiverFrames = try await DeliveryChannel.configure(receiverSide, limits: limits).get()
        try await senderSide.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1))
        try await receiverSide.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 2))
        let forward = Self.pump(senderSide, into: receiverSide)
        let backward = Self.pump(receiverSide, into: senderSide)

        async let received = DeliveryReceiver(store: pair.bob, authenticatedPeer: pair.aliceAtBob, limits: limits,
                                              logger: quietLogger).run(on: receiverFrames)
        let sent = try await DeliverySender(store: pair.alice, authenticatedPeer: pair.bobAtAlice, limits: limits,
                                            logger: quietLogger).run(on: senderFrames)
        #expect(sent.delivered.count == 3)
        #expect(try await received.received.count == 3)
        try DeliveryTests.expectDeliveredExactlyOnce(pair, file: content)
        await forward.value
        await backward.value
    }
}
