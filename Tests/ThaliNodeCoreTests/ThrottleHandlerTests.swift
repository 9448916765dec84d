import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import Testing
@testable import ThaliNodeCore

/// The delivery sender's pacing aid (`--throttle`), on the embedded loop's virtual clock.
@Suite("ThrottleHandler")
struct ThrottleHandlerTests {
    private func throttled(bytesPerSecond: Int) throws -> EmbeddedChannel {
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(ThrottleHandler(bytesPerSecond: bytesPerSecond))
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        return channel
    }

    private func block(_ byte: UInt8, _ count: Int = 1000) -> ByteBuffer { ByteBuffer(repeating: byte, count: count) }

    /// How each write ended so far: nil while pending, else nil-or-error.
    private func outcomes(_ writes: [EventLoopFuture<Void>]) -> NIOLockedValueBox<[Result<Void, any Error>?]> {
        let box = NIOLockedValueBox<[Result<Void, any Error>?]>(Array(repeating: nil, count: writes.count))
        for (index, write) in writes.enumerated() { write.whenComplete { result in box.withLockedValue { $0[index] = result } } }
        return box
    }

    private func written(_ channel: EmbeddedChannel) throws -> [UInt8] {
        var bytes: [UInt8] = []
        while let buffer = try channel.readOutbound(as: ByteBuffer.self) { bytes.append(buffer.getInteger(at: buffer.readerIndex) ?? 0) }
        return bytes
    }

    @Test("writes go out in order, each when its share of the rate allows")
    func writesAreHeldUntilTheirSlot() throws {
        let channel = try throttled(bytesPerSecond: 1000)
        for byte in UInt8(1)...3 { channel.writeAndFlush(block(byte), promise: nil) }
        #expect(try written(channel) == [1])
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(999))
        #expect(try written(channel) == [])
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(1))
        #expect(try written(channel) == [2])
        channel.embeddedEventLoop.advanceTime(by: .seconds(5))
        #expect(try written(channel) == [3])
        // Idle time is not saved up: the next write after a pause goes out at once, the one after it waits.
        channel.writeAndFlush(block(4), promise: nil)
        channel.writeAndFlush(block(5), promise: nil)
        #expect(try written(channel) == [4])
        channel.embeddedEventLoop.advanceTime(by: .seconds(1))
        #expect(try written(channel) == [5])
        _ = try channel.finish(acceptAlreadyClosed: true)
    }

    /// At 1000 B/s, three 1000-byte writes and then a close: the first write goes out at once, the other
    /// two and the close are held. Returns the writes' futures and whether the close completed.
    private func threeWritesThenClose() throws -> (EmbeddedChannel, [EventLoopFuture<Void>], NIOLockedValueBox<Bool>) {
        let channel = try throttled(bytesPerSecond: 1000)
        let writes = (UInt8(1)...3).map { channel.writeAndFlush(block($0)) }
        let closeDone = NIOLockedValueBox(false)
        channel.close().whenComplete { _ in closeDone.withLockedValue { $0 = true } }
        #expect(try written(channel) == [1])
        return (channel, writes, closeDone)
    }

    @Test("an orderly close waits for the writes held before it")
    func closeWaitsForHeldWrites() throws {
        let (channel, writes, closeDone) = try threeWritesThenClose()
        #expect(!closeDone.withLockedValue { $0 } && channel.isActive)
        channel.embeddedEventLoop.advanceTime(by: .seconds(2))
        #expect(try written(channel) == [2, 3])
        #expect(closeDone.withLockedValue { $0 } && !channel.isActive)
        let ended = outcomes(writes).withLockedValue { $0 }
        #expect(ended.allSatisfy { if case .success = $0 { true } else { false } }, "\(ended)")
    }

    @Test("once the channel is inactive, held writes fail and a waiting close goes through at once")
    func inactiveChannelDropsHeldWrites() throws {
        let (channel, writes, closeDone) = try threeWritesThenClose()
        // What a torn-down multiplexer stream does: inactive, without waiting for anything held.
        channel.pipeline.fireChannelInactive()
        #expect(closeDone.withLockedValue { $0 })
        let ended = outcomes(writes).withLockedValue { $0 }
        #expect(ended.dropFirst().allSatisfy {
            if case .failure(let error) = $0 { (error as? ChannelError) == .ioOnClosedChannel } else { false }
        }, "\(ended)")
        channel.embeddedEventLoop.advanceTime(by: .seconds(10))
        #expect(try written(channel) == [])
    }
}
