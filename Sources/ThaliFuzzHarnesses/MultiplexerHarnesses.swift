import NIOCore
import NIOEmbedded
import TCPMultiplexer

/// What one stream's pipeline saw: bytes, the peer's half-closure, errors, and whether bytes arrived after
/// the stream went inactive (a session must deliver nothing after close).
final class StreamLog: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = ByteBuffer
    var received: [UInt8] = []
    var inputClosed = false
    var inactive = false
    var readAfterClose = false
    /// The session reset this stream because its reader fell behind (thali-multiplex has no flow control).
    var overflowed = false
    /// The first error the stream's pipeline saw.
    var error: (any Error)?

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if inactive || inputClosed { readAfterClose = true }
        received += unwrapInboundIn(data).readableBytesView
    }
    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case ChannelEvent.inputClosed = event { inputClosed = true }
    }
    func channelInactive(context: ChannelHandlerContext) { inactive = true }
    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        self.error = self.error ?? error
        if case MultiplexerError.receiveBufferOverflow = error { overflowed = true }
    }
}

/// One end of a multiplexed connection on an `EmbeddedChannel`, with every stream it has (opened or
/// accepted) and its log. Timers are off so that only the harness's input moves anything.
final class MultiplexerEndpoint: @unchecked Sendable {
    let channel = EmbeddedChannel()
    let session: MultiplexerSession
    let configuration: MultiplexerConfiguration
    var streams: [(channel: Channel, log: StreamLog)] = []
    var sessionError: (any Error)?

    final class ErrorCatcher: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = Any
        var error: (any Error)?
        func errorCaught(context: ChannelHandlerContext, error: any Error) { self.error = self.error ?? error }
    }
    let catcher = ErrorCatcher()

    init?(role: MultiplexerRole, configuration: MultiplexerConfiguration, autoRead: Bool = true) {
        self.configuration = configuration
        let streamsBox = StreamsBox()
        do {
            try channel.pipeline.syncOperations.addHandler(catcher)
            try channel.connect(to: SocketAddress(ipAddress: "192.0.2.1", port: 1)).wait()
            session = try MultiplexerSession.configure(on: channel, role: role, configuration: configuration,
                inboundStreamInitializer: { stream in
                    stream.eventLoop.makeCompletedFuture {
                        let log = StreamLog()
                        try stream.syncOptions?.setOption(.allowRemoteHalfClosure, value: true)
                        try stream.syncOptions?.setOption(.autoRead, value: autoRead)
                        try stream.pipeline.syncOperations.addHandler(log)
                        streamsBox.accepted.append((stream, log))
                    }
                }).wait()
        } catch {
            return nil
        }
        self.streamsBox = streamsBox
    }

    final class StreamsBox: @unchecked Sendable { var accepted: [(channel: Channel, log: StreamLog)] = [] }
    private var streamsBox = StreamsBox()

    /// Moves accepted streams into `streams`, in the order they arrived.
    func collectAccepted() {
        streams += streamsBox.accepted
        streamsBox.accepted.removeAll()
    }

    /// Opens a stream; nil if the session refused.
    func open(autoRead: Bool) -> (channel: Channel, log: StreamLog)? {
        let log = StreamLog()
        let future = session.openStream(name: "s\(streams.count)") { stream in
            stream.eventLoop.makeCompletedFuture {
                try stream.syncOptions?.setOption(.allowRemoteHalfClosure, value: true)
                try stream.syncOptions?.setOption(.autoRead, value: autoRead)
                try stream.pipeline.syncOperations.addHandler(log)
            }
        }
        channel.embeddedEventLoop.run()
        guard let stream = try? future.wait() else { return nil }
        streams.append((stream, log))
        return (stream, log)
    }

    /// Everything this end has written to the wire so far.
    func takeOutbound() -> [UInt8] {
        var bytes: [UInt8] = []
        while let buffer = try? channel.readOutbound(as: ByteBuffer.self) { bytes += buffer.readableBytesView }
        return bytes
    }

    /// Feeds wire bytes; false once the session has ended.
    @discardableResult
    func feed(_ bytes: ArraySlice<UInt8>) -> Bool {
        guard channel.isActive, !bytes.isEmpty else { return channel.isActive }
        do { try channel.writeInbound(ByteBuffer(bytes: bytes)) } catch { sessionError = sessionError ?? error }
        channel.embeddedEventLoop.run()
        return channel.isActive
    }

    func finish() {
        for stream in streams { stream.channel.close(promise: nil) }
        channel.embeddedEventLoop.run()
        _ = try? channel.finish(acceptAlreadyClosed: true)
    }
}

/// Timers off, small buffers: flow control and limits are reached with small inputs.
func fuzzMultiplexerConfiguration(_ framing: MultiplexerFraming) -> MultiplexerConfiguration {
    var configuration = MultiplexerConfiguration(framing: framing)
    configuration.keepAliveInterval = nil
    configuration.maxConcurrentStreams = 16
    configuration.acceptBacklog = 16
    configuration.maxFrameSize = 64 * 1024
    // A stream may buffer its whole initial window, and the session every stream's: an honest peer that
    // respects the windows never overflows them, so the pair harness may demand exact delivery.
    configuration.maxStreamWindowSize = YamuxHeader.initialWindowSize
    configuration.maxStreamReceiveBuffer = YamuxHeader.initialWindowSize
    configuration.maxSessionReceiveBuffer = 16 * YamuxHeader.initialWindowSize
    configuration.sendChunkSize = 16 * 1024
    return configuration
}

/// One session (server role) fed arbitrary wire bytes, interleaved with what an application does on its
/// streams: open, write, half-close, reset, stop and resume reading (which moves the receive window).
///
/// Invariants: an error that ends the session is a `MultiplexerError` and leaves the channel closed;
/// buffered bytes stay within the configured limits; no stream receives data after it ended.
enum MultiplexerSessionHarness {
    static let yamux = harness(.yamux)
    static let thaliMultiplex = harness(.thaliMultiplex)

    static func harness(_ framing: MultiplexerFraming) -> FuzzHarness {
        let name = framing == .yamux ? "yamux-session" : "thali-multiplex-session"
        let configuration = fuzzMultiplexerConfiguration(framing)
        return FuzzHarness(name: name, summary: "\(framing.rawValue) frames and stream operations through one session",
                           seeds: { seeds(framing) }) { (input: inout FuzzInput) throws(FuzzInvariantViolation) in
            guard let endpoint = MultiplexerEndpoint(role: .server, configuration: configuration, autoRead: false) else { return }
            defer { endpoint.finish() }
            var steps = 0
            while !input.isEmpty, endpoint.channel.isActive, steps < 256 {
                steps += 1
                endpoint.collectAccepted()
                let operation = input.byte()
                let stream = endpoint.streams.isEmpty ? nil : endpoint.streams[input.int(below: endpoint.streams.count)]
                switch operation % 8 {
                case 0, 1, 2:  // wire bytes from the peer
                    let count = Int(input.uint16()) % 4096
                    endpoint.feed(input.bytes(count)[...])
                case 3:
                    _ = endpoint.open(autoRead: input.bool())
                case 4:
                    let count = Int(input.uint16())
                    stream?.channel.writeAndFlush(ByteBuffer(repeating: 0x61, count: count), promise: nil)
                case 5:
                    stream?.channel.close(mode: input.bool() ? .output : .all, promise: nil)
                case 6:
                    if let stream {
                        let reading = input.bool()
                        try? stream.channel.syncOptions?.setOption(.autoRead, value: reading)
                        stream.channel.read()
                    }
                default:
                    _ = endpoint.takeOutbound()
                }
                endpoint.channel.embeddedEventLoop.run()
                if endpoint.channel.isActive, let metrics = try? endpoint.session.metrics().wait() {
                    try check(metrics.bufferedReceiveBytes <= configuration.maxSessionReceiveBuffer + configuration.maxFrameSize,
                              name, "session buffers \(metrics.bufferedReceiveBytes) bytes")
                    for stream in metrics.streams {
                        try check(stream.bufferedReceiveBytes <= max(configuration.maxStreamReceiveBuffer, YamuxHeader.initialWindowSize)
                                    + configuration.maxFrameSize,
                                  name, "stream \(stream.streamID) buffers \(stream.bufferedReceiveBytes) bytes")
                    }
                }
            }
            endpoint.collectAccepted()
            if let error = endpoint.sessionError ?? endpoint.catcher.error {
                try check(error is MultiplexerError || error is ChannelError, name, "untyped session error: \(error)")
                if error is MultiplexerError {
                    try check(!endpoint.channel.isActive, name, "session still open after \(error)")
                }
            }
            for stream in endpoint.streams {
                try check(!stream.log.readAfterClose, name, "a stream received data after it ended")
            }
        }
    }

    /// Plausible traffic from a client: opens, data, window updates, half-closes, pings.
    static func seeds(_ framing: MultiplexerFraming) -> [[UInt8]] {
        func feed(_ wire: ByteBuffer) -> [UInt8] {
            let bytes = Array(wire.readableBytesView)
            return [0, 0, UInt8(bytes.count & 0xFF), UInt8(bytes.count >> 8)] + bytes
        }
        var wire = ByteBuffer()
        switch framing {
        case .yamux:
            YamuxHeader(type: .windowUpdate, flags: .syn, streamID: 1, length: 0).write(to: &wire)
            YamuxHeader(type: .data, streamID: 1, length: 5).write(to: &wire)
            wire.writeString("hello")
            YamuxHeader(type: .windowUpdate, streamID: 1, length: 65536).write(to: &wire)
            YamuxHeader(type: .ping, flags: .syn, streamID: 0, length: 7).write(to: &wire)
            YamuxHeader(type: .data, flags: .fin, streamID: 1, length: 0).write(to: &wire)
        case .thaliMultiplex:
            ThaliMultiplexHeader(streamID: 1, flag: .open, length: 2).write(to: &wire)
            wire.writeString("s0")
            ThaliMultiplexHeader(streamID: 1, flag: .messageInitiator, length: 5).write(to: &wire)
            wire.writeString("hello")
            ThaliMultiplexHeader(streamID: 1, flag: .closeInitiator, length: 0).write(to: &wire)
        }
        let opened = feed(wire)
        // Open a stream, read it, write on it, half-close it, then the peer resets.
        var reset = ByteBuffer()
        switch framing {
        case .yamux: YamuxHeader(type: .windowUpdate, flags: .rst, streamID: 2, length: 0).write(to: &reset)
        case .thaliMultiplex: ThaliMultiplexHeader(streamID: 1, flag: .resetReceiver, length: 0).write(to: &reset)
        }
        return [
            opened,
            opened + [6, 0, 1, 4, 0, 0x00, 0x10, 5, 0, 1, 7],
            [3, 0, 1, 4, 0, 0x00, 0x40, 7] + feed(reset) + [5, 0, 0],
        ]
    }
}
