import NIOCore
import NIOEmbedded
import Testing
@testable import ThaliNodeCore

/// The stream header and its answer (spec/node.md, "Stream marking"): the codec fed whole and in every
/// split, its bounds, and the two handlers that put it on a stream.
@Suite("Stream header")
struct StreamHeaderTests {
    static func bytes(_ write: (inout ByteBuffer) -> Void) -> [UInt8] {
        var buffer = ByteBuffer()
        write(&buffer)
        return Array(buffer.readableBytesView)
    }

    @Test("headers are a length byte and the kind; every kind survives encode and decode")
    func headerRoundTrip() throws {
        #expect(Self.bytes { StreamHeader(kind: .delivery).encode(into: &$0) } == [8] + Array("delivery".utf8))
        for kind in [StreamKind.delivery, .relay, try .app("chat"), try StreamKind(String(repeating: "x", count: 64))] {
            var buffer = ByteBuffer(bytes: Self.bytes { StreamHeader(kind: kind).encode(into: &$0) } + [0xFF])
            #expect(try StreamHeader.decode(from: &buffer) == StreamHeader(kind: kind))
            #expect(Array(buffer.readableBytesView) == [0xFF], "bytes after the header stay")
        }
        #expect(try StreamKind.app("chat").appProtocol == "chat")
        #expect(StreamKind.relay.appProtocol == nil)
    }

    @Test("statuses: acceptance is two zero bytes; a refusal carries its code and reason")
    func statusRoundTrip() throws {
        #expect(Self.bytes { StreamStatus.accepted.encode(into: &$0) } == [0, 0])
        let refusal = StreamRefusal(.notServed, reason: "relay is not served: this node has no app port")
        for status in [StreamStatus.accepted, .refused(refusal), .refused(StreamRefusal(.init(rawValue: 200), reason: ""))] {
            var buffer = ByteBuffer(bytes: Self.bytes { status.encode(into: &$0) })
            #expect(try StreamStatus.decode(from: &buffer) == status)
            #expect(buffer.readableBytes == 0)
        }
        // A reason is cut to the limit and kept to printable ASCII when encoded.
        let long = StreamStatus.refused(StreamRefusal(.notServed, reason: String(repeating: "é", count: 300)))
        var buffer = ByteBuffer(bytes: Self.bytes { long.encode(into: &$0) })
        guard case .refused(let decoded) = try StreamStatus.decode(from: &buffer) else { Issue.record("not a refusal"); return }
        #expect(decoded.reason.utf8.count == StreamStatus.maximumReasonLength && decoded.reason.allSatisfy { $0 == "?" })
    }

    @Test("decoding does not depend on where the bytes are split: every split of a header run and a status run")
    func awkwardSplits() throws {
        let headers = [StreamHeader(kind: .delivery), StreamHeader(kind: .relay), StreamHeader(kind: try .app("chat"))]
        let headerBytes = Self.bytes { buffer in headers.forEach { $0.encode(into: &buffer) } } + [42]
        let statuses = [StreamStatus.accepted, .refused(StreamRefusal(.unknownKind, reason: "unknown stream kind x"))]
        let statusBytes = Self.bytes { buffer in statuses.forEach { $0.encode(into: &buffer) } } + [42]
        for first in 0...headerBytes.count {
            for second in first...headerBytes.count {
                var buffer = ByteBuffer()
                var decoded: [StreamHeader] = []
                for piece in [headerBytes[..<first], headerBytes[first..<second], headerBytes[second...]] {
                    buffer.writeBytes(piece)
                    while let header = try StreamHeader.decode(from: &buffer) { decoded.append(header) }
                }
                #expect(decoded == headers && Array(buffer.readableBytesView) == [42], "split at \(first), \(second)")
            }
        }
        // One byte at a time.
        var buffer = ByteBuffer()
        var decoded: [StreamStatus] = []
        for byte in statusBytes {
            buffer.writeInteger(byte)
            while let status = try StreamStatus.decode(from: &buffer) { decoded.append(status) }
        }
        #expect(decoded == statuses && Array(buffer.readableBytesView) == [42])
    }

    @Test("bad headers are typed errors, decided on the bytes present: empty, too long, not printable ASCII")
    func badHeaders() {
        func decode(_ bytes: [UInt8]) -> Result<StreamHeader?, StreamHeaderError> {
            var buffer = ByteBuffer(bytes: bytes)
            return Result { () throws(StreamHeaderError) in try StreamHeader.decode(from: &buffer) }
        }
        #expect(decode([0]) == .failure(.emptyKind))
        // Refused on the length byte alone: no waiting for 65 bytes that would be thrown away.
        #expect(decode([65]) == .failure(.kindTooLong(length: 65, maximum: 64)))
        #expect(decode([255, 0x61]) == .failure(.kindTooLong(length: 255, maximum: 64)))
        #expect(decode([8, 0x64, 0xC3]) == .failure(.kindNotPrintableASCII(byte: 0xC3)), "refused before the rest came")
        #expect(decode([5, 0x61, 0x20, 0x62, 0x63, 0x64]) == .failure(.kindNotPrintableASCII(byte: 0x20)))
        #expect(decode([8, 0x64, 0x65]) == .success(nil), "incomplete, nothing wrong yet")
        #expect(throws: StreamHeaderError.kindTooLong(length: 65, maximum: 64)) { try StreamKind(String(repeating: "a", count: 65)) }
        #expect(throws: StreamHeaderError.emptyKind) { try StreamKind.app("") }
        #expect(throws: StreamHeaderError.kindNotPrintableASCII(byte: 0x20)) { try StreamKind.app("a b") }
    }

    @Test("bad statuses are typed errors: a reason too long, not printable, or on an acceptance")
    func badStatuses() {
        func decode(_ bytes: [UInt8]) -> Result<StreamStatus?, StreamHeaderError> {
            var buffer = ByteBuffer(bytes: bytes)
            return Result { () throws(StreamHeaderError) in try StreamStatus.decode(from: &buffer) }
        }
        #expect(decode([2, 201]) == .failure(.reasonTooLong(length: 201, maximum: 200)))
        #expect(decode([0, 1, 0x61]) == .failure(.reasonOnAcceptance))
        #expect(decode([2, 3, 0x61, 0x0A]) == .failure(.reasonNotPrintableASCII(byte: 0x0A)))
        #expect(decode([2]) == .success(nil))
    }

    // MARK: Handlers

    /// A stream's accepting side on an embedded channel: the reader, and what `dispatch` is asked.
    final class Accepting {
        let channel = EmbeddedChannel()
        var asked: [StreamKind] = []
        var refusals: [StreamRefusal] = []
        /// Made when the reader dispatches; the test settles it.
        var answer: EventLoopPromise<StreamStatus>?

        init(timeout: TimeAmount = .seconds(10)) throws {
            let box = NIOLoopBound(self, eventLoop: channel.eventLoop)
            try channel.pipeline.syncOperations.addHandler(StreamHeaderReader(timeout: timeout, dispatch: { kind, _ in
                box.value.asked.append(kind)
                let answer = box.value.channel.eventLoop.makePromise(of: StreamStatus.self)
                box.value.answer = answer
                return answer.futureResult
            }, refused: { _, refusal in box.value.refusals.append(refusal) }))
            try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        }

        func written() throws -> [UInt8] {
            var all: [UInt8] = []
            while let buffer = try channel.readOutbound(as: ByteBuffer.self) { all += buffer.readableBytesView }
            return all
        }

        func read() throws -> [UInt8] {
            var all: [UInt8] = []
            while let buffer = try channel.readInbound(as: ByteBuffer.self) { all += buffer.readableBytesView }
            return all
        }
    }

    @Test("the accepting side: header in pieces, the status before the kind's own bytes, then the bytes after the header")
    func readerDispatchesAndAnswersFirst() throws {
        let side = try Accepting()
        try side.channel.writeInbound(ByteBuffer(bytes: [5, 0x72, 0x65]))
        #expect(side.asked.isEmpty)
        try side.channel.writeInbound(ByteBuffer(bytes: [0x6C, 0x61, 0x79, 1, 2, 3]))
        #expect(side.asked == [.relay])
        // The kind's handler writes before the answer is settled: it waits behind the status.
        side.channel.writeAndFlush(ByteBuffer(bytes: [9, 9]), promise: nil)
        try side.channel.writeInbound(ByteBuffer(bytes: [4]))
        #expect(try side.written().isEmpty && side.read().isEmpty)
        side.answer?.succeed(.accepted)
        #expect(try side.written() == [0, 0, 9, 9])
        #expect(try side.read() == [1, 2, 3, 4])
        try side.channel.writeInbound(ByteBuffer(bytes: [5]))
        #expect(try side.read() == [5], "the reader has left the pipeline")
    }

    /// Holds inbound bytes until a read is asked for, and hands them on from inside that `read()`, as a
    /// multiplexer stream does with bytes it buffered while nobody read.
    final class ReadOnDemand: ChannelDuplexHandler {
        typealias InboundIn = ByteBuffer
        typealias InboundOut = ByteBuffer
        typealias OutboundIn = ByteBuffer
        private var held: [ByteBuffer] = []
        private var readAsked = false

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            held.append(unwrapInboundIn(data))
            if readAsked { deliver(context: context) }
        }

        func read(context: ChannelHandlerContext) {
            readAsked = true
            if !held.isEmpty { deliver(context: context) }
        }

        private func deliver(context: ChannelHandlerContext) {
            readAsked = false
            let bytes = held
            held = []
            for buffer in bytes { context.fireChannelRead(wrapInboundOut(buffer)) }
            context.fireChannelReadComplete()
        }
    }

    /// The stream's bytes that came while the kind was being set up, and nobody read, are handed over
    /// from inside the read the reader asks for as it leaves: they reach the kind's handlers. (They
    /// were dropped, and a relayed connection stalled, when the reader took them for a refused stream's.)
    @Test("bytes that waited unread while the kind was set up reach it when the reader leaves")
    func bytesHeldDuringDispatchReachTheKind() throws {
        let side = try Accepting()
        let gate = ReadOnDemand()
        try side.channel.pipeline.syncOperations.addHandler(gate, position: .first)
        side.channel.read()
        try side.channel.writeInbound(ByteBuffer(bytes: [5, 0x72, 0x65, 0x6C, 0x61, 0x79]))
        #expect(side.asked == [.relay])
        side.channel.read()  // the kind's handlers ask; the reader holds it back while it dispatches
        try side.channel.writeInbound(ByteBuffer(bytes: [7, 8]))  // waits in the gate: no read is out
        side.answer?.succeed(.accepted)
        #expect(try side.written() == [0, 0])
        #expect(try side.read() == [7, 8])
    }

    @Test("the accepting side refuses a bad header with a status naming it, and closes")
    func readerRefusesBadHeaders() throws {
        for (bytes, reason) in [([65], StreamHeaderError.kindTooLong(length: 65, maximum: 64)),
                                ([3, 0x61, 0xFF], .kindNotPrintableASCII(byte: 0xFF))] as [([UInt8], StreamHeaderError)] {
            let side = try Accepting()
            try side.channel.writeInbound(ByteBuffer(bytes: bytes))
            #expect(side.refusals == [StreamRefusal(.badHeader, reason: reason.description)])
            #expect(try side.written() == Self.bytes { StreamStatus.refused(StreamRefusal(.badHeader, reason: reason.description)).encode(into: &$0) })
            #expect(side.asked.isEmpty)
            // Its output ends after the answer; the stream closes when the opener's does, or after the timeout.
            side.channel.embeddedEventLoop.advanceTime(by: .seconds(10))
            #expect(!side.channel.isActive)
        }
    }

    @Test("a header cut short by the end of the stream, or late, is refused as such")
    func readerRefusesTruncatedAndSlowHeaders() throws {
        let truncated = try Accepting()
        try truncated.channel.writeInbound(ByteBuffer(bytes: [8, 0x64, 0x65]))
        truncated.channel.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
        #expect(truncated.refusals.map(\.reason) == [StreamHeaderError.endedBeforeHeader(received: 3).description])

        let slow = try Accepting(timeout: .seconds(2))
        try slow.channel.writeInbound(ByteBuffer(bytes: [8, 0x64]))
        slow.channel.embeddedEventLoop.advanceTime(by: .milliseconds(1999))
        #expect(slow.refusals.isEmpty)
        slow.channel.embeddedEventLoop.advanceTime(by: .milliseconds(1))
        #expect(slow.refusals.map(\.reason) == [StreamHeaderError.headerTimedOut(milliseconds: 2000).description])
        #expect(slow.refusals.map(\.code) == [.badHeader])
        slow.channel.embeddedEventLoop.advanceTime(by: .seconds(2))
        #expect(!slow.channel.isActive)
    }

    /// A stream's opening side on an embedded channel, with the writer and the errors it reports.
    final class Opening {
        let channel = EmbeddedChannel()
        var failures: [String] = []

        init(kind: StreamKind, timeout: TimeAmount = .seconds(10)) throws {
            let box = NIOLoopBound(self, eventLoop: channel.eventLoop)
            try channel.pipeline.syncOperations.addHandler(StreamHeaderWriter(header: StreamHeader(kind: kind), timeout: timeout) { error in
                box.value.failures.append("\(error)")
            })
            try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        }
    }

    @Test("the opener writes the header first, sends without waiting, and strips the answer")
    func writerStripsTheStatus() throws {
        let side = try Opening(kind: .delivery)
        side.channel.writeAndFlush(ByteBuffer(bytes: [7]), promise: nil)
        var written: [UInt8] = []
        while let buffer = try side.channel.readOutbound(as: ByteBuffer.self) { written += buffer.readableBytesView }
        #expect(written == [8] + Array("delivery".utf8) + [7])
        try side.channel.writeInbound(ByteBuffer(bytes: [0]))
        #expect(try side.channel.readInbound(as: ByteBuffer.self) == nil)
        try side.channel.writeInbound(ByteBuffer(bytes: [0, 0x68, 0x69]))
        #expect(try side.channel.readInbound(as: ByteBuffer.self) == ByteBuffer(bytes: [0x68, 0x69]))
        #expect(side.failures.isEmpty)
    }

    @Test("a refusal, an end before the answer, or a late answer is one typed error on the opener's stream")
    func writerReportsRefusals() throws {
        let refusal = StreamRefusal(.notServed, reason: "relay is not served: this node has no app port")
        let refused = try Opening(kind: .relay)
        #expect(throws: refusal) {
            try refused.channel.writeInbound(ByteBuffer(bytes: Self.bytes { StreamStatus.refused(refusal).encode(into: &$0) }))
        }
        #expect(refused.failures == [refusal.description] && !refused.channel.isActive)

        let ended = try Opening(kind: .relay)
        #expect(throws: StreamHeaderError.endedBeforeStatus(received: 1)) {
            try ended.channel.writeInbound(ByteBuffer(bytes: [2]))
            ended.channel.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
            try ended.channel.throwIfErrorCaught()
        }

        let late = try Opening(kind: .relay, timeout: .seconds(1))
        late.channel.embeddedEventLoop.advanceTime(by: .seconds(1))
        #expect(late.failures == [StreamHeaderError.statusTimedOut(milliseconds: 1000).description])
        #expect(throws: StreamHeaderError.statusTimedOut(milliseconds: 1000)) { try late.channel.throwIfErrorCaught() }
    }
}
