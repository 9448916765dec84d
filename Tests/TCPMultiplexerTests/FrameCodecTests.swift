import NIOCore
import Testing
@testable import TCPMultiplexer

/// Hex helpers shared by the tests.
func bytes(hex: String) -> ByteBuffer {
    var buffer = ByteBuffer()
    var index = hex.startIndex
    while index < hex.endIndex {
        let next = hex.index(index, offsetBy: 2)
        buffer.writeInteger(UInt8(hex[index..<next], radix: 16)!)
        index = next
    }
    return buffer
}

func hex(_ buffer: ByteBuffer) -> String {
    buffer.readableBytesView.map { String(format: "%02x", $0) }.joined()
}

/// A decoded yamux frame with its payload joined, for comparisons.
struct JoinedYamuxFrame: Equatable {
    var header: YamuxHeader
    var payload: [UInt8]
}

/// Feeds `input` to a fresh decoder in the given pieces and joins the result.
func decodeYamux(_ pieces: [ByteBuffer], maxData: Int = 1 << 20) throws -> [JoinedYamuxFrame] {
    var decoder = YamuxFrameDecoder(maxDataLength: maxData)
    var frames: [JoinedYamuxFrame] = []
    for piece in pieces {
        decoder.feed(piece)
        while let event = try decoder.next() {
            switch event {
            case .header(let header): frames.append(JoinedYamuxFrame(header: header, payload: []))
            case .data(let data): frames[frames.count - 1].payload += Array(data.readableBytesView)
            }
        }
    }
    return frames
}

/// Splits `buffer` at the given offsets.
func split(_ buffer: ByteBuffer, at offsets: [Int]) -> [ByteBuffer] {
    var pieces: [ByteBuffer] = []
    var previous = 0
    for offset in offsets + [buffer.readableBytes] {
        pieces.append(buffer.getSlice(at: buffer.readerIndex + previous, length: offset - previous)!)
        previous = offset
    }
    return pieces
}

@Suite(.timeLimit(.minutes(2))) struct YamuxFrameTests {
    @Test func headerEncodesBigEndianFields() {
        var buffer = ByteBuffer()
        YamuxHeader(type: .windowUpdate, flags: [.syn, .fin], streamID: 0x0102_0304, length: 0x0A0B_0C0D).write(to: &buffer)
        #expect(hex(buffer) == "00010005010203040a0b0c0d")
    }

    @Test func headerRoundTripsEveryTypeAndFlag() throws {
        for type in [YamuxHeader.FrameType.data, .windowUpdate, .ping, .goAway] {
            for flags in 0..<16 {
                let header = YamuxHeader(type: type, flags: .init(rawValue: UInt16(flags)), streamID: 7, length: 9)
                var buffer = ByteBuffer()
                header.write(to: &buffer)
                #expect(try YamuxHeader.read(from: &buffer) == header)
                #expect(buffer.readableBytes == 0)
            }
        }
    }

    @Test func rejectsWrongVersionAndUnknownType() {
        var wrongVersion = bytes(hex: "010000000000000100000000")
        #expect(throws: MultiplexerError.unsupportedVersion(1)) { try YamuxHeader.read(from: &wrongVersion) }
        var wrongType = bytes(hex: "000400000000000100000000")
        #expect(throws: MultiplexerError.unknownFrameType(4)) { try YamuxHeader.read(from: &wrongType) }
    }

    @Test func decoderRejectsOversizedDataFrame() {
        let frame = bytes(hex: "000000000000000100000101")  // 257-byte data frame
        #expect(throws: MultiplexerError.frameTooLarge(length: 257, limit: 256)) {
            _ = try decodeYamux([frame], maxData: 256)
        }
    }

    @Test func decoderGivesTheSameFramesHoweverTheBytesAreSplit() throws {
        var wire = ByteBuffer()
        YamuxHeader(type: .windowUpdate, flags: .syn, streamID: 1, length: 0).write(to: &wire)
        YamuxHeader(type: .data, flags: .ack, streamID: 1, length: 5).write(to: &wire)
        wire.writeString("hello")
        YamuxHeader(type: .ping, flags: .syn, streamID: 0, length: 42).write(to: &wire)
        YamuxHeader(type: .data, flags: .fin, streamID: 3, length: 0).write(to: &wire)
        YamuxHeader(type: .data, streamID: 3, length: 3).write(to: &wire)
        wire.writeString("abc")
        YamuxHeader(type: .goAway, streamID: 0, length: 1).write(to: &wire)
        let expected = try decodeYamux([wire])
        #expect(expected.count == 6)
        #expect(expected[1].payload == Array("hello".utf8))
        // Every single cut, and every pair of cuts.
        for first in 0...wire.readableBytes {
            #expect(try decodeYamux(split(wire, at: [first])) == expected)
            for second in first...wire.readableBytes {
                #expect(try decodeYamux(split(wire, at: [first, second])) == expected)
            }
        }
        // One byte at a time.
        #expect(try decodeYamux(split(wire, at: Array(1..<wire.readableBytes))) == expected)
    }
}

/// A decoded thali-multiplex frame with its payload joined.
struct JoinedThaliFrame: Equatable {
    var header: ThaliMultiplexHeader
    var payload: [UInt8]
}

func decodeThali(_ pieces: [ByteBuffer], maxPayload: Int = 1 << 20) throws -> [JoinedThaliFrame] {
    var decoder = ThaliMultiplexFrameDecoder(maxPayloadLength: maxPayload)
    var frames: [JoinedThaliFrame] = []
    for piece in pieces {
        decoder.feed(piece)
        while let event = try decoder.next() {
            switch event {
            case .header(let header, let body):
                frames.append(JoinedThaliFrame(header: header, payload: body.map { Array($0.readableBytesView) } ?? []))
            case .data(let data):
                frames[frames.count - 1].payload += Array(data.readableBytesView)
            }
        }
    }
    return frames
}

@Suite(.timeLimit(.minutes(2))) struct ThaliMultiplexFrameTests {
    @Test func varintsAreUnsignedLEB128() throws {
        let cases: [(UInt64, String)] = [(0, "00"), (1, "01"), (127, "7f"), (128, "8001"), (300, "ac02"),
                                         (16384, "808001"), (UInt64.max, "ffffffffffffffffff01")]
        for (value, encoded) in cases {
            var buffer = ByteBuffer()
            ThaliMultiplexHeader.writeVarint(value, to: &buffer)
            #expect(hex(buffer) == encoded)
            let decoded = try ThaliMultiplexHeader.peekVarint(buffer, offset: 0)
            #expect(decoded?.0 == value && decoded?.1 == buffer.readableBytes)
        }
    }

    @Test func headersMatchTheReferenceLibrary() {
        // From multiplex-6.7.0-node.json: id 16 open, 300-byte initiator message on id 0, reset from receiver.
        var buffer = ByteBuffer()
        ThaliMultiplexHeader(streamID: 16, flag: .open, length: 0).write(to: &buffer)
        ThaliMultiplexHeader(streamID: 0, flag: .messageInitiator, length: 300).write(to: &buffer)
        ThaliMultiplexHeader(streamID: 1, flag: .resetReceiver, length: 4).write(to: &buffer)
        #expect(hex(buffer) == "800100" + "02ac02" + "0d04")
    }

    @Test func rejectsBadVarintsFlagsAndSizes() {
        #expect(throws: MultiplexerError.varintTooLong) {
            _ = try decodeThali([bytes(hex: "ffffffffffffffffff7f00")])
        }
        #expect(throws: MultiplexerError.varintTooLong) {
            _ = try decodeThali([bytes(hex: "8080808080808080808000")])
        }
        #expect(throws: MultiplexerError.unknownFlag(7)) { _ = try decodeThali([bytes(hex: "0700")]) }
        #expect(throws: MultiplexerError.frameTooLarge(length: 1_048_577, limit: 1_048_576)) {
            _ = try decodeThali([bytes(hex: "02818040")])  // 1 MiB + 1
        }
        #expect(throws: MultiplexerError.frameTooLarge(length: 65537, limit: ThaliMultiplexFrameDecoder.maxControlBodyLength)) {
            _ = try decodeThali([bytes(hex: "00818004")])  // an open frame with a 64 KiB + 1 name
        }
    }

    @Test func decoderGivesTheSameFramesHoweverTheBytesAreSplit() throws {
        var wire = ByteBuffer()
        func frame(_ id: UInt64, _ flag: ThaliMultiplexHeader.Flag, _ body: String) {
            ThaliMultiplexHeader(streamID: id, flag: flag, length: body.utf8.count).write(to: &wire)
            wire.writeString(body)
        }
        frame(0, .open, "")
        frame(16, .open, "named")
        frame(16, .messageInitiator, String(repeating: "a", count: 200))
        frame(0, .messageReceiver, "world")
        frame(1, .resetReceiver, "boom")
        frame(0, .closeInitiator, "")
        frame(1_000_000, .messageInitiator, "x")
        let expected = try decodeThali([wire])
        #expect(expected.count == 7)
        #expect(expected[1].payload == Array("named".utf8))
        #expect(expected[6].header.streamID == 1_000_000)
        for first in 0...wire.readableBytes {
            #expect(try decodeThali(split(wire, at: [first])) == expected)
            for second in stride(from: first, through: wire.readableBytes, by: 3) {
                #expect(try decodeThali(split(wire, at: [first, second])) == expected)
            }
        }
        #expect(try decodeThali(split(wire, at: Array(1..<wire.readableBytes))) == expected)
    }
}
