import Foundation
import NIOCore
import ThaliMutants

extension DeliveryFrame {
    /// Appends this frame's wire form (header and payload) to `buffer`.
    package func encode(into buffer: inout ByteBuffer) {
        let headerIndex = buffer.writerIndex
        Self.writeHeader(type: frameType, length: 0, into: &buffer)  // length patched below, once known
        let payloadStart = buffer.writerIndex
        switch self {
        case .hello(let version):
            buffer.writeInteger(version)
        case .offer(let offer):
            buffer.writeOffer(offer)
        case .item(let offer, var content, let endsBatch):
            buffer.writeInteger(UInt8(endsBatch ? 1 : 0))
            buffer.writeOffer(offer)
            buffer.writeBuffer(&content)
        case .progress(let id, let bytes):
            buffer.writeUUID(id)
            buffer.writeInteger(bytes)
        case .answer(let id, let answer):
            buffer.writeUUID(id)
            switch answer {
            case .nothing:
                buffer.writeInteger(UInt8(0))
            case .partial(let offset, let digest):
                buffer.writeInteger(UInt8(1))
                buffer.writeInteger(offset)
                buffer.writeBytes(digest)
            case .complete:
                buffer.writeInteger(UInt8(2))
            case .refused(let reason):
                buffer.writeInteger(UInt8(3))
                buffer.writeInteger(reason.rawValue)
            }
        case .start(let id, let offset):
            buffer.writeUUID(id)
            buffer.writeInteger(offset)
        case .data(var bytes):
            buffer.writeBuffer(&bytes)
        case .end(let id), .ack(let id):
            buffer.writeUUID(id)
        case .reject(let id, let failure):
            buffer.writeUUID(id)
            buffer.writeInteger(failure.rawValue)
        case .done:
            break
        case .welcome(let version, let maximum, let window, let linger):
            buffer.writeInteger(version)
            buffer.writeInteger(maximum)
            if let window { buffer.writeInteger(window) }
            if let linger { buffer.writeInteger(linger) }
        case .error(let code, let reason):
            buffer.writeInteger(code.rawValue)
            buffer.writeString(reason)
        }
        buffer.setInteger(UInt32(buffer.writerIndex - payloadStart), at: headerIndex + 1)
    }

    /// Appends a frame header: the type byte and the payload's length (big-endian `UInt32`).
    static func writeHeader(type: FrameType, length: Int, into buffer: inout ByteBuffer) {
        buffer.writeInteger(type.rawValue)
        buffer.writeInteger(UInt32(truncatingIfNeeded: length))
    }

    /// Reads one frame from the front of `buffer`. Returns `nil` (consuming nothing) when the frame is not
    /// complete yet; throws ``DeliveryProtocolError`` for a frame that can never be valid. A payload length
    /// above the limit is rejected from the header alone, so at most one bounded frame is ever buffered.
    package static func decode(from buffer: inout ByteBuffer, limits: DeliveryLimits) throws -> DeliveryFrame? {
        guard let header = try peekHeader(in: buffer, limits: limits) else { return nil }
        return try decode(from: &buffer, header: header, limits: limits)
    }

    /// ``decode(from:limits:)`` once `header` (the front frame's, from ``peekHeader(in:limits:)``) is known.
    static func decode(from buffer: inout ByteBuffer, header: (type: FrameType, length: Int),
                       limits: DeliveryLimits) throws -> DeliveryFrame? {
        guard buffer.readableBytes >= headerBytes + header.length else { return nil }
        buffer.moveReaderIndex(forwardBy: headerBytes)
        guard var payload = buffer.readSlice(length: header.length) else { return nil }
        let frame = try parsePayload(type: header.type, &payload, limits: limits)
        guard payload.readableBytes == 0 || Mutant.deliveryIgnoresTrailingBytes.isActive else {
            throw DeliveryProtocolError.malformedFrame(type: frame.name, reason: "\(payload.readableBytes) trailing bytes")
        }
        return frame
    }

    /// The type and payload length of the frame at the front of `buffer` (consuming nothing), `nil` while
    /// its header is incomplete; throws for an unknown type or a length over the limit.
    static func peekHeader(in buffer: ByteBuffer, limits: DeliveryLimits) throws -> (type: FrameType, length: Int)? {
        guard let typeByte = buffer.getInteger(at: buffer.readerIndex, as: UInt8.self),
              let length32 = buffer.getInteger(at: buffer.readerIndex + 1, as: UInt32.self)
        else { return nil }
        guard let type = FrameType(rawValue: typeByte) else { throw DeliveryProtocolError.unknownFrameType(typeByte) }
        let length = Int(length32)
        guard length <= limits.maxFramePayloadBytes || Mutant.deliveryUnboundedFrames.isActive else {
            throw DeliveryProtocolError.frameTooLarge(length: length, limit: limits.maxFramePayloadBytes)
        }
        return (type, length)
    }

    private static func parsePayload(type: FrameType, _ payload: inout ByteBuffer, limits: DeliveryLimits) throws -> DeliveryFrame {
        var reader = PayloadReader(buffer: payload, type: type)
        defer { payload = reader.buffer }
        switch type {
        case .hello:
            return .hello(version: try reader.integer())
        case .offer:
            return .offer(try reader.offer(limits: limits))
        case .item:
            let flags: UInt8 = try reader.integer()
            guard flags <= 1 else { throw reader.malformed("unknown flags \(flags)") }
            let offer = try reader.offer(limits: limits)
            guard offer.kind == .text else { throw reader.malformed("an item frame carries a text, not a file") }
            guard UInt64(reader.buffer.readableBytes) == offer.size else {
                throw reader.malformed("\(reader.buffer.readableBytes) content bytes for an item of \(offer.size)")
            }
            let content = reader.buffer
            reader.buffer.moveReaderIndex(to: reader.buffer.writerIndex)
            return .item(offer, content: content, endsBatch: flags == 1)
        case .progress:
            let id = try reader.uuid()
            return .progress(id: id, bytes: try reader.integer())
        case .answer:
            let id = try reader.uuid()
            let code: UInt8 = try reader.integer()
            switch code {
            case 0: return .answer(id: id, .nothing)
            case 1:
                let offset: UInt64 = try reader.integer()
                return .answer(id: id, .partial(offset: offset, prefixSHA256: try reader.bytes(32)))
            case 2: return .answer(id: id, .complete)
            case 3:
                let reasonByte: UInt8 = try reader.integer()
                guard let reason = ItemRefusal(rawValue: reasonByte) else { throw reader.malformed("unknown refusal \(reasonByte)") }
                return .answer(id: id, .refused(reason))
            default:
                throw reader.malformed("unknown answer code \(code)")
            }
        case .start:
            let id = try reader.uuid()
            return .start(id: id, offset: try reader.integer())
        case .data:
            guard reader.buffer.readableBytes > 0 || Mutant.deliveryAcceptsEmptyData.isActive else { throw reader.malformed("empty data") }
            let bytes = reader.buffer
            reader.buffer.moveReaderIndex(to: reader.buffer.writerIndex)
            return .data(bytes)
        case .end:
            return .end(id: try reader.uuid())
        case .ack:
            return .ack(id: try reader.uuid())
        case .reject:
            let id = try reader.uuid()
            let failureByte: UInt8 = try reader.integer()
            guard let failure = TransferFailure(rawValue: failureByte) else { throw reader.malformed("unknown failure \(failureByte)") }
            return .reject(id: id, failure)
        case .done:
            return .done
        case .welcome:
            let version: UInt8 = try reader.integer()
            let maximum: UInt32 = try reader.integer()
            // Version 3 and later add the progress window; version 2 has none.
            let window: UInt32? = version >= progressVersion ? try reader.integer() : nil
            // Version 5 and later add how long the receiver waits once everything is answered.
            let linger: UInt32? = version >= DeliveryFrame.lingerVersion ? try reader.integer() : nil
            return .welcome(version: version, maxFramePayloadBytes: maximum, progressWindowBytes: window, lingerMilliseconds: linger)
        case .error:
            let code = DeliveryErrorCode(rawValue: try reader.integer())
            let reason = reader.buffer.readableBytesView
            guard reason.count <= maximumErrorReasonBytes else { throw reader.malformed("reason of \(reason.count) bytes") }
            guard let text = String(validating: reason, as: UTF8.self) else { throw reader.malformed("reason is not UTF-8") }
            reader.buffer.moveReaderIndex(to: reader.buffer.writerIndex)
            return .error(code: code, reason: text)
        }
    }

    var frameType: FrameType {
        switch self {
        case .hello: .hello
        case .offer: .offer
        case .answer: .answer
        case .start: .start
        case .data: .data
        case .end: .end
        case .ack: .ack
        case .reject: .reject
        case .done: .done
        case .welcome: .welcome
        case .error: .error
        case .progress: .progress
        case .item: .item
        }
    }
}

/// Reads fields from one frame's payload, turning a short payload into a typed error.
private struct PayloadReader {
    var buffer: ByteBuffer
    let type: DeliveryFrame.FrameType

    func malformed(_ reason: String) -> DeliveryProtocolError {
        .malformedFrame(type: "\(type)", reason: reason)
    }

    mutating func integer<T: FixedWidthInteger>() throws -> T {
        guard let value = buffer.readInteger(as: T.self) else { throw malformed("truncated") }
        return value
    }

    mutating func bytes(_ count: Int) throws -> [UInt8] {
        guard let bytes = buffer.readBytes(length: count) else { throw malformed("truncated") }
        return bytes
    }

    /// An offer's fields (in an `offer` or an `item` frame).
    mutating func offer(limits: DeliveryLimits) throws -> ItemOffer {
        let id = try uuid()
        let kindByte: UInt8 = try integer()
        guard let kind = ItemKind(wireCode: kindByte) else { throw malformed("unknown item kind \(kindByte)") }
        let size: UInt64 = try integer()
        let digest = try bytes(32)
        let created: UInt64 = try integer()
        let expires: UInt64 = try integer()
        let nameLength = Int(try integer() as UInt16)
        guard nameLength <= limits.maxNameBytes else {
            throw DeliveryProtocolError.nameTooLong(length: nameLength, limit: limits.maxNameBytes)
        }
        let nameBytes = try bytes(nameLength)
        guard let name = String(validating: nameBytes, as: UTF8.self) else { throw malformed("name is not UTF-8") }
        return ItemOffer(id: id, kind: kind, size: size, sha256: digest, createdMilliseconds: created,
                         expiresMilliseconds: expires, name: name)
    }

    mutating func uuid() throws -> UUID {
        let b = try bytes(16)
        return UUID(uuid: (b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
                           b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]))
    }
}

extension ByteBuffer {
    mutating func writeUUID(_ id: UUID) {
        withUnsafeBytes(of: id.uuid) { _ = writeBytes($0) }
    }

    mutating func writeOffer(_ offer: ItemOffer) {
        writeUUID(offer.id)
        writeInteger(offer.kind.wireCode)
        writeInteger(offer.size)
        writeBytes(offer.sha256)
        writeInteger(offer.createdMilliseconds)
        writeInteger(offer.expiresMilliseconds)
        let name = Array(offer.name.utf8)
        writeInteger(UInt16(truncatingIfNeeded: name.count))
        writeBytes(name)
    }
}

/// Splits a byte stream into ``DeliveryFrame``s, enforcing ``DeliveryLimits``. Only moves bytes: the
/// protocol logic is in ``DeliverySenderStateMachine`` and ``DeliveryReceiverStateMachine``.
///
/// A data frame's payload is passed on as it arrives by default, as `.data` pieces that together make
/// up the frame's payload: a receiver then hashes and writes the bytes where the read put them, where
/// gathering a frame whole would copy it (a 32 KiB frame spans several reads, and inside PSK-TLS
/// several 16 KiB records). Every other frame, and every data frame in ``DataDelivery/wholeFrames``
/// mode (for tools that grade frame sizes), is passed on whole once all of it is there.
package struct DeliveryFrameDecoder: ByteToMessageDecoder {
    package typealias InboundOut = DeliveryFrame

    /// How the payload of a data frame is passed on.
    package enum DataDelivery: Sendable, Hashable {
        /// As it arrives: one `.data` per piece of the frame a read brought, none of them empty.
        case piecesAsTheyArrive
        /// One `.data` per frame, once its whole payload is there.
        case wholeFrames
    }

    /// The limits applied to every frame.
    package let limits: DeliveryLimits
    /// How data payloads are passed on.
    package let dataDelivery: DataDelivery
    /// Bytes of the current data frame's payload not yet passed on (pieces mode; 0 between frames).
    package private(set) var pendingDataBytes = 0

    /// Creates a decoder with `limits` that passes data payloads on as `dataDelivery` says.
    package init(limits: DeliveryLimits, dataDelivery: DataDelivery = .piecesAsTheyArrive) {
        self.limits = limits
        self.dataDelivery = dataDelivery
    }

    /// The next frame, or the next piece of a data frame's payload, from the front of `buffer`; `nil`
    /// (having consumed at most a data frame's header) when more bytes are needed. Throws
    /// ``DeliveryProtocolError`` for a frame that can never be valid.
    package mutating func next(from buffer: inout ByteBuffer) throws -> DeliveryFrame? {
        if pendingDataBytes > 0 {
            let count = min(pendingDataBytes, buffer.readableBytes)
            guard count > 0, let piece = buffer.readSlice(length: count) else { return nil }
            pendingDataBytes -= count
            return .data(piece)
        }
        guard let header = try DeliveryFrame.peekHeader(in: buffer, limits: limits) else { return nil }
        guard dataDelivery == .piecesAsTheyArrive, header.type == .data, header.length > 0 else {
            // Whole frames, and an empty data frame (which the decoder rejects, or the mutant passes on).
            return try DeliveryFrame.decode(from: &buffer, header: header, limits: limits)
        }
        buffer.moveReaderIndex(forwardBy: DeliveryFrame.headerBytes)
        pendingDataBytes = header.length
        return try next(from: &buffer)
    }

    package mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        guard let frame = try next(from: &buffer) else { return .needMoreData }
        context.fireChannelRead(wrapInboundOut(frame))
        return .continue
    }

    package mutating func decodeLast(context: ChannelHandlerContext, buffer: inout ByteBuffer, seenEOF: Bool) throws -> DecodingState {
        // A truncated last frame is dropped (of a data frame, what arrived was passed on): the session
        // notices the missing frames and fails cleanly.
        while try decode(context: context, buffer: &buffer) == .continue {}
        return .needMoreData
    }
}

/// Serialises ``DeliveryFrame``s onto the byte stream. A data frame goes out as two writes, its header
/// and then its payload as it is (gathered into one vector write by the socket, or framed as they come by
/// a multiplexer stream): encoding it into one buffer would copy every content byte sent.
package final class DeliveryFrameEncoder: ChannelOutboundHandler, RemovableChannelHandler, Sendable {
    /// The frames to encode.
    package typealias OutboundIn = DeliveryFrame
    /// Their bytes.
    package typealias OutboundOut = ByteBuffer

    /// Bytes reserved for a frame other than data (most are far smaller; a larger one grows the buffer).
    private static let initialFrameCapacity = 128

    /// Creates an encoder.
    package init() {}

    package func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let frame = unwrapOutboundIn(data)
        if case .data(let payload) = frame, payload.readableBytes > 0 {
            var header = context.channel.allocator.buffer(capacity: DeliveryFrame.headerBytes)
            DeliveryFrame.writeHeader(type: .data, length: payload.readableBytes, into: &header)
            context.write(wrapOutboundOut(header), promise: nil)
            context.write(wrapOutboundOut(payload), promise: promise)
            return
        }
        var buffer = context.channel.allocator.buffer(capacity: Self.initialFrameCapacity)
        frame.encode(into: &buffer)
        context.write(wrapOutboundOut(buffer), promise: promise)
    }
}
