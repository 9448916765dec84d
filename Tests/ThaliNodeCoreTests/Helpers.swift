import Foundation
import Testing
import Logging
import NIOCore
import NIOPosix
import ThaliBeacons
// The helpers the tests here share with the CLI's tests (TemporaryHome, TestPeople, quietLogger, ...) live in
// ThaliNodeTestSupport; re-exported here so that every file of this target sees them.
@_exported import ThaliNodeTestSupport
@testable import ThaliNodeCore

/// Two nodes that know each other: `alice` sends to `bob`.
final class NodePair: @unchecked Sendable {
    let aliceHome = TemporaryHome("alice")
    let bobHome = TemporaryHome("bob")
    let alice: NodeStore
    let bob: NodeStore
    /// Bob as Alice's contact.
    let bobAtAlice: Contact
    /// Alice as Bob's contact.
    let aliceAtBob: Contact

    init(limits: DeliveryLimits) throws {
        alice = try NodeStore(home: aliceHome.home, limits: limits)
        bob = try NodeStore(home: bobHome.home, limits: limits)
        let aliceKey = randomPublicKey()
        let bobKey = randomPublicKey()
        bobAtAlice = try alice.addContact(name: "bob", publicKey: bobKey)
        aliceAtBob = try bob.addContact(name: "alice", publicKey: aliceKey)
    }
}

/// Closes the connection once `limit` bytes have been written through it (the rest of the write that
/// crosses the limit is cut off): an interruption at an exact byte position.
final class CutAfterBytes: ChannelOutboundHandler, @unchecked Sendable {
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    let limit: Int
    private var written = 0
    private var cut = false

    init(limit: Int) { self.limit = limit }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        var buffer = unwrapOutboundIn(data)
        guard !cut else {
            promise?.fail(ChannelError.ioOnClosedChannel)
            return
        }
        let room = limit - written
        if buffer.readableBytes < room {
            written += buffer.readableBytes
            context.write(wrapOutboundOut(buffer), promise: promise)
            return
        }
        cut = true
        if let head = buffer.readSlice(length: room), room > 0 {
            context.write(wrapOutboundOut(head), promise: nil)
        }
        context.flush()
        promise?.fail(ChannelError.ioOnClosedChannel)
        context.close(promise: nil)
    }
}

/// Which side of a delivery connection a cut applies to.
enum Side: Sendable { case sender, receiver }

/// Results of one delivery session over real loopback TCP.
struct SessionOutcome: Sendable {
    var sender: Result<DeliverySender.Summary, any Error>
    var receiver: Result<DeliveryReceiver.Summary, any Error>
}

/// Runs one session over a real TCP connection on 127.0.0.1: Bob listens (ephemeral port) and receives,
/// Alice connects and sends. `cut` closes one side's connection after that many written bytes.
func deliverOverTCP(_ pair: NodePair, limits: DeliveryLimits, receiverLimits: DeliveryLimits? = nil, cut: (Side, Int)? = nil,
                    now: @escaping @Sendable () -> Date = { Date() },
                    senderEvents: DeliveryEventHandler? = nil,
                    receiverEvents: DeliveryEventHandler? = nil,
                    newItems: LinkWakeSignal? = nil) async throws -> SessionOutcome {
    let group = MultiThreadedEventLoopGroup.singleton
    let server = try await ServerBootstrap(group: group)
        .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
        .bind(host: "127.0.0.1", port: 0) { child in
            child.eventLoop.makeCompletedFuture {
                if let (side, bytes) = cut, side == .receiver {
                    try child.pipeline.syncOperations.addHandler(CutAfterBytes(limit: bytes))
                }
                return try DeliveryChannel.configureSynchronously(child, limits: receiverLimits ?? limits)
            }
        }
    let port = try #require(server.channel.localAddress?.port, "the delivery listener has no port")
    let receiver = DeliveryReceiver(store: pair.bob, authenticatedPeer: pair.aliceAtBob, limits: receiverLimits ?? limits, now: now,
                                    events: receiverEvents, logger: quietLogger)
    let sender = DeliverySender(store: pair.alice, authenticatedPeer: pair.bobAtAlice, limits: limits, now: now,
                                events: senderEvents, logger: quietLogger, newItems: newItems)
    async let receiverResult: Result<DeliveryReceiver.Summary, any Error> = {
        do {
            return .success(try await server.executeThenClose { connections in
                for try await connection in connections { return try await receiver.run(on: connection) }
                throw ChannelError.alreadyClosed
            })
        } catch { return .failure(error) }
    }()
    let senderResult: Result<DeliverySender.Summary, any Error>
    do {
        let client = try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: port) { channel in
            channel.eventLoop.makeCompletedFuture {
                if let (side, bytes) = cut, side == .sender {
                    try channel.pipeline.syncOperations.addHandler(CutAfterBytes(limit: bytes))
                }
                return try DeliveryChannel.configureSynchronously(channel, limits: limits)
            }
        }
        senderResult = .success(try await sender.run(on: client))
    } catch {
        senderResult = .failure(error)
    }
    return SessionOutcome(sender: senderResult, receiver: await receiverResult)
}

/// Collects delivery events from a session's task.
final class EventLog: @unchecked Sendable {
    private let lock = NSLock()
    private var storage: [DeliveryEvent] = []

    var handler: DeliveryEventHandler { { event in self.lock.withLock { self.storage.append(event) } } }
    var events: [DeliveryEvent] { lock.withLock { storage } }
}
