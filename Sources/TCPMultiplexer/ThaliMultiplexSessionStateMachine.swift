import NIOCore

/// The `thali-multiplex` session (npm `multiplex` 6.7.0, libp2p mplex) apart from I/O. The framing has no
/// flow control, so every receive buffer is bounded here: a stream that overruns its own
/// (``MultiplexerConfiguration/maxStreamReceiveBuffer``) or the session's is reset. It has no ping and
/// no GoAway either.
struct ThaliMultiplexSessionStateMachine: MultiplexerSessionStateMachine {
    var core: MultiplexerSessionCore
    private var decoder: ThaliMultiplexFrameDecoder
    private var usedLocalIDs = Set<UInt64>()
    /// Ids of our ended streams the peer could still send a frame for, oldest first
    /// (see ``MultiplexerConfiguration/maxQuarantinedStreamIDs``).
    private var quarantinedLocalIDs = Set<UInt64>()
    private var quarantineOrder: [UInt64] = []

    init(role: MultiplexerRole, configuration: MultiplexerConfiguration, acceptsInboundStreams: Bool) {
        core = MultiplexerSessionCore(configuration: configuration, role: role, acceptsInboundStreams: acceptsInboundStreams)
        decoder = ThaliMultiplexFrameDecoder(maxPayloadLength: configuration.maxFrameSize)
    }

    var keepAliveInterval: TimeAmount? { nil }

    /// The table key of a stream: frames from its opener name a stream the peer opened (bit 0 clear).
    private static func key(streamID: UInt64, openedHere: Bool) -> UInt64 { streamID << 1 | (openedHere ? 1 : 0) }

    private func frame(_ header: ThaliMultiplexHeader, body: ByteBuffer? = nil) -> OutboundFrames {
        var frames = OutboundFrames()
        var buffer = core.allocator.buffer(capacity: 2 * ThaliMultiplexHeader.maxVarintLength)
        header.write(to: &buffer)
        frames.append(buffer)
        if let body, body.readableBytes > 0 { frames.append(body) }
        return frames
    }

    private func joined(_ frames: OutboundFrames) -> ByteBuffer {
        var buffer = core.allocator.buffer(capacity: frames.buffers.reduce(0) { $0 + $1.readableBytes })
        for var piece in frames.buffers { buffer.writeBuffer(&piece) }
        return buffer
    }

    // MARK: Input

    mutating func decodeNext(now: NIODeadline) throws(MultiplexerError) -> Bool {
        guard let event = try decoder.next() else { return false }
        if case .header(let header, let body) = event {
            core.metrics.framesReceived += 1
            try receive(header, body: body, now: now)
        } else if case .data(let bytes) = event {
            receivePayload(bytes)
        }
        return true
    }

    mutating func receive(_ bytes: ByteBuffer) {
        decoder.feed(bytes)
    }

    var isMidFrame: Bool { decoder.isMidFrame }

    private mutating func receive(_ header: ThaliMultiplexHeader, body: ByteBuffer?, now: NIODeadline) throws(MultiplexerError) {
        let key = Self.key(streamID: header.streamID, openedHere: !header.flag.fromInitiator)
        let stream = core.ref(forKey: key)
        core.currentDataStream = nil
        switch header.flag.kind {
        case .open:
            guard stream == nil else { throw .duplicateStream(header.streamID) }
            let name = body.map { String(decoding: $0.readableBytesView, as: UTF8.self) } ?? ""
            acceptRemoteStream(streamID: header.streamID, key: key,
                                   name: name.isEmpty ? String(header.streamID) : name, now: now)
        case .message:
            guard let stream, checkReceiveData(stream) else { return }
            let buffered = core.record(stream)?.window.buffered ?? 0
            if buffered + header.length > configuration.maxStreamReceiveBuffer
                || core.bufferedTotal + header.length > configuration.maxSessionReceiveBuffer {
                // No flow control in this framing: a reader that falls this far behind loses its stream.
                core.metrics.overflowResets += 1
                core.queue(.resetStream(stream, message: "receive buffer overflow",
                                        error: .receiveBufferOverflow(streamID: header.streamID,
                                                                      limit: configuration.maxStreamReceiveBuffer)))
                return
            }
            core.currentDataStream = stream
        case .close:
            // For a quarantined id: the peer may still reset it after its close.
            guard let stream else { return }
            receiveFIN(stream)
        case .reset:
            guard let stream else {
                if !header.flag.fromInitiator { releaseQuarantine(header.streamID) }
                return
            }
            let message = body.flatMap { $0.readableBytes > 0 ? String(decoding: $0.readableBytesView, as: UTF8.self) : nil }
            receiveReset(stream, message: message)
        }
    }

    // MARK: Stream ids

    mutating func allocateStreamID() throws(MultiplexerError) -> (streamID: UInt64, key: UInt64) {
        // The lowest id not in use, as multiplex 6.7.0 picks it.
        var candidate: UInt64 = 0
        while usedLocalIDs.contains(candidate) || quarantinedLocalIDs.contains(candidate) { candidate += 1 }
        guard candidate <= ThaliMultiplexHeader.maxStreamID else { throw .streamIDsExhausted }
        usedLocalIDs.insert(candidate)
        return (candidate, Self.key(streamID: candidate, openedHere: true))
    }

    mutating func streamDetached(_ record: StreamRecord) {
        guard record.isLocallyInitiated else { return }
        usedLocalIDs.remove(record.streamID)
        if record.peerMaySendAfterDetach { quarantine(record.streamID) }
    }

    private mutating func quarantine(_ streamID: UInt64) {
        guard configuration.maxQuarantinedStreamIDs > 0, quarantinedLocalIDs.insert(streamID).inserted else { return }
        quarantineOrder.append(streamID)
        if quarantineOrder.count > configuration.maxQuarantinedStreamIDs {
            quarantinedLocalIDs.remove(quarantineOrder.removeFirst())
        }
    }

    /// The peer's reset for one of our quarantined ids: nothing of the old stream can follow it.
    private mutating func releaseQuarantine(_ streamID: UInt64) {
        guard quarantinedLocalIDs.remove(streamID) != nil else { return }
        quarantineOrder.removeAll { $0 == streamID }
    }

    // MARK: Output

    func openFrame(streamID: UInt64, name: String?) -> ByteBuffer {
        let body = name.map { core.allocator.buffer(string: $0) }
        return joined(frame(ThaliMultiplexHeader(streamID: streamID, flag: .open, length: body?.readableBytes ?? 0), body: body))
    }

    func localStreamName(_ name: String?) -> String? { name }

    func resetFrame(streamID: UInt64, locallyInitiated: Bool, message: String?) -> ByteBuffer {
        let body = message.map { core.allocator.buffer(string: $0) }
        return joined(frame(ThaliMultiplexHeader(streamID: streamID, flag: .init(kind: .reset, fromInitiator: locallyInitiated),
                                                 length: body?.readableBytes ?? 0), body: body))
    }

    mutating func dataFrames(_ ref: StreamRef, payload: ByteBuffer, fin: Bool) -> OutboundFrames {
        let streamID = ref.key >> 1
        let fromInitiator = ref.key & 1 == 1
        var frames = OutboundFrames()
        if payload.readableBytes > 0 || !fin {
            frames = frame(ThaliMultiplexHeader(streamID: streamID, flag: .init(kind: .message, fromInitiator: fromInitiator),
                                                length: payload.readableBytes), body: payload)
        }
        if fin {
            var close = core.allocator.buffer(capacity: 2 * ThaliMultiplexHeader.maxVarintLength)
            ThaliMultiplexHeader(streamID: streamID, flag: .init(kind: .close, fromInitiator: fromInitiator), length: 0)
                .write(to: &close)
            frames.append(close)
        }
        return frames
    }

    mutating func reserveSend(_ ref: StreamRef, upTo wanted: Int) -> Int {
        min(wanted, configuration.maxFrameSize)
    }

    func hasSendWindow(_ ref: StreamRef) -> Bool { true }

    mutating func consumed(_ ref: StreamRef, bytes: Int, now: NIODeadline) -> ByteBuffer? {
        _ = accountConsumed(ref, bytes: bytes)
        return nil
    }

    mutating func acknowledgeFrame(_ ref: StreamRef) -> ByteBuffer? { nil }

    mutating func goAway() -> ByteBuffer? { nil }

    mutating func goAwayFrame(for error: Error) -> ByteBuffer? { nil }

    mutating func ping(now: NIODeadline) throws(MultiplexerError) -> OutboundPing {
        throw .unsupported("ping in thali-multiplex")
    }

    mutating func startPing(now: NIODeadline) -> OutboundPing? { nil }

    func isPingOutstanding(_ id: UInt32) -> Bool { false }

    mutating func outputBecameWritable() -> ByteBuffer? {
        core.controlBacklog = 0
        return nil
    }
}
