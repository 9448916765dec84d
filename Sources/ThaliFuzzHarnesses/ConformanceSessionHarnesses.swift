import NIOCore
import TCPMultiplexer
import ThaliConformance

/// The output of the adapter's `events` verb (spec/conformance.md, "Adapter contract"), bytes the
/// implementation under test writes, as ``AdapterEventLog`` reads them: whole and split at random points,
/// with small limits so that both are reached.
///
/// Invariants: what is read does not depend on where the output was split; the reading ends over the
/// line limit exactly when some line (ended or not) is longer than it; the events read are exactly the
/// lines before that one that are JSON objects with a string `event`, the newest `maxEvents` of them kept
/// and the rest counted as forgotten; a mark addresses the events read after it.
enum AdapterEventsHarness {
    static let name = "adapter-events"
    static let readAt = NIODeadline.uptimeNanoseconds(1)

    static let harness = FuzzHarness(name: name, summary: "the conformance suite reading the adapter's event lines", seeds: seeds) {
        (input: inout FuzzInput) throws(FuzzInvariantViolation) in
        let maxEvents = 1 + Int(input.byte() % 16)
        let maxLineBytes = 1 + Int(input.uint16() % 2048)
        let cuts = takeCuts(&input)
        let output = input.rest()
        let whole = read([output[...]], maxEvents: maxEvents, maxLineBytes: maxLineBytes)
        let split = read(splitPieces(output, cuts: cuts), maxEvents: maxEvents, maxLineBytes: maxLineBytes)
        try check(whole.events == split.events && whole.forgotten == split.forgotten && whole.ended == split.ended, name,
                  "the split changed what was read: \(whole.count) vs \(split.count) events, \(whole.ended ?? "-") vs \(split.ended ?? "-")")

        // The oracle: the lines one by one, up to the first one over the limit.
        var segments = output.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false)
        let unterminated = segments.removeLast()
        var expected: [AdapterEvent] = []
        var overLimit = false
        for segment in segments {
            if segment.count > maxLineBytes {
                overLimit = true
                break
            }
            if let event = AdapterEvent(line: segment, readAt: readAt) { expected.append(event) }
        }
        if !overLimit, unterminated.count > maxLineBytes { overLimit = true }
        try check((whole.ended == "a line longer than \(maxLineBytes) bytes") == overLimit, name,
                  "ended \(whole.ended ?? "not"), a line over \(maxLineBytes) bytes: \(overLimit)")
        try check(whole.count == expected.count, name, "\(whole.count) events read, \(expected.count) lines are events")
        try check(whole.events.count == min(expected.count, maxEvents), name, "\(whole.events.count) kept, limit \(maxEvents)")
        try check(Array(whole.events) == Array(expected.suffix(maxEvents)), name, "the kept events are not the newest lines")
        for back in [0, 1, maxEvents, maxEvents + 1] {
            let after = whole.events(after: whole.count - back)
            try check(after == Array(expected.suffix(min(back, maxEvents))), name, "a mark \(back) events back gives \(after.count)")
        }
    }

    /// The log once `pieces` were read in order and the output ended.
    static func read(_ pieces: [ArraySlice<UInt8>], maxEvents: Int, maxLineBytes: Int) -> AdapterEventLog {
        var log = AdapterEventLog(maxEvents: maxEvents, maxLineBytes: maxLineBytes)
        for piece in pieces { log.read(piece, readAt: readAt) }
        log.endOfOutput()
        return log
    }

    static func seeds() -> [[UInt8]] {
        // Limits: 4 events, lines of at most 300 bytes (a u16 of 299), no cuts; then `output`.
        func seed(_ output: String, maxEvents: UInt8 = 3, maxLine: UInt16 = 299, cuts: [UInt16] = []) -> [UInt8] {
            [maxEvents, UInt8(maxLine & 0xFF), UInt8(maxLine >> 8), UInt8(cuts.count)]
                + cuts.flatMap { [UInt8($0 & 0xFF), UInt8($0 >> 8)] } + Array(output.utf8)
        }
        // Lines as `thali-node events` prints them.
        let node = """
            {"event":"started","location":"http://127.0.0.1:41235","summary":"listening at http://127.0.0.1:41235 (beacons and PSK-TLS)","t":1.5}
            {"binding":"wifi","event":"peer_appeared","location":"http://127.0.0.1:40001","summary":"peer appeared at http://127.0.0.1:40001","t":2.25}
            {"binding":"wifi","contact":"conformance","event":"connected","role":"accepting","summary":"PSK-TLS session with conformance up over wifi (they connected)","t":3}
            {"binding":"wifi","clean":false,"contact":"conformance","event":"disconnected","reason":"unclean shutdown","role":"accepting","summary":"PSK-TLS session ended","t":4}

            """
        return [
            seed(node),
            seed(node, cuts: [1, 77, 200, 201, 330]),  // cut inside lines and at their ends
            seed(node, maxEvents: 1),  // more events than kept
            seed("not json\n[1,2]\n{\"event\":5}\n{\"contact\":\"x\"}\n\n{\"event\":\"e\",\"clean\":\"yes\"}\r\n{\"event\":\"last\"}"),  // skipped lines, CRLF, no final newline
            seed("{\"event\":\"a\"}\n" + String(repeating: "x", count: 400) + "\n{\"event\":\"after\"}\n"),  // a line over the limit ends the reading
            seed("{\"event\":\"a\"}\n{\"event\":\"" + String(repeating: "y", count: 400)),  // over the limit before its newline
            seed("{\"event\":\"\\u0000\\ud800\",\"location\":\"\\u202e\"}\n" + String(repeating: "[", count: 250) + "\n"),  // odd escapes, deep nesting
            [2, 0x2B, 0x01, 0] + [0xFF, 0xFE, 0x7B, 0x0A, 0x00, 0x0A] + Array("{\"event\":\"ok\"}\n".utf8),  // bytes that are not UTF-8
        ]
    }
}

/// The implementation's bytes on a raw yamux session of the conformance suite (the multiplexer cases of
/// peer mode, spec/conformance.md), as ``RawYamuxReader`` reads them: whole and split at random points,
/// with a small frame limit and data limit so that both are reached.
///
/// Invariants: the frames and the end do not depend on where the bytes were split; at most the frame
/// limit is read, and nothing after the end; every frame read re-encodes to the twelve bytes it came
/// from, and a data frame's payload is within the limit; the bytes not read when the session did not end
/// are less than a header, and none while a payload is awaited.
enum RawYamuxInputHarness {
    static let name = "raw-yamux-input"

    static let harness = FuzzHarness(name: name, summary: "the conformance suite reading a raw yamux session", seeds: seeds) {
        (input: inout FuzzInput) throws(FuzzInvariantViolation) in
        let maxFrames = 1 + Int(input.byte() % 64)
        let maxDataLength = Int(input.uint16() % 4097)
        let cuts = takeCuts(&input)
        let bytes = input.rest()
        let whole = read([bytes[...]], maxFrames: maxFrames, maxDataLength: maxDataLength)
        let split = read(splitPieces(bytes, cuts: cuts), maxFrames: maxFrames, maxDataLength: maxDataLength)
        try check(whole.outputs == split.outputs, name, "the split changed what was read: \(whole.outputs.count) vs \(split.outputs.count) outputs")
        try check(whole.reader.payloadBytes == split.reader.payloadBytes, name, "payload \(whole.reader.payloadBytes) vs \(split.reader.payloadBytes) bytes")

        let ends = whole.outputs.indices.filter { if case .ended = whole.outputs[$0] { true } else { false } }
        try check(ends.count <= 1 && ends.allSatisfy { $0 == whole.outputs.count - 1 }, name, "an end that is not the last output")
        var offset = 0
        var frames = 0
        for output in whole.outputs {
            guard case .frame(let header) = output else { continue }
            frames += 1
            var encoded = ByteBuffer()
            header.write(to: &encoded)
            let source = bytes[min(offset, bytes.count)..<min(offset + YamuxHeader.size, bytes.count)]
            try check(Array(encoded.readableBytesView) == Array(source), name, "frame \(frames) does not re-encode to its bytes")
            offset += YamuxHeader.size
            if header.type == .data {
                try check(Int(header.length) <= maxDataLength, name, "a data frame of \(header.length) bytes, limit \(maxDataLength)")
                offset += Int(header.length)
            }
        }
        try check(frames <= maxFrames, name, "\(frames) frames read, limit \(maxFrames)")
        try check(frames == min(whole.reader.frames, maxFrames), name, "\(frames) frames returned, \(whole.reader.frames) counted")
        if whole.reader.ended == "the connection ended" {
            // Not ended by the reader: it consumed every whole frame.
            let consumed = frames * YamuxHeader.size + whole.reader.payloadBytes
            try check(consumed <= bytes.count, name, "\(consumed) bytes consumed of \(bytes.count)")
            try check(bytes.count - consumed < YamuxHeader.size, name, "\(bytes.count - consumed) bytes left unread")
            if whole.pendingPayload > 0 {
                try check(consumed == bytes.count, name, "a payload awaited with \(bytes.count - consumed) bytes unread")
            }
        }
    }

    struct Outcome {
        var outputs: [RawYamuxReader.Output] = []
        var reader: RawYamuxReader
        var pendingPayload = 0
    }

    /// Everything read from `pieces` in order, then the end of the connection.
    static func read(_ pieces: [ArraySlice<UInt8>], maxFrames: Int, maxDataLength: Int) -> Outcome {
        var outcome = Outcome(reader: RawYamuxReader(maxDataLength: maxDataLength, maxFrames: maxFrames))
        for piece in pieces { outcome.outputs += outcome.reader.read(ByteBuffer(bytes: piece)) }
        outcome.pendingPayload = outcome.reader.pendingPayloadBytes
        if let end = outcome.reader.endOfInput() { outcome.outputs.append(end) }
        return outcome
    }

    static func seeds() -> [[UInt8]] {
        func frame(_ type: YamuxHeader.FrameType, _ flags: YamuxHeader.Flags = [], stream: UInt32 = 0, length: UInt32, payload: Int = 0) -> [UInt8] {
            var buffer = ByteBuffer()
            YamuxHeader(type: type, flags: flags, streamID: stream, length: length).write(to: &buffer)
            return Array(buffer.readableBytesView) + [UInt8](repeating: 0x61, count: payload)
        }
        // Limits: 16 frames, data of at most 1024 bytes; the cuts; then the session's bytes.
        func seed(_ bytes: [UInt8], maxFrames: UInt8 = 15, cuts: [UInt16] = []) -> [UInt8] {
            [maxFrames, 0x00, 0x04, UInt8(cuts.count)] + cuts.flatMap { [UInt8($0 & 0xFF), UInt8($0 >> 8)] } + bytes
        }
        // What a node's delivery sender writes on a stream we opened: the window update that accepts it,
        // its hello as data, a ping of its own.
        let served = frame(.windowUpdate, .ack, stream: 1, length: 0) + frame(.data, stream: 1, length: 9, payload: 9)
            + frame(.ping, .syn, length: 7)
        return [
            seed(served),
            seed(served, cuts: [5, 12, 20, 30]),  // cut inside headers and payloads
            seed(frame(.ping, .ack, length: 42) + frame(.goAway, length: 1)),  // a ping answered, then GoAway 1
            seed(frame(.windowUpdate, .rst, stream: 1, length: 0) + frame(.data, .fin, stream: 3, length: 0)),  // a reset, a FIN
            seed(frame(.data, stream: 1, length: 2000, payload: 10)),  // data over the limit
            seed([1] + Array(frame(.ping, length: 1).dropFirst())),  // version 1
            seed([0, 9] + Array(frame(.ping, length: 1).dropFirst(2))),  // an unknown frame type
            seed((0..<20).flatMap { _ in frame(.ping, .syn, length: 1) }, maxFrames: 3),  // more frames than read
            seed(frame(.data, stream: 1, length: 100, payload: 40)),  // a payload cut short by the end
        ]
    }
}
