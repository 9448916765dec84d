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

    @Test("content damaged in transit: the receiver discards it, the sender reports it rejected and keeps the item")
    func damagedContentIsRejectedAndKept() async throws {
        let limits = DeliveryLimits(chunkBytes: 4096)
        let pair = try NodePair(limits: limits)
        _ = try DeliveryTests.queueItems(pair, fileBytes: 50_000)
        let file = try #require(try pair.alice.outbox().first { $0.kind == .file })
        let senderSide = NIOAsyncTestingChannel()
        let receiverSide = NIOAsyncTestingChannel()
        let senderFrames = try await DeliveryChannel.configure(senderSide, limits: limits).get()
        let receiverFrames = try await DeliveryChannel.configure(receiverSide, limits: limits).get()
        try await senderSide.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1))
        try await receiverSide.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 2))
        // The forward path flips the last byte of the first data chunk: a payload byte, not framing.
        let forward = Task {
            var damaged = false
            do {
                while true {
                    var buffer = try await senderSide.waitForOutboundWrite(as: ByteBuffer.self)
                    if !damaged, buffer.readableBytes > 4000 {
                        let index = buffer.writerIndex - 1
                        buffer.setInteger(buffer.getInteger(at: index, as: UInt8.self)! ^ 0xFF, at: index)
                        damaged = true
                    }
                    try await receiverSide.writeInbound(buffer)
                }
            } catch {
                try? await receiverSide.close()
            }
        }
        let backward = Self.pump(receiverSide, into: senderSide)
        let (senderEvents, senderHandler, senderContinuation) = DeliveryEvents.makeStream()
        let (receiverEvents, receiverHandler, receiverContinuation) = DeliveryEvents.makeStream()
        async let received = DeliveryReceiver(store: pair.bob, authenticatedPeer: pair.aliceAtBob, limits: limits,
                                              events: receiverHandler, logger: quietLogger).run(on: receiverFrames)
        let sent = try await DeliverySender(store: pair.alice, authenticatedPeer: pair.bobAtAlice, limits: limits,
                                            events: senderHandler, logger: quietLogger).run(on: senderFrames)
        let receiverSummary = try await received
        await forward.value
        await backward.value
        senderContinuation.finish()
        receiverContinuation.finish()
        var senderLog: [DeliveryEvent] = []
        for await event in senderEvents { senderLog.append(event) }
        var receiverLog: [DeliveryEvent] = []
        for await event in receiverEvents { receiverLog.append(event) }

        #expect(sent.rejected == [file.id])
        #expect(receiverSummary.discarded == [file.id])
        #expect(senderLog.contains(.rejected(id: file.id, .digestMismatch)))
        #expect(!senderLog.contains { if case .discarded = $0 { true } else { false } }, "the sender's word is rejected")
        #expect(receiverLog.contains(.discarded(id: file.id, .digestMismatch)))
        let kept = try #require(try pair.alice.outboxItem(id: file.id))
        #expect(kept.state == .pending)
        #expect(kept.lastError == "rejected by the receiver as damaged (its SHA-256 did not match the offer's); will be sent again")
    }
}
