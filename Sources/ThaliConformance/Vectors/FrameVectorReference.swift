import Foundation
import NIOCore
import TCPMultiplexer
import ThaliBLEBinding
import ThaliBeacons
import ThaliNodeCore
import ThaliSupport

/// This implementation's answers to frame vectors: its own decoders read each case's bytes, fed in
/// pieces of `split` bytes (1 by default, the most awkward cut), and its encoders write each valid case's
/// frames. `thali-node conformance vectors answer` prints them, as the example of what an implementation
/// under test writes; the tests grade them like anyone's.
public enum FrameVectorReference {
    /// The name answers carry.
    public static let implementation = "thali-node (Swift)"

    /// Answers to every case of `set`.
    public static func answers(to set: FrameVectorSet, split: Int = 1) -> FrameVectorAnswers {
        FrameVectorAnswers(layer: set.layer, implementation: implementation, answers: set.cases.map { vector in
            var answer = decode(Hex.decode(vector.bytes) ?? [], layer: set.layer, limits: set.limits, split: split)
            answer.id = vector.id
            if set.layer.framesDetermineBytes, vector.expect == .valid, answer.result == .valid, let frames = vector.frames {
                answer.encoded = (try? encode(frames, layer: set.layer)).map { Hex.encode($0) }
            }
            return answer
        })
    }

    /// What this implementation's decoder for `layer` makes of `bytes` read as the start of a connection,
    /// fed `split` bytes at a time.
    public static func decode(_ bytes: [UInt8], layer: FrameVectorLayer, limits: [String: Int], split: Int = 1) -> FrameVectorAnswer {
        var reader: any FrameReading
        switch layer {
        case .delivery: reader = DeliveryReading(limits: limits)
        case .yamux: reader = YamuxReading(limits: limits)
        case .thaliMultiplex: reader = ThaliMultiplexReading(limits: limits)
        case .advertisingData: reader = AdvertisingDataReading(limits: limits)
        }
        var frames: [FrameFields] = []
        var offset = 0
        let step = max(split, 1)
        repeat {
            let piece = Array(bytes[offset..<min(offset + step, bytes.count)])
            offset += piece.count
            do {
                try reader.feed(piece, into: &frames)
            } catch {
                return FrameVectorAnswer(id: "", result: .invalid, frames: frames, error: "\(error)")
            }
        } while offset < bytes.count
        do {
            try reader.finish(into: &frames)
        } catch {
            return FrameVectorAnswer(id: "", result: .invalid, frames: frames, error: "\(error)")
        }
        return FrameVectorAnswer(id: "", result: reader.isMidFrame ? .incomplete : .valid, frames: frames)
    }

    /// The bytes this implementation's encoder for `layer` writes for `frames` (for a layer whose frames
    /// determine the bytes; an advertising payload's claim does not, and throws).
    public static func encode(_ frames: [FrameFields], layer: FrameVectorLayer) throws(FrameVectorError) -> [UInt8] {
        var buffer = ByteBuffer()
        for fields in frames {
            var frame = FieldReader(fields: fields)
            switch layer {
            case .delivery:
                try DeliveryReading.frame(&frame).encode(into: &buffer)
            case .yamux:
                guard let type = YamuxReading.types.first(where: { $0.value == frame.fields["type"] })?.key else {
                    throw FrameVectorError(description: "unknown yamux type \(frame.fields["type"] ?? "none")")
                }
                YamuxHeader(type: type, flags: .init(rawValue: try frame.integer("flags")), streamID: try frame.integer("stream_id"),
                            length: try frame.integer("length")).write(to: &buffer)
                if type == .data { buffer.writeBytes(try frame.bytes("body")) }
            case .advertisingData:
                throw FrameVectorError(description: "an advertising payload's claim does not determine its bytes")
            case .thaliMultiplex:
                let body = try frame.bytes("body")
                guard let flag = ThaliMultiplexHeader.Flag(rawValue: try frame.integer("flag")),
                      case let id: UInt64 = try frame.integer("stream_id"), id <= ThaliMultiplexHeader.maxStreamID else {
                    throw FrameVectorError(description: "not a thali-multiplex header: \(fields)")
                }
                ThaliMultiplexHeader(streamID: id, flag: flag, length: body.count).write(to: &buffer)
                buffer.writeBytes(body)
            }
        }
        return Array(buffer.readableBytesView)
    }
}

/// A decoder fed bytes, handing out whole frames as fields.
private protocol FrameReading {
    /// Appends the whole frames that `bytes` complete to `frames`; throws on a protocol error (the frames
    /// before it already appended).
    mutating func feed(_ bytes: [UInt8], into frames: inout [FrameFields]) throws
    /// Whether bytes of an unfinished frame are held.
    var isMidFrame: Bool { get }
    /// The input ended: appends what only the whole input shows (a message read whole); throws if it
    /// is not valid.
    mutating func finish(into frames: inout [FrameFields]) throws
}

extension FrameReading {
    /// A stream's frames are all handed out as they complete.
    mutating func finish(into frames: inout [FrameFields]) throws {}
}

/// Frame fields read back into values, with the field named in every error.
private struct FieldReader {
    let fields: FrameFields

    func string(_ name: String) throws(FrameVectorError) -> String {
        guard let value = fields[name] else { throw FrameVectorError(description: "frame \(fields) has no \(name)") }
        return value
    }

    func integer<T: FixedWidthInteger>(_ name: String) throws(FrameVectorError) -> T {
        guard let value = T(try string(name)) else { throw FrameVectorError(description: "\(name) of \(fields) is not a \(T.self)") }
        return value
    }

    func bytes(_ name: String) throws(FrameVectorError) -> [UInt8] {
        guard let value = Hex.decode(try string(name)) else { throw FrameVectorError(description: "\(name) of \(fields) is not hex") }
        return value
    }

    func uuid(_ name: String) throws(FrameVectorError) -> UUID {
        let raw = try bytes(name)
        guard raw.count == 16 else { throw FrameVectorError(description: "\(name) of \(fields) is not 16 bytes") }
        return UUID(uuid: (raw[0], raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], raw[7],
                           raw[8], raw[9], raw[10], raw[11], raw[12], raw[13], raw[14], raw[15]))
    }
}

private struct DeliveryReading: FrameReading {
    let limits: DeliveryLimits
    var buffer = ByteBuffer()

    init(limits: [String: Int]) {
        self.limits = DeliveryLimits(maxFramePayloadBytes: limits["max_frame_payload_bytes"] ?? DeliveryLimits.default.maxFramePayloadBytes)
    }

    var isMidFrame: Bool { buffer.readableBytes > 0 }

    mutating func feed(_ bytes: [UInt8], into frames: inout [FrameFields]) throws {
        buffer.writeBytes(bytes)
        while let frame = try DeliveryFrame.decode(from: &buffer, limits: limits) { frames.append(Self.fields(frame)) }
    }

    static func hex(_ id: UUID) -> String { withUnsafeBytes(of: id.uuid) { Hex.encode($0) } }

    static func fields(_ frame: DeliveryFrame) -> FrameFields {
        var fields = ["type": frame.name]
        switch frame {
        case .hello(let version):
            fields["version"] = "\(version)"
        case .welcome(let version, let maximum, let window, let linger):
            fields["version"] = "\(version)"
            fields["max_frame_payload_bytes"] = "\(maximum)"
            if let window { fields["progress_window_bytes"] = "\(window)" }
            if let linger { fields["linger_ms"] = "\(linger)" }
        case .progress(let id, let bytes):
            fields["id"] = hex(id)
            fields["bytes"] = "\(bytes)"
        case .item(let offer, let content, let endsBatch):
            fields.merge(Self.offerFields(offer)) { $1 }
            fields["ends_batch"] = endsBatch ? "true" : "false"
            fields["content"] = Hex.encode(content.readableBytesView)
        case .error(let code, let reason):
            fields["code"] = "\(code.rawValue)"
            fields["reason"] = reason
        case .offer(let offer):
            fields.merge(Self.offerFields(offer)) { $1 }
        case .answer(let id, let answer):
            fields["id"] = hex(id)
            switch answer {
            case .nothing: fields["answer"] = "nothing"
            case .partial(let offset, let digest):
                fields["answer"] = "partial"
                fields["offset"] = "\(offset)"
                fields["prefix_sha256"] = Hex.encode(digest)
            case .complete: fields["answer"] = "complete"
            case .refused(let reason):
                fields["answer"] = "refused"
                fields["reason"] = "\(reason.rawValue)"
            }
        case .start(let id, let offset):
            fields["id"] = hex(id)
            fields["offset"] = "\(offset)"
        case .data(let bytes):
            fields["body"] = Hex.encode(bytes.readableBytesView)
        case .end(let id), .ack(let id):
            fields["id"] = hex(id)
        case .reject(let id, let failure):
            fields["id"] = hex(id)
            fields["reason"] = "\(failure.rawValue)"
        case .done:
            break
        }
        return fields
    }

    static func offerFields(_ offer: ItemOffer) -> FrameFields {
        ["id": hex(offer.id), "kind": offer.kind.rawValue, "size": "\(offer.size)", "sha256": Hex.encode(offer.sha256),
         "created_ms": "\(offer.createdMilliseconds)", "expires_ms": "\(offer.expiresMilliseconds)", "name": offer.name]
    }

    static func offer(_ fields: inout FieldReader) throws(FrameVectorError) -> ItemOffer {
        guard let kind = ItemKind(rawValue: try fields.string("kind")) else { throw FrameVectorError(description: "unknown kind in \(fields.fields)") }
        return ItemOffer(id: try fields.uuid("id"), kind: kind, size: try fields.integer("size"), sha256: try fields.bytes("sha256"),
                         createdMilliseconds: try fields.integer("created_ms"), expiresMilliseconds: try fields.integer("expires_ms"),
                         name: try fields.string("name"))
    }

    static func frame(_ fields: inout FieldReader) throws(FrameVectorError) -> DeliveryFrame {
        let type = try fields.string("type")
        switch type {
        case "hello": return .hello(version: try fields.integer("version"))
        case "welcome":
            let window: UInt32? = fields.fields["progress_window_bytes"] == nil ? nil : try fields.integer("progress_window_bytes")
            let linger: UInt32? = fields.fields["linger_ms"] == nil ? nil : try fields.integer("linger_ms")
            return .welcome(version: try fields.integer("version"), maxFramePayloadBytes: try fields.integer("max_frame_payload_bytes"),
                            progressWindowBytes: window, lingerMilliseconds: linger)
        case "progress": return .progress(id: try fields.uuid("id"), bytes: try fields.integer("bytes"))
        case "item":
            return .item(try offer(&fields), content: ByteBuffer(bytes: try fields.bytes("content")),
                         endsBatch: try fields.string("ends_batch") == "true")
        case "error": return .error(code: DeliveryErrorCode(rawValue: try fields.integer("code")), reason: try fields.string("reason"))
        case "offer": return .offer(try offer(&fields))
        case "answer":
            let id = try fields.uuid("id")
            switch try fields.string("answer") {
            case "nothing": return .answer(id: id, .nothing)
            case "partial": return .answer(id: id, .partial(offset: try fields.integer("offset"), prefixSHA256: try fields.bytes("prefix_sha256")))
            case "complete": return .answer(id: id, .complete)
            case "refused":
                guard let reason = ItemRefusal(rawValue: try fields.integer("reason")) else { break }
                return .answer(id: id, .refused(reason))
            default: break
            }
            throw FrameVectorError(description: "unknown answer in \(fields.fields)")
        case "start": return .start(id: try fields.uuid("id"), offset: try fields.integer("offset"))
        case "data": return .data(ByteBuffer(bytes: try fields.bytes("body")))
        case "end": return .end(id: try fields.uuid("id"))
        case "ack": return .ack(id: try fields.uuid("id"))
        case "reject":
            guard let failure = TransferFailure(rawValue: try fields.integer("reason")) else {
                throw FrameVectorError(description: "unknown reject reason in \(fields.fields)")
            }
            return .reject(id: try fields.uuid("id"), failure)
        case "done": return .done
        default: throw FrameVectorError(description: "unknown delivery frame type \(type)")
        }
    }
}

private struct YamuxReading: FrameReading {
    static let types: [YamuxHeader.FrameType: String] = [.data: "data", .windowUpdate: "window-update", .ping: "ping", .goAway: "go-away"]

    var decoder: YamuxFrameDecoder
    var open: (header: YamuxHeader, body: [UInt8])?

    init(limits: [String: Int]) {
        decoder = YamuxFrameDecoder(maxDataLength: limits["max_data_length"] ?? YamuxHeader.initialWindowSize)
    }

    var isMidFrame: Bool { open != nil || decoder.isMidFrame }

    mutating func feed(_ bytes: [UInt8], into frames: inout [FrameFields]) throws {
        decoder.feed(ByteBuffer(bytes: bytes))
        while let event = try decoder.next() {
            switch event {
            case .header(let header) where header.type == .data:
                open = (header, [])
            case .header(let header):
                frames.append(Self.fields(header, body: nil))
            case .data(let piece):
                open?.body += piece.readableBytesView
            }
            if let (header, body) = open, body.count == Int(header.length) {
                frames.append(Self.fields(header, body: body))
                open = nil
            }
        }
    }

    static func fields(_ header: YamuxHeader, body: [UInt8]?) -> FrameFields {
        var fields = ["type": types[header.type] ?? "\(header.type.rawValue)", "flags": "\(header.flags.rawValue)",
                      "stream_id": "\(header.streamID)", "length": "\(header.length)"]
        if let body { fields["body"] = Hex.encode(body) }
        return fields
    }
}

private struct ThaliMultiplexReading: FrameReading {
    var decoder: ThaliMultiplexFrameDecoder
    var open: (header: ThaliMultiplexHeader, body: [UInt8])?

    init(limits: [String: Int]) {
        decoder = ThaliMultiplexFrameDecoder(maxPayloadLength: limits["max_payload_bytes"] ?? ThaliMultiplexFrameDecoder.defaultMaxPayloadLength)
    }

    var isMidFrame: Bool { open != nil || decoder.isMidFrame }

    mutating func feed(_ bytes: [UInt8], into frames: inout [FrameFields]) throws {
        decoder.feed(ByteBuffer(bytes: bytes))
        while let event = try decoder.next() {
            switch event {
            case .header(let header, let body?):
                frames.append(Self.fields(header, body: Array(body.readableBytesView)))
            case .header(let header, nil):
                open = (header, [])
            case .data(let piece):
                open?.body += piece.readableBytesView
            }
            if let (header, body) = open, body.count == header.length {
                frames.append(Self.fields(header, body: body))
                open = nil
            }
        }
    }

    static func fields(_ header: ThaliMultiplexHeader, body: [UInt8]) -> FrameFields {
        ["stream_id": "\(header.streamID)", "flag": "\(header.flag.rawValue)", "body": Hex.encode(body)]
    }
}

/// An advertising payload, collected whole and then decoded as a receiver does: the Thali claim, if
/// any, as one frame; a well-formed payload without one is valid and holds none.
private struct AdvertisingDataReading: FrameReading {
    let maximumLength: Int
    var payload: [UInt8] = []

    init(limits: [String: Int]) {
        maximumLength = limits["max_payload_bytes"] ?? AdvertisingData.legacyMaximumLength
    }

    var isMidFrame: Bool { false }

    mutating func feed(_ bytes: [UInt8], into frames: inout [FrameFields]) throws {
        // Bounded like the radio: nothing past the maximum is kept (the decoder then reports it too long).
        payload += bytes.prefix(maximumLength + 1 - min(payload.count, maximumLength + 1))
    }

    mutating func finish(into frames: inout [FrameFields]) throws {
        do {
            frames.append(Self.fields(try ThaliAdvertisement.decode(advertisingData: payload, maximumLength: maximumLength)))
        } catch where error.reason == .notThali {
            return  // well formed and not Thali's: ignored
        }
    }

    static func fields(_ advertisement: ThaliAdvertisement) -> FrameFields {
        var fields = ["form": advertisement.encoding == .serviceData ? "service-data" : "manufacturer-data",
                      "generation": "\(advertisement.generation)"]
        switch advertisement.payload {
        case .bluetoothAddress(let address):
            fields["claim"] = "bluetooth-address"
            fields["address"] = address.description
        case .iOSDevice:
            fields["claim"] = "ios-device"
        }
        return fields
    }
}
