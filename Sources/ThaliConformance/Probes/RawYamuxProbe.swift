import NIOCore
import NIOPosix
import TCPMultiplexer
import ThaliBeacons
import ThaliPSKTLS
import ThaliSSDP

/// Yamux written by hand inside an authenticated PSK-TLS session: the suite sends frames a correct
/// session never would (a stream of the wrong parity, data after FIN, a window overrun) and reads the
/// implementation's frames one by one (spec/multiplexer.md §2). The suite is the client: its streams are
/// odd.
struct RawYamuxSession {
    /// What came from the implementation.
    enum Input: Sendable, Equatable {
        /// A frame (a data frame's payload is counted, not kept).
        case frame(YamuxHeader)
        /// The connection ended cleanly, or with bytes that break yamux framing.
        case ended(String)
        /// The connection failed (a reset): what the implementation sent last may be lost with it.
        case failed(String)
        /// Nothing came before the wait's deadline.
        case timedOut
        /// A deadline of an earlier wait (ignored).
        case deadline(Int)
    }

    /// The largest data payload read from the implementation in one frame.
    static let maxDataLength = RawYamuxReader.maxDataLength

    /// The most frames read from the implementation in one session.
    static let maxFrames = RawYamuxReader.maxFrames

    private var inputs: AsyncStream<Input>.AsyncIterator
    private let sink: AsyncStream<Input>.Continuation
    private let outbound: NIOAsyncChannelOutboundWriter<ByteBuffer>
    private let eventLoop: any EventLoop
    private var deadlines = 0

    /// Connects with `identity` and `psk`, runs `body` on the session, and closes it.
    static func run<Result: Sendable>(host: String, port: Int, identity: String, psk: [UInt8], group: any EventLoopGroup,
                                      _ body: (inout RawYamuxSession) async throws -> Result) async throws -> Result {
        let connection = try await PSKTLSClient.connect(host: host, port: port, identity: identity, psk: psk, eventLoopGroup: group)
        return try await connection.executeThenClose { inbound, outbound in
            try await run(inbound, outbound, eventLoop: group.next(), body)
        }
    }

    /// Connects over plain TCP (a bare yamux server: the cases calibrated against another
    /// implementation), runs `body` on the session, and closes it.
    static func run<Result: Sendable>(plainHost host: String, port: Int, group: any EventLoopGroup,
                                      _ body: (inout RawYamuxSession) async throws -> Result) async throws -> Result {
        let connection = try await ClientBootstrap(group: group).connect(host: host, port: port) { channel in
            channel.eventLoop.makeCompletedFuture { try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel) }
        }
        return try await connection.executeThenClose { inbound, outbound in
            try await run(inbound, outbound, eventLoop: connection.channel.eventLoop, body)
        }
    }

    private static func run<Result: Sendable>(_ inbound: NIOAsyncChannelInboundStream<ByteBuffer>, _ outbound: NIOAsyncChannelOutboundWriter<ByteBuffer>,
                                              eventLoop: any EventLoop, _ body: (inout RawYamuxSession) async throws -> Result) async throws -> Result {
        let (inputs, sink) = AsyncStream.makeStream(of: Input.self)
        return try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { await Self.pump(inbound, into: sink) }
            defer { tasks.cancelAll() }
            var session = RawYamuxSession(inputs: inputs.makeAsyncIterator(), sink: sink, outbound: outbound, eventLoop: eventLoop)
            return try await body(&session)
        }
    }

    /// ``run(host:port:identity:psk:group:_:)`` in a session keyed by `match`, at `location`.
    static func run<Result: Sendable>(keyedBy match: BeaconMatch, at location: BeaconLocation, group: any EventLoopGroup,
                                      _ body: (inout RawYamuxSession) async throws -> Result) async throws -> Result {
        try await run(host: location.host, port: location.port, identity: match.pskIdentity, psk: match.psk, group: group, body)
    }

    /// Decodes the implementation's bytes into frames (``RawYamuxReader``); answers nothing itself.
    private static func pump(_ inbound: NIOAsyncChannelInboundStream<ByteBuffer>, into sink: AsyncStream<Input>.Continuation) async {
        var reader = RawYamuxReader()
        func yield(_ output: RawYamuxReader.Output) {
            switch output {
            case .frame(let header): sink.yield(.frame(header))
            case .ended(let reason): sink.yield(.ended(reason))
            }
        }
        do {
            for try await bytes in inbound {
                reader.read(bytes).forEach(yield)
                if reader.ended != nil { break }
            }
            if let end = reader.endOfInput() { yield(end) }
        } catch {
            if case .ended(let reason)? = reader.endOfInput("\(error)") { sink.yield(.failed(reason)) }
        }
        sink.finish()
    }

    private init(inputs: AsyncStream<Input>.AsyncIterator, sink: AsyncStream<Input>.Continuation,
                 outbound: NIOAsyncChannelOutboundWriter<ByteBuffer>, eventLoop: any EventLoop) {
        self.inputs = inputs
        self.sink = sink
        self.outbound = outbound
        self.eventLoop = eventLoop
    }

    /// Writes `frames` in one write (so the implementation reads them together), each a header and, for
    /// data, `payloads[i]` bytes of zeros.
    func send(_ frames: [(YamuxHeader, payload: Int)]) async throws {
        var buffer = ByteBuffer()
        for (header, payload) in frames {
            header.write(to: &buffer)
            buffer.writeRepeatingByte(0, count: payload)
        }
        try await outbound.write(buffer)
    }

    /// Writes a data frame on `streamID` carrying `payload`.
    func sendData(_ payload: ByteBuffer, streamID: UInt32) async throws {
        var buffer = ByteBuffer()
        YamuxHeader(type: .data, streamID: streamID, length: UInt32(payload.readableBytes)).write(to: &buffer)
        buffer.writeImmutableBuffer(payload)
        try await outbound.write(buffer)
    }

    /// Writes `count` zero bytes: the payload of a data frame whose header went before.
    func sendPayload(_ count: Int) async throws {
        try await outbound.write(ByteBuffer(repeating: 0, count: count))
    }

    /// The implementation's next frame, or the end, or `.timedOut` after `timeout`. Its pings are answered
    /// on the way (a session that measures its round trip must not wait on us) and not returned.
    mutating func next(within timeout: TimeAmount) async throws -> Input {
        deadlines += 1
        let deadline = deadlines, sink = self.sink
        let scheduled = eventLoop.scheduleTask(in: timeout) { sink.yield(.deadline(deadline)) }
        defer { scheduled.cancel() }
        while let input = await inputs.next() {
            switch input {
            case .deadline(let fired):
                if fired == deadline { return .timedOut }
            case .frame(let header) where header.type == .ping && header.flags.contains(.syn):
                try await send([(YamuxHeader(type: .ping, flags: .ack, streamID: 0, length: header.length), 0)])
            default:
                return input
            }
        }
        return .ended("the connection ended")
    }

    /// Reads until a frame satisfies `wanted`, the session ends, or `timeout` passes; returns what ended
    /// the wait and the frames read before it.
    mutating func waitFor(within timeout: TimeAmount, _ wanted: (YamuxHeader) -> Bool) async throws -> (Input, [YamuxHeader]) {
        let deadline = NIODeadline.now() + timeout
        var seen: [YamuxHeader] = []
        while true {
            let input = try await next(within: max(.zero, deadline - .now()))
            guard case .frame(let header) = input, !wanted(header) else { return (input, seen) }
            seen.append(header)
        }
    }

    /// What a fenced wait found: the wanted frame or the end (`input`), the frames before it, and whether
    /// the fence's Ping was answered first.
    struct FencedWait {
        var input: Input
        var before: [YamuxHeader]
        /// Whether the Ping was sent (nothing came within the delay).
        var fenceSent: Bool
        var fenceAnswered: Bool
    }

    /// Reads until a frame satisfies `wanted`, the session ends, or `timeout` passes; when nothing came
    /// within `delay`, sends a Ping with SYN and `fence` behind the frames already sent. Once the Ping is
    /// answered the implementation has read everything before it: the wait goes on for `grace` only (an
    /// answer sent from another task may trail its Ping answer), so a session that ignores the frames is
    /// judged in about a round trip and `delay`, not a whole step timeout. The delay first: a Ping
    /// written after an implementation ended the session would make its kernel reset the connection,
    /// which can drop the GoAway it sent before on our side.
    mutating func waitFor(within timeout: TimeAmount, fence: UInt32, delay: TimeAmount, grace: TimeAmount,
                          _ wanted: (YamuxHeader) -> Bool) async throws -> FencedWait {
        let started = NIODeadline.now()
        let (early, before) = try await waitFor(within: min(delay, timeout), wanted)
        guard early == .timedOut else { return FencedWait(input: early, before: before, fenceSent: false, fenceAnswered: false) }
        do {
            try await send([(YamuxHeader(type: .ping, flags: .syn, streamID: 0, length: fence), 0)])
        } catch {
            // It may have answered the frames already and closed (a GoAway, then the end): what it sent is
            // still read below, and the end with it.
        }
        var deadline = started + timeout
        var wait = FencedWait(input: .timedOut, before: before, fenceSent: true, fenceAnswered: false)
        while true {
            let input = try await next(within: max(.zero, deadline - .now()))
            guard case .frame(let header) = input, !wanted(header) else {
                wait.input = input
                return wait
            }
            if !wait.fenceAnswered, header.type == .ping, header.flags.contains(.ack), header.length == fence {
                wait.fenceAnswered = true
                deadline = min(deadline, .now() + grace)
                continue
            }
            wait.before.append(header)
        }
    }
}

/// The implementation's bytes on a raw yamux session, as the suite reads them: cut into frame headers (a
/// data frame's payload is counted, not kept), a data payload of at most `maxDataLength` bytes, at most
/// `maxFrames` frames; the first bytes that break yamux framing, or one frame too many, end the session.
/// However the bytes were split into reads, the same frames and the same end come out.
///
/// The bytes are the implementation's: anything at all. `RawYamuxSession` feeds it from the connection;
/// the `raw-yamux-input` fuzz harness feeds it directly.
package struct RawYamuxReader: Sendable {
    /// What the bytes read so far hold.
    package enum Output: Sendable, Equatable {
        /// A frame header.
        case frame(YamuxHeader)
        /// The session ended, with the reason in words; nothing follows it.
        case ended(String)
    }

    /// The largest data payload read in one frame (the implementation's own frames are a delivery
    /// sender's: hello and the like, and its data within our window).
    package static let maxDataLength = 1 << 20

    /// The most frames read in one session: the pump does not wait for the cases to consume them, so an
    /// implementation that floods small frames must not grow the queue without bound. Past it the
    /// session ends (no case needs more than a few dozen).
    package static let maxFrames = 10_000

    /// This reader's frame limit.
    package let maxFrames: Int
    private var decoder: YamuxFrameDecoder
    /// Frame headers read.
    package private(set) var frames = 0
    /// Data payload bytes read (counted, not kept).
    package private(set) var payloadBytes = 0
    /// Why the session ended, nil while it goes on.
    package private(set) var ended: String?

    /// A reader with the session's limits, or smaller ones.
    package init(maxDataLength: Int = RawYamuxReader.maxDataLength, maxFrames: Int = RawYamuxReader.maxFrames) {
        decoder = YamuxFrameDecoder(maxDataLength: maxDataLength)
        self.maxFrames = maxFrames
    }

    /// Payload bytes of the last data frame still to come.
    package var pendingPayloadBytes: Int { decoder.pendingPayloadBytes }

    /// Reads the next bytes: the frames they complete, and the end if they break framing or bring one
    /// frame too many. Nothing once the session has ended.
    package mutating func read(_ bytes: ByteBuffer) -> [Output] {
        guard ended == nil else { return [] }
        decoder.feed(bytes)
        var outputs: [Output] = []
        do {
            while let event = try decoder.next() {
                switch event {
                case .data(let piece):
                    payloadBytes += piece.readableBytes
                case .header(let header):
                    frames += 1
                    guard frames <= maxFrames else {
                        outputs.append(end("the implementation sent more than \(maxFrames) frames"))
                        return outputs
                    }
                    outputs.append(.frame(header))
                }
            }
        } catch {
            outputs.append(end("\(error)"))
        }
        return outputs
    }

    /// The input ended (the connection closed, or failed with `reason`): the end, unless the session had
    /// ended already.
    package mutating func endOfInput(_ reason: String = "the connection ended") -> Output? {
        ended == nil ? end(reason) : nil
    }

    private mutating func end(_ reason: String) -> Output {
        ended = reason
        return .ended(reason)
    }
}

/// Where the raw multiplexer cases connect, one session per connection.
public enum RawYamuxTarget: Sendable {
    /// A Thali implementation: PSK-TLS keyed by its beacon for us, at its location. Its delivery sender
    /// speaks first on a stream we open.
    case keyed(BeaconMatch, BeaconLocation)
    /// A bare yamux server over plain TCP, to calibrate the cases against another implementation: the
    /// closure gives the address of a server for each new connection. A stream we open is served by an
    /// echo, so it is opened with a few bytes for the server to answer.
    case plain(@Sendable () async throws -> (host: String, port: Int))

    /// Runs `body` on a new session to the target.
    func session(group: any EventLoopGroup, _ body: (inout RawYamuxSession) async throws -> Void) async throws {
        switch self {
        case .keyed(let match, let location):
            try await RawYamuxSession.run(keyedBy: match, at: location, group: group, body)
        case .plain(let address):
            let (host, port) = try await address()
            try await RawYamuxSession.run(plainHost: host, port: port, group: group, body)
        }
    }

    /// The payload of the frame that opens a stream that must be served: nothing for a Thali node
    /// (its sender's hello comes first), a few bytes for an echo.
    var servedStreamGreeting: Int {
        if case .plain = self { 4 } else { 0 }
    }
}

extension YamuxHeader {
    /// How a header reads in a report: `WindowUpdate SYN|ACK stream 3 length 0`.
    var summary: String {
        let names: [(Flags, String)] = [(.syn, "SYN"), (.ack, "ACK"), (.fin, "FIN"), (.rst, "RST")]
        let flags = names.filter { self.flags.contains($0.0) }.map(\.1).joined(separator: "|")
        return "\(type)\(flags.isEmpty ? "" : " " + flags) stream \(streamID) length \(length)"
    }

    /// Whether it is a GoAway with `code`.
    func isGoAway(_ code: GoAwayCode) -> Bool { type == .goAway && length == code.rawValue }
}

extension RawYamuxSession.Input {
    /// How it reads in a report.
    var summary: String {
        switch self {
        case .frame(let header): header.summary
        case .ended(let reason), .failed(let reason): reason
        case .timedOut: "nothing"
        case .deadline: "nothing"
        }
    }
}
