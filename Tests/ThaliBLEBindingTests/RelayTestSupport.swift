import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing
// The BlueZ mock these tests share with the Bluetooth peer binding's lives in ThaliBluetoothTestSupport; re-exported
// here so that every file of this target sees it.
@_exported import ThaliBluetoothTestSupport
@testable import ThaliBLEBinding

/// A localhost TCP server standing in for the app: echoes what it receives, counts connections,
/// and can be told to close every connection it has.
final class EchoApp: @unchecked Sendable {
    final class Echo: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            context.write(data, promise: nil)
        }
        func channelReadComplete(context: ChannelHandlerContext) { context.flush() }
        func errorCaught(context: ChannelHandlerContext, error: any Error) { context.close(promise: nil) }
    }

    let channel: any Channel
    let accepted = NIOLockedValueBox<[any Channel]>([])
    var port: Int { channel.localAddress!.port! }
    var connectionCount: Int { accepted.withLockedValue { $0.count } }

    init(group: any EventLoopGroup) async throws {
        let accepted = self.accepted
        channel = try await ServerBootstrap(group: group)
            .childChannelInitializer { child in
                accepted.withLockedValue { $0.append(child) }
                return child.pipeline.addHandler(Echo())
            }
            .bind(host: "127.0.0.1", port: 0).get()
    }

    /// Closes every accepted connection (the app ends its side).
    func closeConnections() async {
        for child in accepted.withLockedValue({ $0 }) { try? await child.close() }
    }

    func stop() async {
        await closeConnections()
        try? await channel.close()
    }
}

/// A plain TCP client of the relay's localhost port.
func connectTCP(port: Int, group: any EventLoopGroup) async throws -> NIOAsyncChannel<ByteBuffer, ByteBuffer> {
    try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: port) { channel in
        channel.eventLoop.makeCompletedFuture { try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel) }
    }
}

/// A raw Bluetooth stream as an async channel (no handshake handler): for tests that play a broken peer.
func rawChannel(_ socket: BluetoothSocket, group: any EventLoopGroup) async throws -> NIOAsyncChannel<ByteBuffer, ByteBuffer> {
    let box = NIOLockedValueBox<NIOAsyncChannel<ByteBuffer, ByteBuffer>?>(nil)
    _ = try await socket.makeChannel(on: group.next()) { channel in
        channel.eventLoop.makeCompletedFuture {
            let wrapped = try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
            box.withLockedValue { $0 = wrapped }
        }
    }
    return try #require(box.withLockedValue { $0 })
}

/// Reads until `count` octets arrived or the stream ended; returns what arrived.
func read(_ inbound: NIOAsyncChannelInboundStream<ByteBuffer>.AsyncIterator, count: Int) async throws
    -> ([UInt8], NIOAsyncChannelInboundStream<ByteBuffer>.AsyncIterator)
{
    var iterator = inbound
    var bytes: [UInt8] = []
    while bytes.count < count, var buffer = try await iterator.next() {
        bytes += buffer.readBytes(length: buffer.readableBytes) ?? []
    }
    return (bytes, iterator)
}

/// Waits until the stream ends (the other side closed); true if it ended within `timeout`.
func waitForEnd(_ inbound: NIOAsyncChannelInboundStream<ByteBuffer>.AsyncIterator, timeout: Duration = .seconds(5)) async -> Bool {
    let box = UncheckedSendable(inbound)
    let ended = try? await withTimeout(timeout) {
        var iterator = box.value
        do {
            while try await iterator.next() != nil {}
        } catch {}
        return true
    }
    return ended == true
}

/// Collects a server's events in the background.
final class EventLog: Sendable {
    let events = NIOLockedValueBox<[BluetoothServerEvent]>([])
    private let task: Task<Void, Never>

    init(_ stream: AsyncStream<BluetoothServerEvent>) {
        let events = self.events
        task = Task {
            for await event in stream { events.withLockedValue { $0.append(event) } }
        }
    }

    deinit { task.cancel() }

    var all: [BluetoothServerEvent] { events.withLockedValue { $0 } }

    /// Waits until an event equal to `event` was logged.
    func waitFor(_ event: BluetoothServerEvent, timeout: Duration = .seconds(5)) async -> Bool {
        await eventually(timeout: timeout) { all.contains(event) }
    }
}

/// Polls `condition` until it holds or `timeout` passes.
func eventually(timeout: Duration = .seconds(5), _ condition: () -> Bool) async -> Bool {
    (try? await waitUntil(timeout: timeout, every: .milliseconds(10), condition)) ?? condition()
}

/// Hands a non-Sendable value to one other task that becomes its only user.
struct UncheckedSendable<T>: @unchecked Sendable {
    var value: T
    init(_ value: T) { self.value = value }
}

/// Polls an async `condition` until it holds or `timeout` passes.
func eventuallyAsync(timeout: Duration = .seconds(5), _ condition: () async -> Bool) async -> Bool {
    if let held = try? await waitUntil(timeout: timeout, condition) { return held }
    return await condition()
}
