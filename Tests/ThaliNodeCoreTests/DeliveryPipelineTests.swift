import Crypto
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing
@testable import ThaliNodeCore

/// Delivery protocol version 3 (issue 25): texts committed as a group, progress that the receiver
/// reports, content moved in blocks; and version 2 peers on either side still served. Real stores, real
/// TCP on 127.0.0.1.
@Suite("Delivery pipelining and acknowledged progress")
struct DeliveryPipelineTests {
    static let limits = DeliveryLimits(chunkBytes: 4096, blockBytes: 64 * 1024, idleTimeout: .seconds(30))

    @Test("20 texts arriving together are committed in fewer than 20 durable transactions, and each ack follows its commit")
    func textsAreCommittedAsAGroup() async throws {
        let pair = try NodePair(limits: Self.limits)
        let expiry = Date().addingTimeInterval(3600)
        for index in 0..<20 { try pair.alice.enqueueText("message \(index)", to: "bob", expiresAt: expiry) }
        let (bob, alice) = (pair.bob, pair.aliceAtBob)
        let before = bob.durableCommits.withLockedValue { $0 }
        // When the sender learns an item is delivered, the receiver's inbox already holds it.
        let deliveredBeforeCommit = NIOLockedValueBox<[UUID]>([])
        let outcome = try await deliverOverTCP(pair, limits: Self.limits, senderEvents: { event in
            guard case .delivered(let id, _) = event else { return }
            if (try? bob.inboxContains(id, from: alice)) != true { deliveredBeforeCommit.withLockedValue { $0.append(id) } }
        })
        #expect(try outcome.sender.get().delivered.count == 20)
        #expect(try outcome.receiver.get().received.count == 20)
        let commits = bob.durableCommits.withLockedValue { $0 } - before
        #expect(commits < 20, "\(commits) durable commits for 20 texts")
        #expect(deliveredBeforeCommit.withLockedValue { $0 }.isEmpty)
        #expect(try bob.inbox().compactMap(\.text).sorted() == (0..<20).map { "message \($0)" }.sorted())
        #expect(try pair.alice.outbox().isEmpty)
    }

    /// On a slow link one batch per round trip caps texts (64 per 120 ms): the sender writes the next
    /// batches while the receiver commits and answers the first. A file between texts waits for every
    /// answer before its offer; nothing is delivered twice or lost.
    @Test("the sender writes further batches before the first is answered; a file waits for their answers; each item arrives once")
    func batchesGoOutBeforeTheirAnswers() async throws {
        var limits = Self.limits
        limits.maxBatchItems = 4
        limits.batchesInFlight = 3
        let pair = try NodePair(limits: limits)
        let expiry = Date().addingTimeInterval(3600)
        for index in 0..<30 { try pair.alice.enqueueText("first \(index)", to: "bob", expiresAt: expiry) }
        let source = pair.aliceHome.home.path + "/between.bin"
        try Data(randomBytes(100_000)).write(to: URL(fileURLWithPath: source))
        let file = try pair.alice.enqueueFile(at: source, to: "bob", expiresAt: expiry)
        for index in 0..<10 { try pair.alice.enqueueText("second \(index)", to: "bob", expiresAt: expiry) }
        let events = NIOLockedValueBox<[DeliveryEvent]>([])
        let outcome = try await deliverOverTCP(pair, limits: limits, senderEvents: { event in
            switch event {
            case .offered, .delivered: events.withLockedValue { $0.append(event) }
            default: break
            }
        })
        let summary = try outcome.sender.get()
        #expect(summary.delivered.count == 41 && Set(summary.delivered).count == 41)
        #expect(try outcome.receiver.get().received.count == 41)
        let seen = events.withLockedValue { $0 }
        // Three batches of four went out before the first answer came back.
        let offeredBeforeFirstAnswer = seen.prefix { if case .delivered = $0 { false } else { true } }.count
        #expect(offeredBeforeFirstAnswer == 12, "\(offeredBeforeFirstAnswer) items offered before the first answer")
        // The file was offered only once every text before it was answered.
        let fileOffered = try #require(seen.firstIndex { if case .offered(let offer) = $0 { offer.id == file.id } else { false } })
        let deliveredBeforeFile = seen[..<fileOffered].filter { if case .delivered = $0 { true } else { false } }.count
        #expect(deliveredBeforeFile == 30)
        let texts = try pair.bob.inbox().compactMap(\.text)
        #expect(texts.count == 40 && Set(texts).count == 40)
        #expect(try pair.alice.outbox().isEmpty)
    }

    @Test("progress events never exceed what the receiver has written of the file")
    func progressFollowsTheReceiver() async throws {
        let pair = try NodePair(limits: Self.limits)
        let size = 2 << 20
        let source = pair.aliceHome.home.path + "/big.bin"
        try Data(randomBytes(size)).write(to: URL(fileURLWithPath: source))
        let item = try pair.alice.enqueueFile(at: source, to: "bob", expiresAt: Date().addingTimeInterval(3600))
        let bob = pair.bob
        let partial = bob.partialPath(for: item.id, from: pair.aliceAtBob)
        let committed = bob.home.inboxDirectory + "/\(item.id.uuidString)/big.bin"
        let reports = NIOLockedValueBox<[(reported: UInt64, written: UInt64)]>([])
        let outcome = try await deliverOverTCP(pair, limits: Self.limits, senderEvents: { event in
            guard case .progress(_, let bytes, _) = event else { return }
            // The receiver's copy: still partial, or already moved into the inbox (a rename: one or the other).
            let written = FileContent.size(of: partial) ?? FileContent.size(of: committed) ?? 0
            reports.withLockedValue { $0.append((bytes, written)) }
        })
        #expect(try outcome.sender.get().delivered == [item.id])
        let seen = reports.withLockedValue { $0 }
        #expect(seen.count >= 2, "progress reported during the transfer")
        #expect(seen.last?.reported == UInt64(size))
        for report in seen {
            #expect(report.reported <= report.written, "reported \(report.reported) with \(report.written) written")
        }
    }

    @Test("a version 2 sender is served as before: welcome without a window, no progress frames")
    func versionTwoSender() async throws {
        let pair = try NodePair(limits: Self.limits)
        let content = randomBytes(100_000)
        let now = DeliveryClock.nowMilliseconds
        let offer = ItemOffer(id: UUID(), kind: .file, size: UInt64(content.count), sha256: Array(SHA256.hash(data: content)),
                              createdMilliseconds: now, expiresMilliseconds: now + 3_600_000, name: "old.bin")
        let frames = try await Self.withReceiver(pair) { inbound, outbound in
            var iterator = inbound.makeAsyncIterator()
            var frames = try await startAsVersion2Sender(offer, &iterator, outbound)
            for start in stride(from: 0, to: content.count, by: 4096) {
                try await outbound.write(.data(ByteBuffer(bytes: content[start..<min(start + 4096, content.count)])))
            }
            try await outbound.write(.end(id: offer.id))
            if let ack = try await iterator.next() { frames.append(ack) }
            try await outbound.write(.done)
            while let frame = try await iterator.next() { frames.append(frame) }
            return frames
        }
        #expect(frames == [.welcome(version: 2, maxFramePayloadBytes: UInt32(Self.limits.maxFramePayloadBytes)),
                           .answer(id: offer.id, .nothing), .ack(id: offer.id)])
        #expect(try pair.bob.inbox().first?.fileName == "old.bin")
    }

    @Test("with a version 2 receiver the sender speaks 2: texts offered one by one, progress only at the ack")
    func versionTwoReceiver() async throws {
        let pair = try NodePair(limits: Self.limits)
        try pair.alice.enqueueText("hello", to: "bob", expiresAt: Date().addingTimeInterval(3600))
        let source = pair.aliceHome.home.path + "/a.bin"
        try Data(randomBytes(50_000)).write(to: URL(fileURLWithPath: source))
        let file = try pair.alice.enqueueFile(at: source, to: "bob", expiresAt: Date().addingTimeInterval(3600))
        // A scripted version 2 receiver: it welcomes with 2, takes everything, and records the frame types.
        let group = MultiThreadedEventLoopGroup.singleton
        let server = try await ServerBootstrap(group: group).bind(host: "127.0.0.1", port: 0) { child in
            child.eventLoop.makeCompletedFuture { try DeliveryChannel.configureSynchronously(child, limits: Self.limits) }
        }
        let port = try #require(server.channel.localAddress?.port)
        async let seen: [String] = server.executeThenClose { connections in
            for try await connection in connections {
                return try await connection.executeThenClose { inbound, outbound in
                    var names: [String] = []
                    var current: UUID?
                    for try await frame in inbound {
                        names.append(frame.name)
                        switch frame {
                        case .hello: try await outbound.write(.welcome(version: 2, maxFramePayloadBytes: 65_536))
                        case .offer(let offer):
                            current = offer.id
                            try await outbound.write(.answer(id: offer.id, .nothing))
                        case .end(let id) where id == current: try await outbound.write(.ack(id: id))
                        case .done: return names
                        default: break
                        }
                    }
                    return names
                }
            }
            return []
        }
        let client = try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: port) { channel in
            channel.eventLoop.makeCompletedFuture { try DeliveryChannel.configureSynchronously(channel, limits: Self.limits) }
        }
        let log = EventLog()
        let summary = try await DeliverySender(store: pair.alice, authenticatedPeer: pair.bobAtAlice, limits: Self.limits,
                                               events: log.handler, logger: quietLogger).run(on: client)
        let names = try await seen
        #expect(summary.delivered.count == 2)
        #expect(names.first == "hello" && names.filter { $0 == "offer" }.count == 2 && !names.contains("item"))
        let progress = log.events.compactMap { event -> UInt64? in
            if case .progress(file.id, let bytes, _) = event { return bytes }
            return nil
        }
        #expect(progress == [50_000])
    }

    /// Runs a receiver for Bob on a loopback listener and `client` as the connecting sender.
    static func withReceiver<T: Sendable>(
        _ pair: NodePair,
        client: @escaping @Sendable (NIOAsyncChannelInboundStream<DeliveryFrame>, NIOAsyncChannelOutboundWriter<DeliveryFrame>) async throws -> T
    ) async throws -> T {
        let group = MultiThreadedEventLoopGroup.singleton
        let server = try await ServerBootstrap(group: group).bind(host: "127.0.0.1", port: 0) { child in
            child.eventLoop.makeCompletedFuture { try DeliveryChannel.configureSynchronously(child, limits: limits) }
        }
        let port = try #require(server.channel.localAddress?.port)
        let receiver = DeliveryReceiver(store: pair.bob, authenticatedPeer: pair.aliceAtBob, limits: limits, logger: quietLogger)
        async let received: DeliveryReceiver.Summary = server.executeThenClose { connections in
            for try await connection in connections { return try await receiver.run(on: connection) }
            throw ChannelError.alreadyClosed
        }
        let channel = try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: port) { channel in
            channel.eventLoop.makeCompletedFuture { try DeliveryChannel.configureSynchronously(channel, limits: limits) }
        }
        let result = try await channel.executeThenClose { inbound, outbound in try await client(inbound, outbound) }
        _ = try await received
        return result
    }
}

/// A version 2 sender's opening, scripted: hello(2), then the offer of `offer` and `start(0)`. Returns the
/// receiver's welcome and answer.
func startAsVersion2Sender(_ offer: ItemOffer, _ iterator: inout NIOAsyncChannelInboundStream<DeliveryFrame>.AsyncIterator,
                           _ outbound: NIOAsyncChannelOutboundWriter<DeliveryFrame>) async throws -> [DeliveryFrame] {
    var frames: [DeliveryFrame] = []
    try await outbound.write(.hello(version: 2))
    if let welcome = try await iterator.next() { frames.append(welcome) }
    try await outbound.write(.offer(offer))
    if let answer = try await iterator.next() { frames.append(answer) }
    try await outbound.write(.start(id: offer.id, offset: 0))
    return frames
}
