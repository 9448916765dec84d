import NIOCore
import NIOEmbedded
import ThaliPSKTLS

/// Records what reaches the application end of a PSK-TLS pipeline.
final class TLSApplicationLog: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = ByteBuffer
    var received: [UInt8] = []
    var handshakeCompleted = false
    var inputClosed = false
    var errors = 0
    func channelRead(context: ChannelHandlerContext, data: NIOAny) { received += unwrapInboundIn(data).readableBytesView }
    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case PSKTLSEvent.handshakeCompleted = event { handshakeCompleted = true }
        if case ChannelEvent.inputClosed = event { inputClosed = true }
    }
    func errorCaught(context: ChannelHandlerContext, error: any Error) { errors += 1 }
}

/// The contexts and credentials every PSK-TLS harness shares (a context is costly; a connection is not).
struct PSKTLSFixture: @unchecked Sendable {
    static let identity = String(repeating: "A", count: 192)
    static let psk = [UInt8](repeating: 0x5C, count: 32)
    let client: PSKTLSContext
    let server: PSKTLSContext

    /// ffdhe2048, the node's group: the DH work of every handshake is most of a PSK-TLS input's cost
    /// (a third of ffdhe3072's), and the group's size changes no path in our code.
    static let shared: PSKTLSFixture? = {
        let configuration = PSKTLSConfiguration(dhGroup: .ffdhe2048)
        guard let client = try? PSKTLSContext(role: .client, configuration: configuration),
              let server = try? PSKTLSContext(role: .server, configuration: configuration) else { return nil }
        return PSKTLSFixture(client: client, server: server)
    }()

    /// The first flight of a real client: its ClientHello record.
    static let clientHello: [UInt8] = {
        guard let fixture = shared,
              let handler = try? PSKTLSHandler(clientContext: fixture.client, identity: identity, psk: psk)
        else { return [] }
        let channel = EmbeddedChannel()
        defer { _ = try? channel.finish(acceptAlreadyClosed: true) }
        guard (try? channel.pipeline.syncOperations.addHandler(handler)) != nil,
              (try? channel.connect(to: SocketAddress(ipAddress: "192.0.2.1", port: 1)).wait()) != nil
        else { return [] }
        var bytes: [UInt8] = []
        while let buffer = try? channel.readOutbound(as: ByteBuffer.self) { bytes += buffer.readableBytesView }
        return bytes
    }()

    /// A channel with a handler of `role` and an application log behind it, connected.
    func endpoint(server isServer: Bool) -> (EmbeddedChannel, TLSApplicationLog)? {
        let channel = EmbeddedChannel()
        channel.allowRemoteHalfClosure = true  // as a TCP channel of PSKTLSServer or PSKTLSClient: half-closure is used
        let log = TLSApplicationLog()
        do {
            let handler = isServer
                ? try PSKTLSHandler(serverContext: server, lookup: { $0 == Self.identity ? Self.psk : nil })
                : try PSKTLSHandler(clientContext: client, identity: Self.identity, psk: Self.psk)
            try channel.pipeline.syncOperations.addHandlers([OutputHalfCloser(), handler, log])
            try channel.connect(to: SocketAddress(ipAddress: "192.0.2.1", port: 1)).wait()
        } catch {
            _ = try? channel.finish(acceptAlreadyClosed: true)
            return nil
        }
        return (channel, log)
    }
}

/// Stands for TCP below the handler: closing the output is a half-closure (an `EmbeddedChannel` alone
/// would close fully, and the other direction must keep flowing).
final class OutputHalfCloser: ChannelOutboundHandler, @unchecked Sendable {
    typealias OutboundIn = ByteBuffer
    func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        guard mode == .output else { return context.close(mode: mode, promise: promise) }
        promise?.succeed(())
    }
}

func drainOutbound(_ channel: EmbeddedChannel) -> [UInt8] {
    var bytes: [UInt8] = []
    while let buffer = try? channel.readOutbound(as: ByteBuffer.self) { bytes += buffer.readableBytesView }
    return bytes
}

/// A PSK-TLS server fed arbitrary bytes: either from the first byte (the record layer and ClientHello
/// parsing, cheap) or after a real client's ClientHello (the server has chosen DHE-PSK and waits for the
/// client's key exchange and Finished; each such input costs one DH key generation).
///
/// Invariants: without the PSK no input completes the handshake or delivers plaintext; a failed
/// connection is closed; the server's output stays within a handshake flight and an alert.
enum PSKTLSServerHarness {
    static let name = "psk-tls-server"

    static let harness = FuzzHarness(name: name, summary: "the PSK-TLS server handler, before and after a real ClientHello", seeds: seeds) {
        (input: inout FuzzInput) throws(FuzzInvariantViolation) in
        guard let fixture = PSKTLSFixture.shared, let (channel, log) = fixture.endpoint(server: true) else { return }
        let afterHello = input.bool()
        let cuts = takeCuts(&input, maximum: 8)
        let bytes = input.rest()
        var sent = 0
        if afterHello {
            _ = try? channel.writeInbound(ByteBuffer(bytes: PSKTLSFixture.clientHello))
            sent += drainOutbound(channel).count
        }
        for piece in splitPieces(bytes, cuts: cuts) where channel.isActive {
            _ = try? channel.writeInbound(ByteBuffer(bytes: piece))
            sent += drainOutbound(channel).count
        }
        let open = channel.isActive
        _ = try? channel.finish(acceptAlreadyClosed: true)
        try check(!log.handshakeCompleted, name, "a handshake completed without the PSK")
        try check(log.received.isEmpty, name, "\(log.received.count) bytes of plaintext without a handshake")
        try check(sent <= 4096, name, "the server wrote \(sent) bytes")
        if log.errors > 0 { try check(!open, name, "still open after an error") }
    }

    static func seeds() -> [[UInt8]] {
        let hello = PSKTLSFixture.clientHello
        return [
            [0, 0] + hello,  // a real ClientHello from the first byte
            [0, 3, 5, 0, 9, 0, 0x40, 0] + hello,  // split inside the record header and the extensions
            [1, 0, 0x16, 0x03, 0x03, 0x00, 0x46, 0x10, 0x00, 0x00, 0x42],  // after the hello: a short ClientKeyExchange
            [1, 0, 0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28],  // an alert
        ]
    }
}

/// A real PSK-TLS client and server back to back: after the handshake the input writes records of any
/// size from either side, moves the wire in pieces of its choosing and closes outputs.
///
/// Invariants: the handshake completes between honest ends; each direction delivers exactly the bytes
/// written, in order; a closed output reaches the other side as the end of input, after all its data.
enum PSKTLSPairHarness {
    static let name = "psk-tls-pair"

    static let harness = FuzzHarness(name: name, summary: "PSK-TLS client and server back to back, after the handshake", seeds: seeds) {
        (input: inout FuzzInput) throws(FuzzInvariantViolation) in
        guard let fixture = PSKTLSFixture.shared,
              let (client, clientLog) = fixture.endpoint(server: false),
              let (server, serverLog) = fixture.endpoint(server: true)
        else { return }
        let channels = [client, server], logs = [clientLog, serverLog]
        defer { for channel in channels { _ = try? channel.finish(acceptAlreadyClosed: true) } }
        var wire: [[UInt8]] = [[], []]
        func move(from side: Int, limit: Int) {
            wire[side] += drainOutbound(channels[side])
            let count = min(limit, wire[side].count)
            guard count > 0, channels[1 - side].isActive else { return }
            let piece = wire[side].prefix(count)
            wire[side].removeFirst(count)
            _ = try? channels[1 - side].writeInbound(ByteBuffer(bytes: piece))
        }
        for _ in 0..<20 { move(from: 0, limit: .max); move(from: 1, limit: .max) }
        try check(clientLog.handshakeCompleted && serverLog.handshakeCompleted, name, "honest ends did not complete the handshake")

        var written: [[UInt8]] = [[], []]
        var closed = [false, false]
        var steps = 0
        while !input.isEmpty, steps < 100 {
            steps += 1
            let operation = input.byte()
            let side = Int(operation >> 7)
            switch (operation & 0x7F) % 4 {
            case 0, 1:
                guard !closed[side] else { break }
                let count = 1 + Int(input.uint16()) % (operation & 1 == 0 ? 64 : 40_000)
                let start = written[side].count
                let bytes = WrittenBytes.content(stream: side, offset: start, count: count)
                written[side] += bytes
                channels[side].writeAndFlush(ByteBuffer(bytes: bytes), promise: nil)
            case 2:
                move(from: side, limit: 1 + Int(input.uint16()))
            default:
                guard input.byte() < 40, !closed[side] else { break }
                closed[side] = true
                channels[side].close(mode: .output, promise: nil)
            }
        }
        for _ in 0..<50 { move(from: 0, limit: .max); move(from: 1, limit: .max) }
        for side in 0..<2 {
            let reader = logs[1 - side]
            try check(WrittenBytes.same(reader.received, written[side]), name,
                      "\(side == 0 ? "client→server" : "server→client"): received \(reader.received.count) of \(written[side].count) bytes"
                        + (reader.received.count == written[side].count ? " (contents differ)" : ""))
        }
    }

    static func seeds() -> [[UInt8]] {
        [
            [0x00, 0x10, 0x00, 0x81, 0x00, 0x40, 0x02, 0xFF, 0xFF, 0x82, 0xFF, 0xFF],
            [0x01, 0xFF, 0xFF, 0x02, 0x07, 0x00, 0x02, 0x00, 0x10, 0x83, 0x00, 0x03, 0x00],
        ]
    }
}
