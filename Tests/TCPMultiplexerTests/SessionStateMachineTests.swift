import NIOCore
import Testing
@testable import TCPMultiplexer

/// The session state machines and the stream window driven directly: no channel, no socket, no clock
/// (time is an argument).
let t0 = NIODeadline.uptimeNanoseconds(1_000_000_000)

/// Feeds `bytes` and collects every action, with consecutive payload pieces of a stream joined (so
/// actions compare equal however the bytes were split).
func drive<Machine: MultiplexerSessionStateMachine>(_ machine: inout Machine, _ bytes: ByteBuffer, now: NIODeadline = t0,
                                                    writable: Bool = true) throws(MultiplexerError) -> [MultiplexerInputAction] {
    machine.receive(bytes)
    var actions: [MultiplexerInputAction] = []
    while let action = try machine.nextInputAction(now: now, outputWritable: writable) {
        if case .deliver(let ref, var more) = action, case .deliver(let last, var joined)? = actions.last, last == ref {
            joined.writeBuffer(&more)
            actions[actions.count - 1] = .deliver(ref, joined)
        } else {
            actions.append(action)
        }
    }
    return actions
}

/// The stream reference of the first `.accept` among `actions`.
func acceptedRef(_ actions: [MultiplexerInputAction]) throws -> StreamRef {
    for case .accept(let ref, _, _) in actions { return ref }
    Issue.record("no stream accepted in \(actions)")
    throw MultiplexerError.sessionClosed
}

func yamuxMachine(_ role: MultiplexerRole, accepts: Bool = true,
                  _ configure: (inout MultiplexerConfiguration) -> Void = { _ in }) -> YamuxSessionStateMachine {
    var configuration = quietConfiguration(.yamux)
    configure(&configuration)
    return YamuxSessionStateMachine(role: role, configuration: configuration, acceptsInboundStreams: accepts)
}

func thaliMachine(_ role: MultiplexerRole, accepts: Bool = true,
                  _ configure: (inout MultiplexerConfiguration) -> Void = { _ in }) -> ThaliMultiplexSessionStateMachine {
    var configuration = quietConfiguration(.thaliMultiplex)
    configure(&configuration)
    return ThaliMultiplexSessionStateMachine(role: role, configuration: configuration, acceptsInboundStreams: accepts)
}

func thali(_ flag: ThaliMultiplexHeader.Flag, id: UInt64, body: [UInt8] = []) -> ByteBuffer {
    var buffer = ByteBuffer()
    ThaliMultiplexHeader(streamID: id, flag: flag, length: body.count).write(to: &buffer)
    buffer.writeBytes(body)
    return buffer
}

func joined(_ frames: OutboundFrames) -> ByteBuffer {
    var buffer = ByteBuffer()
    for var piece in frames.buffers { buffer.writeBuffer(&piece) }
    return buffer
}

@Suite(.timeLimit(.minutes(2))) struct StreamWindowTests {
    @Test func sendingStopsAtTheWindowAndAGrantReleasesIt() throws {
        var window = StreamWindow(now: t0)
        #expect(window.reserveSend(upTo: 200_000) == 200_000)
        #expect(window.reserveSend(upTo: 200_000) == YamuxHeader.initialWindowSize - 200_000)
        #expect(window.reserveSend(upTo: 1) == 0)
        try window.peerGranted(10, streamID: 1)
        #expect(window.reserveSend(upTo: 100) == 10)
        try window.peerGranted(UInt32.max, streamID: 1)
        #expect(throws: MultiplexerError.sendWindowOverflow(streamID: 1)) { try window.peerGranted(1, streamID: 1) }
    }

    @Test func framesBeyondTheReceiveWindowAreRefused() throws {
        var window = StreamWindow(now: t0)
        try window.checkFrame(length: YamuxHeader.initialWindowSize, streamID: 3)
        window.receiveFrame(length: YamuxHeader.initialWindowSize - 10)
        #expect(throws: MultiplexerError.receiveWindowExceeded(streamID: 3, window: 10, length: 11)) {
            try window.checkFrame(length: 11, streamID: 3)
        }
    }

    @Test func anUpdateIsDueOnceHalfTheTargetWasReadAndGrowsOnlyWhenFastAndWithinBudget() {
        let initial = YamuxHeader.initialWindowSize
        let rtt = TimeAmount.milliseconds(10)
        var window = StreamWindow(now: t0)
        window.receiveFrame(length: initial)
        window.buffer(initial)
        window.consumed(initial / 2 - 1)
        #expect(window.grant(now: t0, roundTripTime: rtt, maxWindow: 1 << 20, growthBudget: .max) == nil)
        window.consumed(1)
        // Within four round trips of the stream's start: the window limits the stream, so it doubles.
        let grant = window.grant(now: t0 + .milliseconds(39), roundTripTime: rtt, maxWindow: 1 << 20, growthBudget: .max)
        #expect(grant == StreamWindow.Grant(delta: UInt32(2 * initial - initial / 2), growth: initial))
        #expect(window.receiveWindowTarget == 2 * initial && window.receiveWindow + window.buffered == 2 * initial)

        // A slow reader (more than four round trips) gets its window back but no growth.
        window.receiveFrame(length: window.receiveWindow)
        window.buffer(2 * initial - initial / 2)
        window.consumed(window.buffered)
        let slow = window.grant(now: t0 + .seconds(1), roundTripTime: rtt, maxWindow: 1 << 20, growthBudget: .max)
        #expect(slow?.growth == 0 && window.receiveWindowTarget == 2 * initial)

        // Growth stops at the budget and at the cap.
        window.receiveFrame(length: window.receiveWindow)
        window.consumed(0)
        let starved = window.grant(now: t0 + .seconds(1), roundTripTime: rtt, maxWindow: 1 << 20, growthBudget: initial)
        #expect(starved?.growth == 0 && window.receiveWindowTarget == 2 * initial)
        window.receiveFrame(length: window.receiveWindow)
        for _ in 0..<4 {
            window.receiveFrame(length: window.receiveWindow)
            _ = window.grant(now: t0 + .seconds(1), roundTripTime: rtt, maxWindow: 1 << 20, growthBudget: .max)
        }
        #expect(window.receiveWindowTarget == 1 << 20)
        // Without a measured round trip there is nothing to compare with: no growth.
        var unmeasured = StreamWindow(now: t0)
        unmeasured.receiveFrame(length: initial)
        #expect(unmeasured.grant(now: t0, roundTripTime: nil, maxWindow: 1 << 20, growthBudget: .max)?.growth == 0)
    }
}

@Suite(.timeLimit(.minutes(2))) struct YamuxSessionStateMachineTests {
    @Test func windowExhaustionStallsAStreamUntilThePeerUpdatesIt() throws {
        var machine = yamuxMachine(.client)
        let opened = try machine.openStream(name: nil, now: t0)
        #expect(hex(opened.frame) == hex(yamux(.windowUpdate, .syn, id: 1, length: 0)))
        let wholeWindow = machine.reserveSend(opened.ref, upTo: 1 << 20)
        let beyond = machine.reserveSend(opened.ref, upTo: 1)
        #expect(wholeWindow == YamuxHeader.initialWindowSize && beyond == 0)
        #expect(!machine.hasSendWindow(opened.ref))
        let actions = try drive(&machine, yamux(.windowUpdate, .ack, id: 1, length: 1000))
        #expect(actions == [.sendWindowOpened(opened.ref)])
        #expect(machine.hasSendWindow(opened.ref))
        let granted = machine.reserveSend(opened.ref, upTo: 5000)
        #expect(granted == 1000)
        let frames = machine.dataFrames(opened.ref, payload: ByteBuffer(string: "abc"), fin: true)
        #expect(hex(joined(frames)) == hex(yamux(.data, .fin, id: 1, length: 3, payload: Array("abc".utf8))))
        let finished = machine.sentFIN(opened.ref)
        #expect(!finished)  // the peer may still send
    }

    @Test func thePeerOverrunningTheWindowIsAProtocolErrorWhereverTheBytesAreCut() throws {
        var wire = yamux(.windowUpdate, .syn, id: 1, length: 0)
        let window = YamuxHeader.initialWindowSize
        var data = yamux(.data, id: 1, length: UInt32(window), payload: Array(repeating: 1, count: window))
        var overrun = yamux(.data, id: 1, length: 1, payload: [1])
        wire.writeBuffer(&data)
        wire.writeBuffer(&overrun)
        // Every cut leaves at least the overrunning frame's header incomplete in the first piece.
        for cut in [1, 11, 12, 13, 200, wire.readableBytes - 13, wire.readableBytes - 5] {
            var machine = yamuxMachine(.server)
            let first = wire.getSlice(at: 0, length: cut)!
            let second = wire.getSlice(at: cut, length: wire.readableBytes - cut)!
            _ = try drive(&machine, first)
            #expect(throws: MultiplexerError.receiveWindowExceeded(streamID: 1, window: 0, length: 1), "cut at \(cut)") {
                try drive(&machine, second)
            }
            let ref = try #require(machine.core.ref(forKey: 1), "cut at \(cut)")
            #expect(machine.window(ref)?.buffered == window, "cut at \(cut)")
            let goAway = machine.goAwayFrame(for: MultiplexerError.receiveWindowExceeded(streamID: 1, window: 0, length: 1))
            #expect(goAway.map(hex) == hex(yamux(.goAway, id: 0, length: 1)))
        }
    }

    @Test func bytesCutAnywhereGiveTheSameActions() throws {
        var wire = ByteBuffer()
        for var frame in [yamux(.windowUpdate, .syn, id: 1, length: 0), yamux(.ping, .syn, id: 0, length: 9),
                          yamux(.data, id: 1, length: 5, payload: Array("hello".utf8)),
                          yamux(.data, .fin, id: 1, length: 3, payload: Array("end".utf8)),
                          yamux(.windowUpdate, id: 1, length: 77), yamux(.goAway, id: 0, length: 0)] {
            wire.writeBuffer(&frame)
        }
        var whole = yamuxMachine(.server)
        let expected = try drive(&whole, wire)
        let ref = try acceptedRef(expected)
        #expect(expected == [.accept(ref, streamID: 1, name: nil), .write(yamux(.ping, .ack, id: 0, length: 9)),
                             .deliver(ref, ByteBuffer(string: "helloend")), .receiveEnd(ref, finished: false),
                             .sendWindowOpened(ref)])
        for cut in 1..<wire.readableBytes {
            var machine = yamuxMachine(.server)
            var actions = try drive(&machine, wire.getSlice(at: 0, length: cut)!)
            actions += try drive(&machine, wire.getSlice(at: cut, length: wire.readableBytes - cut)!)
            // Joining the two halves' deliveries, as `drive` joins within one feed.
            var merged: [MultiplexerInputAction] = []
            for action in actions {
                if case .deliver(let r, var more) = action, case .deliver(_, var text)? = merged.last {
                    text.writeBuffer(&more)
                    merged[merged.count - 1] = .deliver(r, text)
                } else {
                    merged.append(action)
                }
            }
            #expect(merged == expected, "cut at \(cut)")
        }
        // One byte at a time.
        var machine = yamuxMachine(.server)
        var actions: [MultiplexerInputAction] = []
        for index in 0..<wire.readableBytes { actions += try drive(&machine, wire.getSlice(at: index, length: 1)!) }
        #expect(actions.filter { if case .deliver = $0 { return false } else { return true } }.count == expected.count - 1)
        #expect(machine.window(ref)?.buffered == 8)
    }

    @Test func updatesAreDueAtHalfTheWindowAndAutoTuningGrowsItUpToTheCap() throws {
        var machine = yamuxMachine(.server) { $0.maxStreamWindowSize = 1 << 20 }
        let ping = try machine.ping(now: t0)
        let result1 = try drive(&machine, yamux(.ping, .ack, id: 0, length: ping.id), now: t0 + .milliseconds(10))
        #expect(result1 == [.pingAnswered(id: ping.id, roundTripTime: .milliseconds(10))])
        let ref = try acceptedRef(try drive(&machine, yamux(.windowUpdate, .syn, id: 1, length: 0)))
        let ack = machine.inboundStreamInitialized(ref, succeeded: true)
        #expect(ack.map(hex) == hex(yamux(.windowUpdate, .ack, id: 1, length: 0)))
        var now = t0 + .milliseconds(20)
        var updates: [UInt32] = []
        for _ in 0..<6 {
            let window = try #require(machine.window(ref)).receiveWindow
            _ = try drive(&machine, yamux(.data, id: 1, length: UInt32(window), payload: Array(repeating: 0, count: window)))
            let early = machine.consumed(ref, bytes: window / 2 - 1, now: now)
            #expect(early == nil)  // not yet half
            let due = machine.consumed(ref, bytes: window - window / 2 + 1, now: now)
            var update = try #require(due)
            let header = try #require(try YamuxHeader.read(from: &update))
            updates.append(header.length)
            now = now + .milliseconds(5)  // each window turned over within four round trips
        }
        // 256 KiB, doubled to 512 KiB, then 1 MiB (the cap), where it stays.
        let expected: [UInt32] = [512 << 10, 1 << 20, 1 << 20, 1 << 20, 1 << 20, 1 << 20]
        #expect(updates == expected)
        #expect(machine.metrics.windowGrowths == 2 && machine.metrics.windowUpdatesSent == 6)
        #expect(machine.window(ref)?.receiveWindowTarget == 1 << 20)
    }

    @Test func windowsStopGrowingAtTheSessionReceiveBuffer() throws {
        var machine = yamuxMachine(.server) { $0.maxSessionReceiveBuffer = 600 << 10 }
        let ping = try machine.ping(now: t0)
        _ = try drive(&machine, yamux(.ping, .ack, id: 0, length: ping.id), now: t0 + .milliseconds(10))
        let ref = try acceptedRef(try drive(&machine, yamux(.windowUpdate, .syn, id: 1, length: 0)))
        for _ in 0..<3 {
            let window = try #require(machine.window(ref)).receiveWindow
            _ = try drive(&machine, yamux(.data, id: 1, length: UInt32(window), payload: Array(repeating: 0, count: window)))
            _ = machine.consumed(ref, bytes: window, now: t0 + .milliseconds(11))
        }
        // 256 KiB + 256 KiB fits 600 KiB; another 512 KiB does not.
        #expect(machine.window(ref)?.receiveWindowTarget == 512 << 10)
    }

    @Test func aReaderThatStopsGetsNoWindowUpdate() throws {
        var machine = yamuxMachine(.server)
        let ref = try acceptedRef(try drive(&machine, yamux(.windowUpdate, .syn, id: 1, length: 0)))
        _ = try drive(&machine, yamux(.data, id: 1, length: 100_000, payload: Array(repeating: 0, count: 100_000)))
        #expect(machine.bufferedTotal == 100_000)
        let result2 = machine.consumed(ref, bytes: 0, now: t0)
        #expect(result2 == nil)
        #expect(machine.window(ref)?.receiveWindow == YamuxHeader.initialWindowSize - 100_000)
    }

    @Test func inboundStreamsBeyondTheLimitsAreRefusedAndLocalOpensFail() throws {
        var machine = yamuxMachine(.server) { $0.maxConcurrentStreams = 2; $0.acceptBacklog = 1 }
        let first = try acceptedRef(try drive(&machine, yamux(.windowUpdate, .syn, id: 1, length: 0)))
        // 1 is still initializing: 3 is over the backlog.
        let result3 = try drive(&machine, yamux(.windowUpdate, .syn, id: 3, length: 0))
        #expect(result3 == [.write(yamux(.windowUpdate, .rst, id: 3, length: 0))])
        _ = machine.inboundStreamInitialized(first, succeeded: true)
        _ = try acceptedRef(try drive(&machine, yamux(.windowUpdate, .syn, id: 5, length: 0)))
        // Two streams open: 7 is over the limit, and so is a local open.
        let result4 = try drive(&machine, yamux(.windowUpdate, .syn, id: 7, length: 0))
        #expect(result4 == [.write(yamux(.windowUpdate, .rst, id: 7, length: 0))])
        #expect(throws: MultiplexerError.tooManyStreams(limit: 2)) { try machine.openStream(name: nil, now: t0) }
        #expect(machine.metrics.streamsRefused == 2 && machine.metrics.streamsAccepted == 2)
        // Without an inbound initializer every stream is refused.
        var refusing = yamuxMachine(.server, accepts: false)
        let result5 = try drive(&refusing, yamux(.windowUpdate, .syn, id: 1, length: 0))
        #expect(result5 == [.write(yamux(.windowUpdate, .rst, id: 1, length: 0))])
    }

    @Test func protocolViolationsAreTypedErrors() throws {
        var server = yamuxMachine(.server)
        #expect(throws: MultiplexerError.invalidStreamID(2)) { try drive(&server, yamux(.windowUpdate, .syn, id: 2, length: 0)) }
        var other = yamuxMachine(.server)
        _ = try drive(&other, yamux(.windowUpdate, .syn, id: 1, length: 0))
        #expect(throws: MultiplexerError.duplicateStream(1)) { try drive(&other, yamux(.windowUpdate, .syn, id: 1, length: 0)) }
        var third = yamuxMachine(.server)
        #expect(throws: MultiplexerError.remoteGoAway(code: 2)) { try drive(&third, yamux(.goAway, id: 0, length: 2)) }
        var small = yamuxMachine(.server) { $0.maxStreamWindowSize = 1000 }
        #expect(throws: MultiplexerError.frameTooLarge(length: 1001, limit: 1000)) {
            try drive(&small, yamux(.data, id: 1, length: 1001))
        }
    }

    @Test func dataAfterThePeersFINResetsOnlyThatStream() throws {
        var machine = yamuxMachine(.server)
        let ref = try acceptedRef(try drive(&machine, yamux(.windowUpdate, [.syn, .fin], id: 1, length: 0)))
        let actions = try drive(&machine, yamux(.data, id: 1, length: 2, payload: [1, 2]))
        let error = MultiplexerError.unexpectedFrame(streamID: 1, reason: "data after the peer's FIN")
        let expected: [MultiplexerInputAction] = [.resetStream(ref, message: nil, error: error)]
        #expect(actions == expected)
        let reset = machine.resetStream(ref, message: nil, outputWritable: true)
        #expect(reset.map(hex) == hex(yamux(.windowUpdate, .rst, id: 1, length: 0)))
        machine.streamClosed(ref, discardedBytes: 0)
        #expect(machine.streamCount == 0 && machine.metrics.resetsSent == 1)
        // Late frames for the gone stream are dropped.
        let result6 = try drive(&machine, yamux(.data, id: 1, length: 2, payload: [1, 2]))
        #expect(result6.isEmpty)
    }

    @Test func pingAnswersCoalesceAndRefusalFloodsEndTheSessionWhileTheChannelIsBlocked() throws {
        var machine = yamuxMachine(.server, accepts: false)
        var pings = ByteBuffer()
        for id in 1...100 { var ping = yamux(.ping, .syn, id: 0, length: UInt32(id)); pings.writeBuffer(&ping) }
        let result7 = try drive(&machine, pings, writable: false)
        #expect(result7.isEmpty)
        let answer = machine.outputBecameWritable()
        let second = machine.outputBecameWritable()
        #expect(answer.map(hex) == hex(yamux(.ping, .ack, id: 0, length: 100)))
        #expect(second == nil)
        var opens = ByteBuffer()
        for id in stride(from: UInt32(1), to: 20_000, by: 2) {
            var open = yamux(.windowUpdate, .syn, id: id, length: 0)
            opens.writeBuffer(&open)
        }
        #expect(throws: MultiplexerError.controlFrameBacklog(limit: MultiplexerHandler.maxControlBacklog)) {
            try drive(&machine, opens, writable: false)
        }
    }

    /// Each refusal counts against the backlog by the reset frame's own size in its framing: 12 bytes in
    /// yamux (no message), the varint header and "refused" in `thali-multiplex`.
    @Test func refusalsCountTheirOwnFramingsBytesAgainstTheBacklog() throws {
        // The same stream id each time (a refused stream never enters the table), so every reset has one size.
        func refusalsBeforeTheLimit<Machine: MultiplexerSessionStateMachine>(_ machine: inout Machine, _ open: ByteBuffer) -> Int? {
            for index in 0..<20_000 {
                do {
                    _ = try drive(&machine, open, writable: false)
                } catch {
                    return error == .controlFrameBacklog(limit: MultiplexerHandler.maxControlBacklog) ? index : nil
                }
            }
            return nil
        }
        var yamuxRefusing = yamuxMachine(.server, accepts: false)
        let yamuxReset = yamuxRefusing.resetFrame(streamID: 1, locallyInitiated: false, message: "refused").readableBytes
        let yamuxCount = refusalsBeforeTheLimit(&yamuxRefusing, yamux(.windowUpdate, .syn, id: 1, length: 0))
        var thaliRefusing = thaliMachine(.server, accepts: false)
        let thaliReset = thaliRefusing.resetFrame(streamID: 1, locallyInitiated: false, message: "refused").readableBytes
        let thaliCount = refusalsBeforeTheLimit(&thaliRefusing, thali(.open, id: 1))
        #expect(yamuxReset == YamuxHeader.size)
        #expect(thaliReset == 2 + "refused".utf8.count)
        // The backlog ends the session on the refusal that takes it past the limit.
        #expect(yamuxCount == MultiplexerHandler.maxControlBacklog / yamuxReset)
        #expect(thaliCount == MultiplexerHandler.maxControlBacklog / thaliReset)
    }

    @Test func keepalivePingsAreTrackedUntilAnswered() throws {
        var machine = yamuxMachine(.client) { $0.keepAliveInterval = .seconds(30) }
        #expect(machine.keepAliveInterval == .seconds(30))
        let start = machine.startPing(now: t0)
        let second = try machine.ping(now: t0 + .seconds(30))
        #expect(start?.id == 1 && second.id == 2 && hex(second.frame) == hex(yamux(.ping, .syn, id: 0, length: 2)))
        _ = try drive(&machine, yamux(.ping, .ack, id: 0, length: 1), now: t0 + .milliseconds(3))
        #expect(!machine.isPingOutstanding(1) && machine.isPingOutstanding(2))
        #expect(machine.core.roundTripTime == .milliseconds(3))
    }

    @Test func goAwayRefusesNewStreamsInTheClosedDirection() throws {
        var machine = yamuxMachine(.server)
        _ = try drive(&machine, yamux(.goAway, id: 0, length: 0))
        #expect(throws: MultiplexerError.goingAway) { try machine.openStream(name: nil, now: t0) }
        #expect(machine.metrics.goAwaysReceived == 1)
        var local = yamuxMachine(.server)
        let goAway = local.goAway()
        let again = local.goAway()
        #expect(goAway.map(hex) == hex(yamux(.goAway, id: 0, length: 0)))
        #expect(again == nil)
        let result8 = try drive(&local, yamux(.windowUpdate, .syn, id: 1, length: 0))
        #expect(result8 == [.write(yamux(.windowUpdate, .rst, id: 1, length: 0))])
    }
}

@Suite(.timeLimit(.minutes(2))) struct ThaliMultiplexSessionStateMachineTests {
    @Test func aStreamThatOverrunsItsBufferIsResetAndTheSessionContinues() throws {
        var machine = thaliMachine(.server) { $0.maxStreamReceiveBuffer = 1000 }
        let ref = try acceptedRef(try drive(&machine, thali(.open, id: 3)))
        let result9 = try drive(&machine, thali(.messageInitiator, id: 3, body: Array(repeating: 1, count: 600)))
        #expect(result9 == [.deliver(ref, ByteBuffer(repeating: 1, count: 600))])
        let overflow = try drive(&machine, thali(.messageInitiator, id: 3, body: Array(repeating: 2, count: 600)))
        let error = MultiplexerError.receiveBufferOverflow(streamID: 3, limit: 1000)
        let expected: [MultiplexerInputAction] = [.resetStream(ref, message: "receive buffer overflow", error: error)]
        #expect(overflow == expected)
        let reset = machine.resetStream(ref, message: "receive buffer overflow", outputWritable: true)
        #expect(reset.map(hex) == hex(thali(.resetReceiver, id: 3, body: Array("receive buffer overflow".utf8))))
        machine.streamClosed(ref, discardedBytes: 600)
        #expect(machine.bufferedTotal == 0 && machine.metrics.overflowResets == 1 && !machine.isClosed)
    }

    @Test func theSessionBufferBoundsAllStreamsTogether() throws {
        var machine = thaliMachine(.server) { $0.maxSessionReceiveBuffer = 1000 }
        let first = try acceptedRef(try drive(&machine, thali(.open, id: 1)))
        let second = try acceptedRef(try drive(&machine, thali(.open, id: 2)))
        _ = try drive(&machine, thali(.messageInitiator, id: 1, body: Array(repeating: 1, count: 600)))
        let result10 = try drive(&machine, thali(.messageInitiator, id: 2, body: Array(repeating: 1, count: 600)))
        let error = MultiplexerError.receiveBufferOverflow(streamID: 2, limit: 4 << 20)
        let expected: [MultiplexerInputAction] = [.resetStream(second, message: "receive buffer overflow", error: error)]
        #expect(result10 == expected)
        // Reading frees the budget.
        let result11 = machine.consumed(first, bytes: 600, now: t0)
        #expect(result11 == nil)
        let result12 = try drive(&machine, thali(.messageInitiator, id: 1, body: Array(repeating: 1, count: 600)))
        #expect(result12 == [.deliver(first, ByteBuffer(repeating: 1, count: 600))])
    }

    @Test func endedIDsWaitInQuarantineUntilThePeersResetOrTheBound() throws {
        var machine = thaliMachine(.client) { $0.maxQuarantinedStreamIDs = 2 }
        let zero = try machine.openStream(name: "a", now: t0)
        #expect(zero.streamID == 0 && hex(zero.frame) == hex(thali(.open, id: 0, body: Array("a".utf8))))
        let result13 = machine.resetStream(zero.ref, message: nil, outputWritable: true)
        #expect(result13 != nil)
        machine.streamClosed(zero.ref, discardedBytes: 0)
        // The peer may still send for 0: a late message is dropped, and 0 is not reused yet.
        let result14 = try drive(&machine, thali(.messageReceiver, id: 0, body: [1]))
        #expect(result14.isEmpty)
        let result15 = try machine.openStream(name: nil, now: t0).streamID
        #expect(result15 == 1)
        // The peer's reset for 0 releases it.
        let result16 = try drive(&machine, thali(.resetReceiver, id: 0))
        #expect(result16.isEmpty)
        let again = try machine.openStream(name: nil, now: t0)
        #expect(again.streamID == 0)
        // At most two ids wait: the oldest is reused first.
        for _ in 0..<3 {
            let opened = try machine.openStream(name: nil, now: t0)
            _ = machine.resetStream(opened.ref, message: nil, outputWritable: true)
            machine.streamClosed(opened.ref, discardedBytes: 0)
        }
        let result17 = try machine.openStream(name: nil, now: t0).streamID
        #expect(result17 == 2)
    }

    @Test func framesBeyondTheirLimitsEndTheSession() throws {
        var machine = thaliMachine(.server) { $0.maxFrameSize = 100 }
        #expect(throws: MultiplexerError.frameTooLarge(length: 101, limit: 100)) {
            try drive(&machine, thali(.messageInitiator, id: 1, body: Array(repeating: 0, count: 101)))
        }
        var other = thaliMachine(.server)
        _ = try drive(&other, thali(.open, id: 0))
        #expect(throws: MultiplexerError.duplicateStream(0)) { try drive(&other, thali(.open, id: 0)) }
        var flags = thaliMachine(.server)
        #expect(throws: MultiplexerError.unknownFlag(7)) { try drive(&flags, bytes(hex: "0700")) }
    }

    @Test func closeAndDataFramesMatchTheReferenceEncoding() throws {
        var machine = thaliMachine(.client)
        let opened = try machine.openStream(name: nil, now: t0)
        let frames = machine.dataFrames(opened.ref, payload: ByteBuffer(string: "hi"), fin: true)
        #expect(frames.buffers.count == 3)
        #expect(hex(joined(frames)) == hex(thali(.messageInitiator, id: 0, body: Array("hi".utf8))) + hex(thali(.closeInitiator, id: 0)))
        let finished = machine.sentFIN(opened.ref)
        #expect(!finished)
        let actions = try drive(&machine, thali(.closeReceiver, id: 0))
        #expect(actions == [.receiveEnd(opened.ref, finished: true)])
        #expect(machine.streamCount == 0)
        #expect(throws: MultiplexerError.unsupported("ping in thali-multiplex")) { try machine.ping(now: t0) }
        let goAway = machine.goAway()
        let startPing = machine.startPing(now: t0)
        #expect(goAway == nil && startPing == nil)
    }
}
