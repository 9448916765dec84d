import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import Testing
@testable import ThaliBLEBinding

/// Collects what reaches the end of the pipeline after the handshake handler stepped aside.
final class CollectingHandler: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = ByteBuffer
    var received: [UInt8] = []
    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = unwrapInboundIn(data)
        received += buffer.readBytes(length: buffer.readableBytes) ?? []
    }
}

private func makeChannel(role: BluetoothHandshakeHandler.Role, timeout: TimeAmount = .seconds(5))
    throws -> (EmbeddedChannel, EventLoopFuture<BluetoothHandshake.Outcome>, CollectingHandler)
{
    let channel = EmbeddedChannel()
    let promise = channel.eventLoop.makePromise(of: BluetoothHandshake.Outcome.self)
    let collector = CollectingHandler()
    try channel.pipeline.syncOperations.addHandler(
        BluetoothHandshakeHandler(role: role, timeout: timeout, outcome: promise, successor: collector))
    return (channel, promise.futureResult, collector)
}

private func activate(_ channel: EmbeddedChannel) throws {
    try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
}

private func written(_ channel: EmbeddedChannel) throws -> [UInt8] {
    var bytes: [UInt8] = []
    while var buffer = try channel.readOutbound(as: ByteBuffer.self) {
        bytes += buffer.readBytes(length: buffer.readableBytes) ?? []
    }
    return bytes
}

/// The future's result if it has completed (EmbeddedEventLoop runs everything inline).
private func outcome(_ future: EventLoopFuture<BluetoothHandshake.Outcome>) -> Result<BluetoothHandshake.Outcome, any Error>? {
    let box = NIOLockedValueBox<Result<BluetoothHandshake.Outcome, any Error>?>(nil)
    future.whenComplete { result in box.withLockedValue { $0 = result } }
    return box.withLockedValue { $0 }
}

@Suite struct HandshakeStateMachineTests {
    @Test func serverAcceptsZeroAndOne() {
        var state = BluetoothHandshake.ServerState.awaitingHello
        #expect(state.receive(0) == .acknowledge(.hasNotifications))
        #expect(state.receive(5) == .none)
        var other = BluetoothHandshake.ServerState.awaitingHello
        #expect(other.receive(1) == .acknowledge(.hasNoNotifications))
    }

    @Test(arguments: [UInt8(2), 0x30, 0xFF])
    func serverRejectsOthers(_ octet: UInt8) {
        var state = BluetoothHandshake.ServerState.awaitingHello
        #expect(state.receive(octet) == .close(.invalidClientHello(octet)))
        #expect(state == .failed(.invalidClientHello(octet)))
        #expect(state.fail(.timedOut) == .none)
    }

    @Test func clientNeedsZero() {
        var state = BluetoothHandshake.ClientState.idle
        #expect(state.start(.hasNoNotifications) == .send(.hasNoNotifications))
        #expect(state.receive(0) == .completed)
        var bad = BluetoothHandshake.ClientState.idle
        _ = bad.start(.hasNotifications)
        #expect(bad.receive(1) == .close(.invalidServerAcknowledgement(1)))
        var early = BluetoothHandshake.ClientState.idle
        #expect(early.receive(0) == .close(.invalidServerAcknowledgement(0)))
    }
}

@Suite struct HandshakeHandlerTests {
    @Test func serverAcknowledgesAndForwardsTheRestOfTheSameRead() throws {
        let (channel, future, collector) = try makeChannel(role: .server)
        try activate(channel)
        try channel.writeInbound(ByteBuffer(bytes: [0, 0x41, 0x42]))
        #expect(try written(channel) == [0])
        #expect(try outcome(future)?.get() == .serverReceived(.hasNotifications))
        #expect(collector.received == [0x41, 0x42])
        #expect(channel.isActive)
        // The handler has stepped aside: later octets go straight through, a 0 included.
        try channel.writeInbound(ByteBuffer(bytes: [0, 9]))
        #expect(collector.received == [0x41, 0x42, 0, 9])
        _ = try channel.finish()
    }

    @Test func serverHandlesEmptyReadsAndSplitDelivery() throws {
        let (channel, future, collector) = try makeChannel(role: .server)
        try activate(channel)
        try channel.writeInbound(ByteBuffer())
        #expect(outcome(future) == nil)
        #expect(try written(channel).isEmpty)
        try channel.writeInbound(ByteBuffer(bytes: [1]))
        #expect(try outcome(future)?.get() == .serverReceived(.hasNoNotifications))
        try channel.writeInbound(ByteBuffer(bytes: [7]))
        #expect(collector.received == [7])
        #expect(try written(channel) == [0])
    }

    @Test(arguments: [UInt8(2), 0x80, 0xFF])
    func serverClosesOnInvalidHello(_ octet: UInt8) throws {
        let (channel, future, collector) = try makeChannel(role: .server)
        try activate(channel)
        try channel.writeInbound(ByteBuffer(bytes: [octet, 0]))
        #expect(throws: BluetoothHandshake.Violation.invalidClientHello(octet)) { try outcome(future)?.get() }
        #expect(!channel.isActive)
        #expect(try written(channel).isEmpty)
        #expect(collector.received.isEmpty)
    }

    @Test func clientSendsHelloAndAcceptsZero() throws {
        let (channel, future, collector) = try makeChannel(role: .client(.hasNoNotifications))
        try activate(channel)
        #expect(try written(channel) == [1])
        try channel.writeInbound(ByteBuffer(bytes: [0, 0xAA]))
        #expect(try outcome(future)?.get() == .clientAcknowledged)
        #expect(collector.received == [0xAA])
        #expect(channel.isActive)
    }

    @Test(arguments: [UInt8(1), 2, 0xFF])
    func clientClosesOnWrongAcknowledgement(_ octet: UInt8) throws {
        let (channel, future, collector) = try makeChannel(role: .client(.hasNotifications))
        try activate(channel)
        #expect(try written(channel) == [0])
        try channel.writeInbound(ByteBuffer(bytes: [octet]))
        #expect(throws: BluetoothHandshake.Violation.invalidServerAcknowledgement(octet)) { try outcome(future)?.get() }
        #expect(!channel.isActive)
        #expect(collector.received.isEmpty)
    }

    @Test func timesOut() throws {
        let (channel, future, _) = try makeChannel(role: .server, timeout: .seconds(2))
        try activate(channel)
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(1999))
        #expect(outcome(future) == nil)
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(1))
        #expect(throws: BluetoothHandshake.Violation.timedOut) { try outcome(future)?.get() }
        #expect(!channel.isActive)
    }

    @Test func closeBeforeHandshakeIsAViolation() throws {
        let (channel, future, _) = try makeChannel(role: .client(.hasNotifications))
        try activate(channel)
        try channel.close().wait()
        #expect(throws: BluetoothHandshake.Violation.closedBeforeHandshake) { try outcome(future)?.get() }
    }
}


@Suite struct HandshakeErrorTests {
    struct Reset: Error {}

    @Test func anIOErrorBeforeTheHandshakeEndsItAsClosed() throws {
        let channel = EmbeddedChannel()
        let promise = channel.eventLoop.makePromise(of: BluetoothHandshake.Outcome.self)
        try channel.pipeline.syncOperations.addHandler(
            BluetoothHandshakeHandler(role: .client(.hasNotifications), timeout: .seconds(5), outcome: promise))
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        channel.pipeline.fireErrorCaught(Reset())
        let box = NIOLockedValueBox<Result<BluetoothHandshake.Outcome, any Error>?>(nil)
        promise.futureResult.whenComplete { result in box.withLockedValue { $0 = result } }
        #expect(throws: BluetoothHandshake.Violation.closedBeforeHandshake) { try box.withLockedValue { $0 }?.get() }
        #expect(!channel.isActive)
    }
}
