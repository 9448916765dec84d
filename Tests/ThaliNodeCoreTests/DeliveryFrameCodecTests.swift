import Foundation
import NIOCore
import NIOEmbedded
import Testing
@testable import ThaliNodeCore

@Suite("Delivery frame codec")
struct DeliveryFrameCodecTests {
    static let limits = DeliveryLimits()
    static let id = UUID(uuidString: "0F1E2D3C-4B5A-6978-8796-A5B4C3D2E1F0")!

    /// One frame of every type, with payloads that exercise every field.
    static let everyFrame: [DeliveryFrame] = [
        .hello(version: 1),
        .offer(ItemOffer(id: id, kind: .file, size: 1 << 33, sha256: Array(repeating: 0xAB, count: 32),
                         createdMilliseconds: 1_700_000_000_000, expiresMilliseconds: 1_800_000_000_000,
                         name: "photo – été.jpg")),
        .offer(ItemOffer(id: id, kind: .text, size: 5, sha256: Array(0..<32), createdMilliseconds: 1,
                         expiresMilliseconds: 2, name: "")),
        .answer(id: id, .nothing),
        .answer(id: id, .partial(offset: 12345, prefixSHA256: Array(100..<132))),
        .answer(id: id, .complete),
        .answer(id: id, .refused(.tooLarge)),
        .answer(id: id, .refused(.noSpace)),
        .start(id: id, offset: 77),
        .data(ByteBuffer(bytes: [1, 2, 3, 4, 5, 0, 255])),
        .end(id: id),
        .ack(id: id),
        .reject(id: id, .digestMismatch),
        .done,
        .welcome(version: 2, maxFramePayloadBytes: 1024),
        .welcome(version: 3, maxFramePayloadBytes: 1024, progressWindowBytes: 1 << 22),
        .welcome(version: 4, maxFramePayloadBytes: 1024, progressWindowBytes: 1 << 22),
        .progress(id: id, bytes: 1 << 33),
        .item(ItemOffer(id: id, kind: .text, size: 5, sha256: Array(0..<32), createdMilliseconds: 1,
                        expiresMilliseconds: 2, name: ""), content: ByteBuffer(string: "héé"), endsBatch: false),
        .item(ItemOffer(id: id, kind: .text, size: 0, sha256: Array(0..<32), createdMilliseconds: 1,
                        expiresMilliseconds: 2, name: ""), content: ByteBuffer(), endsBatch: true),
        .error(code: .frameTooLarge, reason: "frame payload of 32768 bytes exceeds the limit of 1024"),
        .error(code: DeliveryErrorCode(rawValue: 200), reason: ""),
    ]

    static func encoded(_ frames: [DeliveryFrame]) -> ByteBuffer {
        var buffer = ByteBuffer()
        for frame in frames { frame.encode(into: &buffer) }
        return buffer
    }

    @Test("every frame type survives encode and decode")
    func roundTrip() throws {
        var buffer = Self.encoded(Self.everyFrame)
        var decoded: [DeliveryFrame] = []
        while let frame = try DeliveryFrame.decode(from: &buffer, limits: Self.limits) { decoded.append(frame) }
        #expect(decoded == Self.everyFrame)
        #expect(buffer.readableBytes == 0)
    }

    @Test("version 4's temporary refusal is answer code 3 with reason 4")
    func noSpaceLayout() throws {
        var buffer = ByteBuffer()
        DeliveryFrame.answer(id: Self.id, .refused(.noSpace)).encode(into: &buffer)
        #expect(Array(buffer.readableBytesView) == [3, 0, 0, 0, 18] + Self.idBytes + [3, 4])
        #expect(try DeliveryFrame.decode(from: &buffer, limits: Self.limits) == .answer(id: Self.id, .refused(.noSpace)))
    }

    @Test("the wire layout is type, big-endian length, payload")
    func wireLayout() {
        var buffer = ByteBuffer()
        DeliveryFrame.start(id: Self.id, offset: 0x0102).encode(into: &buffer)
        let bytes = Array(buffer.readableBytesView)
        #expect(bytes.prefix(5) == [4, 0, 0, 0, 24])
        #expect(Array(bytes[5..<21]) == withUnsafeBytes(of: Self.id.uuid) { Array($0) })
        #expect(Array(bytes[21...]) == [0, 0, 0, 0, 0, 0, 1, 2])
    }

    @Test("welcome and error frames: their wire layout, and an error reason that is too long or not UTF-8 is refused")
    func welcomeAndErrorLayout() throws {
        var buffer = ByteBuffer()
        DeliveryFrame.welcome(version: 2, maxFramePayloadBytes: 0x0102_0304).encode(into: &buffer)
        #expect(Array(buffer.readableBytesView) == [10, 0, 0, 0, 5, 2, 1, 2, 3, 4])
        buffer.clear()
        DeliveryFrame.error(code: .limitExceeded, reason: "é").encode(into: &buffer)
        #expect(Array(buffer.readableBytesView) == [11, 0, 0, 0, 3, 4, 0xC3, 0xA9])

        var notUTF8 = ByteBuffer(bytes: [11, 0, 0, 0, 2, 1, 0xFF])
        #expect(throws: DeliveryProtocolError.malformedFrame(type: "error", reason: "reason is not UTF-8")) {
            try DeliveryFrame.decode(from: &notUTF8, limits: Self.limits)
        }
        var long = ByteBuffer()
        DeliveryFrame.error(code: .protocolViolation, reason: String(repeating: "x", count: 1001)).encode(into: &long)
        #expect(throws: DeliveryProtocolError.malformedFrame(type: "error", reason: "reason of 1001 bytes")) {
            try DeliveryFrame.decode(from: &long, limits: Self.limits)
        }
        // Version 3: the progress window follows the maximum.
        buffer.clear()
        DeliveryFrame.welcome(version: 3, maxFramePayloadBytes: 0x0102_0304, progressWindowBytes: 0x0506_0708).encode(into: &buffer)
        #expect(Array(buffer.readableBytesView) == [10, 0, 0, 0, 9, 3, 1, 2, 3, 4, 5, 6, 7, 8])
        var windowless = ByteBuffer(bytes: [10, 0, 0, 0, 5, 3, 1, 2, 3, 4])
        #expect(throws: DeliveryProtocolError.malformedFrame(type: "welcome", reason: "truncated")) {
            try DeliveryFrame.decode(from: &windowless, limits: Self.limits)
        }
        buffer.clear()
        DeliveryFrame.progress(id: Self.id, bytes: 0x0102).encode(into: &buffer)
        #expect(Array(buffer.readableBytesView) == [12, 0, 0, 0, 24] + withUnsafeBytes(of: Self.id.uuid) { Array($0) } + [0, 0, 0, 0, 0, 0, 1, 2])
        var shortWelcome = ByteBuffer(bytes: [10, 0, 0, 0, 3, 2, 0, 0])
        #expect(throws: DeliveryProtocolError.malformedFrame(type: "welcome", reason: "truncated")) {
            try DeliveryFrame.decode(from: &shortWelcome, limits: Self.limits)
        }
    }

    /// `frames` with each run of adjacent `.data` pieces joined into one frame (``everyFrame`` has no two
    /// data frames side by side); records an issue for an empty piece, which the decoder never passes on.
    static func joiningDataPieces(_ frames: [DeliveryFrame]) -> [DeliveryFrame] {
        var joined: [DeliveryFrame] = []
        for frame in frames {
            guard case .data(var piece) = frame else { joined.append(frame); continue }
            if piece.readableBytes == 0 { Issue.record("an empty data piece") }
            if case .data(var previous)? = joined.last {
                previous.writeBuffer(&piece)
                joined[joined.count - 1] = .data(previous)
            } else {
                joined.append(frame)
            }
        }
        return joined
    }

    /// Where `buffer`'s readable bytes are in memory: equal for two buffers only if neither was copied.
    static func address(_ buffer: ByteBuffer) -> UInt {
        buffer.withUnsafeReadableBytes { UInt(bitPattern: $0.baseAddress) }
    }

    static func decoderChannel(_ dataDelivery: DeliveryFrameDecoder.DataDelivery) -> EmbeddedChannel {
        EmbeddedChannel(handler: ByteToMessageHandler(DeliveryFrameDecoder(limits: limits, dataDelivery: dataDelivery)))
    }

    @Test("a stream split at every byte position decodes to the same frames through the channel handler",
          arguments: [DeliveryFrameDecoder.DataDelivery.piecesAsTheyArrive, .wholeFrames])
    func splitAtEveryPosition(_ dataDelivery: DeliveryFrameDecoder.DataDelivery) throws {
        let whole = Array(Self.encoded(Self.everyFrame).readableBytesView)
        for split in 0...whole.count {
            let channel = Self.decoderChannel(dataDelivery)
            try channel.writeInbound(ByteBuffer(bytes: whole[..<split]))
            try channel.writeInbound(ByteBuffer(bytes: whole[split...]))
            var frames: [DeliveryFrame] = []
            while let frame = try channel.readInbound(as: DeliveryFrame.self) { frames.append(frame) }
            #expect(Self.joiningDataPieces(frames) == Self.everyFrame, "split at \(split)")
            if dataDelivery == .wholeFrames { #expect(frames == Self.everyFrame, "split at \(split)") }
            #expect(try channel.finish().isClean)
        }
    }

    @Test("byte-at-a-time input decodes the same frames",
          arguments: [DeliveryFrameDecoder.DataDelivery.piecesAsTheyArrive, .wholeFrames])
    func byteAtATime(_ dataDelivery: DeliveryFrameDecoder.DataDelivery) throws {
        let whole = Array(Self.encoded(Self.everyFrame).readableBytesView)
        let channel = Self.decoderChannel(dataDelivery)
        for byte in whole { try channel.writeInbound(ByteBuffer(bytes: [byte])) }
        var frames: [DeliveryFrame] = []
        while let frame = try channel.readInbound(as: DeliveryFrame.self) { frames.append(frame) }
        #expect(Self.joiningDataPieces(frames) == Self.everyFrame)
        if dataDelivery == .wholeFrames { #expect(frames == Self.everyFrame) }
        _ = try channel.finish()
    }

    @Test("a data frame spanning reads is passed on as the pieces each read brought, in the reads' own memory")
    func dataFramePiecesShareTheReads() throws {
        let payload = (0..<10_000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        let bytes = Array(Self.encoded([.data(ByteBuffer(bytes: payload)), .end(id: Self.id)]).readableBytesView)
        let reads = [ByteBuffer(bytes: bytes[..<3000]), ByteBuffer(bytes: bytes[3000..<7000]), ByteBuffer(bytes: bytes[7000...])]
        let channel = Self.decoderChannel(.piecesAsTheyArrive)
        var pieces: [ByteBuffer] = []
        for read in reads {
            try channel.writeInbound(read)
            while let frame = try channel.readInbound(as: DeliveryFrame.self) {
                guard case .data(let piece) = frame else { #expect(frame == .end(id: Self.id)); continue }
                pieces.append(piece)
            }
        }
        #expect(pieces.map(\.readableBytes) == [3000 - DeliveryFrame.headerBytes, 4000, 10_000 + DeliveryFrame.headerBytes - 7000])
        #expect(pieces.flatMap { Array($0.readableBytesView) } == payload)
        // Not copied: the second piece is the second read's bytes where the read put them.
        #expect(Self.address(pieces[1]) == Self.address(reads[1]))
        #expect(try channel.finish().isClean)
    }

    @Test("a data frame cut off by the end of the stream passes on what arrived and nothing more")
    func truncatedDataFrame() throws {
        let bytes = Self.encoded([.data(ByteBuffer(repeating: 9, count: 100))])
        let channel = Self.decoderChannel(.piecesAsTheyArrive)
        try channel.writeInbound(bytes.getSlice(at: 0, length: 60)!)
        #expect(try channel.readInbound(as: DeliveryFrame.self) == .data(ByteBuffer(repeating: 9, count: 55)))
        _ = try channel.finish()
        #expect(try channel.readInbound(as: DeliveryFrame.self) == nil)
    }

    @Test("the encoder handler writes the documented bytes")
    func encoderHandler() throws {
        let channel = EmbeddedChannel(handler: DeliveryFrameEncoder())
        try channel.writeOutbound(DeliveryFrame.ack(id: Self.id))
        let written = try #require(try channel.readOutbound(as: ByteBuffer.self))
        #expect(written == Self.encoded([.ack(id: Self.id)]))
        _ = try channel.finish()
    }

    @Test("a data frame goes out as its header and then its payload, not copied behind it")
    func encoderWritesPayloadAsIs() throws {
        let payload = ByteBuffer(bytes: (0..<5000).map { UInt8(truncatingIfNeeded: $0) })
        let channel = EmbeddedChannel(handler: DeliveryFrameEncoder())
        try channel.writeOutbound(DeliveryFrame.data(payload))
        let header = try #require(try channel.readOutbound(as: ByteBuffer.self))
        let body = try #require(try channel.readOutbound(as: ByteBuffer.self))
        var joined = header
        joined.writeImmutableBuffer(body)
        #expect(joined == Self.encoded([.data(payload)]))
        #expect(Self.address(body) == Self.address(payload))
        _ = try channel.finish()
    }

    @Test("an oversized length is rejected from the header alone, before any payload is buffered")
    func frameTooLargeFromHeader() throws {
        let channel = Self.decoderChannel(.piecesAsTheyArrive)
        var header = ByteBuffer()
        header.writeInteger(UInt8(5))
        header.writeInteger(UInt32(Self.limits.maxFramePayloadBytes + 1))
        #expect(throws: DeliveryProtocolError.frameTooLarge(length: Self.limits.maxFramePayloadBytes + 1,
                                                              limit: Self.limits.maxFramePayloadBytes)) {
            try channel.writeInbound(header)
        }
        _ = try? channel.finish()
    }

    @Test("a frame of exactly the maximum payload is accepted")
    func frameAtLimit() throws {
        var buffer = ByteBuffer()
        DeliveryFrame.data(ByteBuffer(repeating: 7, count: Self.limits.maxFramePayloadBytes)).encode(into: &buffer)
        let frame = try #require(try DeliveryFrame.decode(from: &buffer, limits: Self.limits))
        guard case .data(let bytes) = frame else { Issue.record("not data: \(frame)"); return }
        #expect(bytes.readableBytes == Self.limits.maxFramePayloadBytes)
    }

    static func frame(type: UInt8, payload: [UInt8]) -> ByteBuffer {
        var buffer = ByteBuffer()
        buffer.writeInteger(type)
        buffer.writeInteger(UInt32(payload.count))
        buffer.writeBytes(payload)
        return buffer
    }

    static let idBytes = withUnsafeBytes(of: id.uuid) { Array($0) }

    static func offerPayload(kind: UInt8 = 1, nameLength: UInt16, name: [UInt8]) -> [UInt8] {
        var payload = idBytes + [kind] + Array(repeating: 0, count: 8) + Array(repeating: 1, count: 32)
        payload += Array(repeating: 0, count: 16)
        payload += [UInt8(nameLength >> 8), UInt8(nameLength & 0xFF)] + name
        return payload
    }

    /// Malformed inputs and the exact typed error each must produce.
    static let malformed: [(String, ByteBuffer, DeliveryProtocolError)] = [
        ("unknown type", frame(type: 0, payload: []), .unknownFrameType(0)),
        ("unknown type 200", frame(type: 200, payload: [1, 2]), .unknownFrameType(200)),
        ("hello without version", frame(type: 1, payload: []), .malformedFrame(type: "hello", reason: "truncated")),
        ("hello with trailing byte", frame(type: 1, payload: [1, 0]), .malformedFrame(type: "hello", reason: "1 trailing bytes")),
        ("short id", frame(type: 7, payload: Array(idBytes.prefix(15))), .malformedFrame(type: "ack", reason: "truncated")),
        ("unknown answer code", frame(type: 3, payload: idBytes + [9]), .malformedFrame(type: "answer", reason: "unknown answer code 9")),
        ("partial answer without digest", frame(type: 3, payload: idBytes + [1] + Array(repeating: 0, count: 8)),
         .malformedFrame(type: "answer", reason: "truncated")),
        ("unknown refusal", frame(type: 3, payload: idBytes + [3, 0]), .malformedFrame(type: "answer", reason: "unknown refusal 0")),
        ("refusal 5, after version 4's", frame(type: 3, payload: idBytes + [3, 5]), .malformedFrame(type: "answer", reason: "unknown refusal 5")),
        ("unknown failure", frame(type: 8, payload: idBytes + [77]), .malformedFrame(type: "reject", reason: "unknown failure 77")),
        ("empty data", frame(type: 5, payload: []), .malformedFrame(type: "data", reason: "empty data")),
        ("done with payload", frame(type: 9, payload: [0]), .malformedFrame(type: "done", reason: "1 trailing bytes")),
        ("unknown item kind", frame(type: 2, payload: offerPayload(kind: 9, nameLength: 0, name: [])),
         .malformedFrame(type: "offer", reason: "unknown item kind 9")),
        ("name longer than the limit", frame(type: 2, payload: offerPayload(nameLength: 256, name: Array(repeating: 65, count: 256))),
         .nameTooLong(length: 256, limit: 255)),
        ("name length beyond the payload", frame(type: 2, payload: offerPayload(nameLength: 10, name: [65, 66])),
         .malformedFrame(type: "offer", reason: "truncated")),
        ("name not UTF-8", frame(type: 2, payload: offerPayload(nameLength: 2, name: [0xC3, 0x28])),
         .malformedFrame(type: "offer", reason: "name is not UTF-8")),
        // `item` (version 3): flags, an offer of a text (size 0 in offerPayload), exactly its content.
        ("item with unknown flags", frame(type: 13, payload: [2] + offerPayload(kind: 0, nameLength: 0, name: [])),
         .malformedFrame(type: "item", reason: "unknown flags 2")),
        ("item of a file", frame(type: 13, payload: [1] + offerPayload(kind: 1, nameLength: 0, name: [])),
         .malformedFrame(type: "item", reason: "an item frame carries a text, not a file")),
        ("item with more content than its size", frame(type: 13, payload: [1] + offerPayload(kind: 0, nameLength: 0, name: []) + [65]),
         .malformedFrame(type: "item", reason: "1 content bytes for an item of 0")),
        ("item with a truncated offer", frame(type: 13, payload: [1] + idBytes), .malformedFrame(type: "item", reason: "truncated")),
        ("progress without its count", frame(type: 12, payload: idBytes + [0, 0, 0]), .malformedFrame(type: "progress", reason: "truncated")),
        ("progress with a trailing byte", frame(type: 12, payload: idBytes + Array(repeating: 0, count: 9)),
         .malformedFrame(type: "progress", reason: "1 trailing bytes")),
    ]

    @Test("malformed frames give typed errors", arguments: 0..<malformed.count)
    func malformedFrames(index: Int) {
        let (label, input, expected) = Self.malformed[index]
        var buffer = input
        #expect(throws: expected, "\(label)") { try DeliveryFrame.decode(from: &buffer, limits: Self.limits) }
    }

    @Test("an incomplete frame consumes nothing and waits for more")
    func incompleteFrame() throws {
        let whole = Self.encoded([.ack(id: Self.id)])
        for length in 0..<whole.readableBytes {
            var partial = whole.getSlice(at: 0, length: length)!
            #expect(try DeliveryFrame.decode(from: &partial, limits: Self.limits) == nil)
            #expect(partial.readableBytes == length)
        }
    }

    @Test("random garbage never crashes the decoder and never buffers more than one bounded frame")
    func randomGarbage() throws {
        let limits = DeliveryLimits(maxFramePayloadBytes: 2048)
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<2000 {
            let count = Int.random(in: 0...64, using: &generator)
            var buffer = ByteBuffer(bytes: (0..<count).map { _ in UInt8.random(in: 0...255, using: &generator) })
            // Either some frames, nil (waiting for at most one bounded frame), or a typed error.
            do {
                while let _ = try DeliveryFrame.decode(from: &buffer, limits: limits) {}
                #expect(buffer.readableBytes <= DeliveryFrame.headerBytes + limits.maxFramePayloadBytes)
            } catch is DeliveryProtocolError {
            }
        }
    }

    @Test("limits below the minimum are raised so an offer always fits")
    func limitsClamp() {
        let limits = DeliveryLimits(maxFramePayloadBytes: 10, chunkBytes: 100_000, maxNameBytes: 0)
        #expect(limits.maxFramePayloadBytes == DeliveryLimits.minimumFramePayloadBytes)
        #expect(limits.chunkBytes == limits.maxFramePayloadBytes)
        #expect(limits.maxNameBytes == 1)
    }
}
