import NIOCore
import ThaliMutants

/// The yamux session (hashicorp/yamux `spec.md`, version 0) apart from I/O: decodes frames, keeps every
/// stream's state and ``StreamWindow``, answers pings, and encodes this side's frames.
struct YamuxSessionStateMachine: MultiplexerSessionStateMachine {
    var core: MultiplexerSessionCore
    private var decoder: YamuxFrameDecoder
    private var nextStreamID: UInt64
    /// yamux flags of the data frame being received, applied once its payload is in.
    private var currentDataFlags: YamuxHeader.Flags = []
    private var nextPingID: UInt32 = 1
    /// When each unanswered ping was sent.
    private var outstandingPings: [UInt32: NIODeadline] = [:]
    /// A ping to answer once the channel is writable again.
    private var pendingPingAnswer: UInt32?

    init(role: MultiplexerRole, configuration: MultiplexerConfiguration, acceptsInboundStreams: Bool) {
        core = MultiplexerSessionCore(configuration: configuration, role: role, acceptsInboundStreams: acceptsInboundStreams)
        decoder = YamuxFrameDecoder(maxDataLength: min(configuration.maxStreamWindowSize, Int(UInt32.max)))
        nextStreamID = role == .client ? 1 : 2
    }

    var keepAliveInterval: TimeAmount? { configuration.keepAliveInterval.map(TimeAmount.init) }

    private func frame(_ type: YamuxHeader.FrameType, _ flags: YamuxHeader.Flags = [], streamID: UInt32,
                       length: UInt32) -> ByteBuffer {
        var buffer = core.allocator.buffer(capacity: YamuxHeader.size)
        YamuxHeader(type: type, flags: flags, streamID: streamID, length: length).write(to: &buffer)
        return buffer
    }

    // MARK: Input

    mutating func receive(_ bytes: ByteBuffer) {
        decoder.feed(bytes)
    }

    var isMidFrame: Bool { decoder.isMidFrame }

    mutating func decodeNext(now: NIODeadline) throws(MultiplexerError) -> Bool {
        guard let event = try decoder.next() else { return false }
        switch event {
        case .data(let bytes):
            receivePayload(bytes)
            if decoder.pendingPayloadBytes == 0 { finishDataFrame() }
        case .header(let header):
            core.metrics.framesReceived += 1
            try receive(header, now: now)
        }
        return true
    }

    private mutating func receive(_ header: YamuxHeader, now: NIODeadline) throws(MultiplexerError) {
        switch header.type {
        case .data, .windowUpdate:
            try receiveStreamFrame(header, now: now)
        case .ping:
            if header.flags.contains(.syn) {
                if core.outputWritable {
                    core.queue(.write(frame(.ping, .ack, streamID: 0, length: header.length)))
                } else {
                    // Congested: answer only the latest ping once writable, so a ping flood cannot
                    // queue answers without bound.
                    pendingPingAnswer = header.length
                }
            } else if header.flags.contains(.ack), let sent = outstandingPings.removeValue(forKey: header.length) {
                let roundTripTime = now - sent
                core.roundTripTime = roundTripTime
                core.queue(.pingAnswered(id: header.length, roundTripTime: roundTripTime))
            }
        case .goAway:
            guard header.length == YamuxHeader.GoAwayCode.normal.rawValue && !Mutant.yamuxGoAwayEndsSession.isActive else {
                throw .remoteGoAway(code: header.length)
            }
            core.session.receiveGoAway()
            core.metrics.goAwaysReceived += 1
        }
    }

    private mutating func receiveStreamFrame(_ header: YamuxHeader, now: NIODeadline) throws(MultiplexerError) {
        let id = UInt64(header.streamID)
        guard id != 0 else { throw .invalidStreamID(0) }
        var stream = core.ref(forKey: id)
        if header.flags.contains(.syn) {
            guard stream == nil else { throw .duplicateStream(id) }
            // The client opens odd ids, the server even ones.
            let remoteOpensOdd = core.role == .server
            guard (id % 2 == 1) == remoteOpensOdd || Mutant.yamuxAcceptsWrongParity.isActive else { throw .invalidStreamID(id) }
            stream = acceptRemoteStream(streamID: id, key: id, name: nil, now: now)
            // Our first frame on the stream acknowledges it.
            if let stream { core.update(stream) { record in record.ackPending = true } }
        }
        core.currentDataStream = nil
        currentDataFlags = []
        guard let stream else { return }  // A stream already gone (we reset it): drop the frame.
        if header.flags.contains(.rst) {
            receiveReset(stream, message: nil)
            return
        }
        if header.type == .windowUpdate {
            try core.update(stream) { record throws(MultiplexerError) in
                try record.window.peerGranted(header.length, streamID: id)
            }
            if header.flags.contains(.fin) { receiveFIN(stream) }
            if header.length > 0 { core.queue(.sendWindowOpened(stream)) }
            return
        }
        let length = Int(header.length)
        if length > 0 {
            // One table lookup per data frame: the window check (fatal), the stream's direction (a
            // stream error), then the window is used up.
            var streamError: MultiplexerError?
            let accepted = try core.update(stream) { record throws(MultiplexerError) -> Bool in
                try record.window.checkFrame(length: length, streamID: id)
                do throws(MultiplexerError) {
                    try record.state.receiveData(streamID: record.streamID)
                } catch {
                    streamError = error
                    return false
                }
                record.window.receiveFrame(length: length)
                return true
            }
            if let streamError { core.queue(.resetStream(stream, message: nil, error: streamError)) }
            guard accepted == true else { return }
            core.currentDataStream = stream
            currentDataFlags = header.flags
        } else if header.flags.contains(.fin) {
            receiveFIN(stream)
        }
    }

    private mutating func finishDataFrame() {
        if let stream = core.currentDataStream, currentDataFlags.contains(.fin) { receiveFIN(stream) }
        core.currentDataStream = nil
        currentDataFlags = []
    }

    mutating func streamDetached(_ record: StreamRecord) {}

    // MARK: Output

    mutating func allocateStreamID() throws(MultiplexerError) -> (streamID: UInt64, key: UInt64) {
        guard nextStreamID <= UInt64(UInt32.max) else { throw .streamIDsExhausted }
        defer { nextStreamID += 2 }
        return (nextStreamID, nextStreamID)
    }

    func openFrame(streamID: UInt64, name: String?) -> ByteBuffer {
        frame(.windowUpdate, .syn, streamID: UInt32(streamID), length: 0)
    }

    func localStreamName(_ name: String?) -> String? { nil }

    func resetFrame(streamID: UInt64, locallyInitiated: Bool, message: String?) -> ByteBuffer {
        frame(.windowUpdate, .rst, streamID: UInt32(truncatingIfNeeded: streamID), length: 0)
    }

    /// The flags of the next frame on `ref` beyond `flags`: ACK if the stream still owes one.
    private mutating func takeAck(_ ref: StreamRef, into flags: inout YamuxHeader.Flags) {
        let owed = core.update(ref) { record in
            defer { record.ackPending = false }
            return record.ackPending
        }
        if owed == true { flags.insert(.ack) }
    }

    mutating func dataFrames(_ ref: StreamRef, payload: ByteBuffer, fin: Bool) -> OutboundFrames {
        var flags: YamuxHeader.Flags = fin ? .fin : []
        takeAck(ref, into: &flags)
        var frames = OutboundFrames()
        let streamID = UInt32(truncatingIfNeeded: ref.key)
        if payload.readableBytes == 0 {
            // A bare FIN travels as a window update, as hashicorp/yamux sends it.
            frames.append(frame(.windowUpdate, flags, streamID: streamID, length: 0))
        } else {
            frames.append(frame(.data, flags, streamID: streamID, length: UInt32(payload.readableBytes)))
            frames.append(payload)
        }
        return frames
    }

    mutating func reserveSend(_ ref: StreamRef, upTo wanted: Int) -> Int {
        let limit = min(wanted, configuration.maxFrameSize)
        return core.update(ref) { record in record.window.reserveSend(upTo: limit) } ?? 0
    }

    func hasSendWindow(_ ref: StreamRef) -> Bool {
        (core.record(ref)?.window.sendWindow ?? 0) > 0
    }

    mutating func consumed(_ ref: StreamRef, bytes: Int, now: NIODeadline) -> ByteBuffer? {
        guard accountConsumed(ref, bytes: bytes) else { return nil }
        let roundTripTime = core.roundTripTime
        let maxWindow = configuration.maxStreamWindowSize
        let budget = core.windowGrowthBudget
        guard let grant = core.update(ref, { record in
            record.window.grant(now: now, roundTripTime: roundTripTime, maxWindow: maxWindow, growthBudget: budget)
        }) ?? nil else { return nil }
        if grant.growth > 0 { core.windowGrew(by: grant.growth) }
        var flags: YamuxHeader.Flags = []
        takeAck(ref, into: &flags)
        core.metrics.windowUpdatesSent += 1
        return frame(.windowUpdate, flags, streamID: UInt32(truncatingIfNeeded: ref.key), length: grant.delta)
    }

    mutating func acknowledgeFrame(_ ref: StreamRef) -> ByteBuffer? {
        var flags: YamuxHeader.Flags = []
        takeAck(ref, into: &flags)
        guard flags.contains(.ack) else { return nil }
        return frame(.windowUpdate, .ack, streamID: UInt32(truncatingIfNeeded: ref.key), length: 0)
    }

    mutating func goAway() -> ByteBuffer? {
        guard core.session.sendGoAway() else { return nil }
        return frame(.goAway, streamID: 0, length: YamuxHeader.GoAwayCode.normal.rawValue)
    }

    mutating func goAwayFrame(for error: Error) -> ByteBuffer? {
        guard core.session.sendGoAway() else { return nil }
        let code: YamuxHeader.GoAwayCode
        switch error as? MultiplexerError {
        case .keepAliveTimeout?, .idleTimeout?, .remoteGoAway?, .inputEnded(midFrame: false)?: code = .normal
        case .some: code = .protocolError; core.metrics.protocolErrors += 1
        case nil: code = .internalError
        }
        return frame(.goAway, streamID: 0, length: code.rawValue)
    }

    mutating func ping(now: NIODeadline) throws(MultiplexerError) -> OutboundPing {
        let id = nextPingID
        nextPingID &+= 1
        outstandingPings[id] = now
        return OutboundPing(id: id, frame: frame(.ping, .syn, streamID: 0, length: id))
    }

    mutating func startPing(now: NIODeadline) -> OutboundPing? {
        try? ping(now: now)
    }

    func isPingOutstanding(_ id: UInt32) -> Bool { outstandingPings[id] != nil }

    mutating func outputBecameWritable() -> ByteBuffer? {
        core.controlBacklog = 0
        guard let ping = pendingPingAnswer else { return nil }
        pendingPingAnswer = nil
        return frame(.ping, .ack, streamID: 0, length: ping)
    }
}
