import Foundation
import ThaliBeacons
import ThaliSupport

/// The frame vector sets published in `spec/vectors/` (`thali-node conformance vectors emit` writes them).
///
/// Every case's bytes are laid out here by hand, field by field, from the tables of `spec/node.md`,
/// `spec/multiplexer.md` and `spec/ble-binding.md` (AdvertisingDataVectors.swift), and its expected
/// frames are written from the same field values: none of it comes from this implementation's encoders
/// or decoders, which the vectors then check like any other.
public enum FrameVectorSets {
    /// Every set, one per framing.
    public static var all: [FrameVectorSet] { [delivery, yamux, thaliMultiplex, advertisingData] }

    /// The set of `layer`.
    public static func set(_ layer: FrameVectorLayer) -> FrameVectorSet {
        switch layer {
        case .delivery: delivery
        case .yamux: yamux
        case .thaliMultiplex: thaliMultiplex
        case .advertisingData: advertisingData
        }
    }

    /// Every conformance case the sets define, for the requirement catalog's checks.
    public static var cases: [ConformanceCase] { all.flatMap { set in set.cases.map(set.conformanceCase) } }

    static let source = "Laid out by hand from the frame tables of spec/ (FrameVectorSets.swift), not by an encoder."

    // MARK: - Delivery

    /// Delivery frames (spec/node.md, "Delivery protocol"), read as a receiver with the default
    /// `maxFramePayloadBytes` of 65,536 reads them.
    public static var delivery: FrameVectorSet {
        let id = Array(0..<16 as Range<UInt8>)
        let idHex = hex(id)
        let digest = sha256Hello
        let created: UInt64 = 1_763_700_000_000
        let expires: UInt64 = 1_764_304_800_000
        func frame(_ type: UInt8, _ payload: [UInt8]) -> [UInt8] { [type] + be(UInt32(payload.count)) + payload }
        func offer(kind: UInt8, size: UInt64, name: [UInt8], nameLength: UInt16? = nil) -> [UInt8] {
            frame(2, id + [kind] + be(size) + digest + be(created) + be(expires) + be(nameLength ?? UInt16(name.count)) + name)
        }
        func item(flags: UInt8, kind: UInt8, size: UInt64, content: [UInt8]) -> [UInt8] {
            frame(13, [flags] + id + [kind] + be(size) + digest + be(created) + be(expires) + be(UInt16(0)) + content)
        }
        let layout = ["NODE-1.1", "NODE-1.3"]
        let malformed = ["NODE-1.2"]
        let resume = Array("résumé.pdf".utf8)
        let reason = "frame payload of 32768 bytes exceeds the limit of 1024"
        let hello = frame(1, [2])
        let offerText = offer(kind: 0, size: 5, name: [])
        let offerFields: FrameFields = ["type": "offer", "id": idHex, "kind": "text", "size": "5", "sha256": hex(digest),
                                        "created_ms": "\(created)", "expires_ms": "\(expires)", "name": ""]
        var cases: [FrameVectorCase] = [
            .init(id: "D-hello-2", description: "hello, version 2", requirements: layout,
                  bytes: hello, expect: .valid, frames: [["type": "hello", "version": "2"]]),
            .init(id: "D-hello-1", description: "hello, version 1 (an older sender)", requirements: layout,
                  bytes: frame(1, [1]), expect: .valid, frames: [["type": "hello", "version": "1"]]),
            .init(id: "D-welcome", description: "welcome: version 2, frame maximum 65,536", requirements: layout,
                  bytes: frame(10, [2] + be(UInt32(65_536))), expect: .valid,
                  frames: [["type": "welcome", "version": "2", "max_frame_payload_bytes": "65536"]]),
            .init(id: "D-error", description: "error: code 2 (frame too large) and its reason", requirements: layout,
                  bytes: frame(11, [2] + Array(reason.utf8)), expect: .valid,
                  frames: [["type": "error", "code": "2", "reason": reason]]),
            .init(id: "D-error-unnamed-code", description: "error with a code this version does not name, no reason",
                  requirements: layout, bytes: frame(11, [9]), expect: .valid,
                  frames: [["type": "error", "code": "9", "reason": ""]]),
            .init(id: "D-offer-text", description: "offer of a 5-byte text, no name", requirements: layout,
                  bytes: offerText, expect: .valid, frames: [offerFields]),
            .init(id: "D-offer-file", description: "offer of a 1 MiB file with a non-ASCII name", requirements: layout,
                  bytes: offer(kind: 1, size: 1 << 20, name: resume), expect: .valid,
                  frames: [offerFields.merging(["kind": "file", "size": "1048576", "name": "résumé.pdf"]) { $1 }]),
            .init(id: "D-answer-nothing", description: "answer: nothing", requirements: layout,
                  bytes: frame(3, id + [0]), expect: .valid, frames: [["type": "answer", "id": idHex, "answer": "nothing"]]),
            .init(id: "D-answer-partial", description: "answer: partial, 4,096 bytes and their digest", requirements: layout,
                  bytes: frame(3, id + [1] + be(UInt64(4096)) + digest), expect: .valid,
                  frames: [["type": "answer", "id": idHex, "answer": "partial", "offset": "4096", "prefix_sha256": hex(digest)]]),
            .init(id: "D-answer-complete", description: "answer: complete", requirements: layout,
                  bytes: frame(3, id + [2]), expect: .valid, frames: [["type": "answer", "id": idHex, "answer": "complete"]]),
            .init(id: "D-answer-refused", description: "answer: refused, expired (3)", requirements: layout,
                  bytes: frame(3, id + [3, 3]), expect: .valid,
                  frames: [["type": "answer", "id": idHex, "answer": "refused", "reason": "3"]]),
            .init(id: "D-start", description: "start at offset 4,096", requirements: layout,
                  bytes: frame(4, id + be(UInt64(4096))), expect: .valid, frames: [["type": "start", "id": idHex, "offset": "4096"]]),
            .init(id: "D-data-1", description: "data, one byte", requirements: layout,
                  bytes: frame(5, [0]), expect: .valid, frames: [["type": "data", "body": "00"]]),
            .init(id: "D-data-256", description: "data, the 256 byte values", requirements: layout,
                  bytes: frame(5, Array(0...255)), expect: .valid, frames: [["type": "data", "body": hex(Array(0...255))]]),
            .init(id: "D-end", description: "end", requirements: layout,
                  bytes: frame(6, id), expect: .valid, frames: [["type": "end", "id": idHex]]),
            .init(id: "D-ack", description: "ack", requirements: layout,
                  bytes: frame(7, id), expect: .valid, frames: [["type": "ack", "id": idHex]]),
            .init(id: "D-reject", description: "reject, digest mismatch (1)", requirements: layout,
                  bytes: frame(8, id + [1]), expect: .valid, frames: [["type": "reject", "id": idHex, "reason": "1"]]),
            .init(id: "D-done", description: "done", requirements: layout,
                  bytes: frame(9, []), expect: .valid, frames: [["type": "done"]]),
            .init(id: "D-session", description: "a sender's whole session: hello, offer, start, data, end, done",
                  requirements: layout,
                  bytes: hello + offerText + frame(4, id + be(UInt64(0))) + frame(5, Array("hello".utf8)) + frame(6, id) + frame(9, []),
                  expect: .valid,
                  frames: [["type": "hello", "version": "2"], offerFields, ["type": "start", "id": idHex, "offset": "0"],
                           ["type": "data", "body": hex(Array("hello".utf8))], ["type": "end", "id": idHex], ["type": "done"]]),
            .init(id: "D-welcome-3", description: "welcome, version 3: frame maximum 65,536 and a progress window of 256 KiB",
                  requirements: layout, bytes: frame(10, [3] + be(UInt32(65_536)) + be(UInt32(262_144))), expect: .valid,
                  frames: [["type": "welcome", "version": "3", "max_frame_payload_bytes": "65536", "progress_window_bytes": "262144"]]),
            .init(id: "D-welcome-5", description: "welcome, version 5: frame maximum 65,536, a progress window of 256 KiB and a linger of 30 s",
                  requirements: layout, bytes: frame(10, [5] + be(UInt32(65_536)) + be(UInt32(262_144)) + be(UInt32(30_000))), expect: .valid,
                  frames: [["type": "welcome", "version": "5", "max_frame_payload_bytes": "65536", "progress_window_bytes": "262144",
                            "linger_ms": "30000"]]),
            .init(id: "D-progress", description: "progress (version 3): 1 MiB of the item written", requirements: layout,
                  bytes: frame(12, id + be(UInt64(1 << 20))), expect: .valid, frames: [["type": "progress", "id": idHex, "bytes": "1048576"]]),
            .init(id: "D-item", description: "item (version 3): the last text of a batch, with its 5 content bytes", requirements: layout,
                  bytes: item(flags: 1, kind: 0, size: 5, content: Array("hello".utf8)), expect: .valid,
                  frames: [offerFields.merging(["type": "item", "ends_batch": "true", "content": hex(Array("hello".utf8))]) { $1 }]),
            .init(id: "D-welcome-small", description: "welcome announcing 512 bytes, below the least maximum of 1,024 (the framing reads it; a sender may refuse it)",
                  requirements: layout, bytes: frame(10, [2] + be(UInt32(512))), expect: .acceptable,
                  frames: [["type": "welcome", "version": "2", "max_frame_payload_bytes": "512"]]),
        ]
        let invalid: [(String, String, [String], [UInt8], String)] = [
            ("D-type-0", "frame type 0", malformed, frame(0, []), "unknown-frame-type"),
            ("D-type-200", "frame type 200", malformed, frame(200, [1]), "unknown-frame-type"),
            ("D-type-255", "frame type 255", malformed, frame(255, []), "unknown-frame-type"),
            ("D-too-large", "a data header announcing 65,537 bytes, one over the maximum: refused from the header alone",
             ["NODE-1.1"], [5] + be(UInt32(65_537)), "frame-too-large"),
            ("D-hello-empty", "hello without its version", malformed, frame(1, []), "malformed"),
            ("D-hello-trailing", "hello with a trailing byte", malformed, frame(1, [2, 0]), "malformed"),
            ("D-welcome-truncated", "welcome without its maximum", malformed, frame(10, [2]), "malformed"),
            ("D-offer-kind-2", "offer of kind 2", malformed, offer(kind: 2, size: 5, name: []), "malformed"),
            ("D-offer-name-truncated", "offer whose name length says 10 but 4 bytes follow", malformed,
             offer(kind: 1, size: 5, name: Array("a.tx".utf8), nameLength: 10), "malformed"),
            ("D-offer-name-not-utf8", "offer whose name is not UTF-8", ["NODE-1.3"],
             offer(kind: 1, size: 5, name: [0x61, 0xff, 0xfe]), "malformed"),
            ("D-answer-code-4", "answer with code 4", malformed, frame(3, id + [4]), "malformed"),
            ("D-answer-refused-0", "answer refused with reason 0", malformed, frame(3, id + [3, 0]), "malformed"),
            ("D-answer-partial-truncated", "answer partial without its digest", malformed,
             frame(3, id + [1] + be(UInt64(4096))), "malformed"),
            ("D-start-truncated", "start with a 4-byte offset", malformed, frame(4, id + [0, 0, 0, 1]), "malformed"),
            ("D-data-empty", "data with no bytes", ["NODE-1.3"], frame(5, []), "malformed"),
            ("D-ack-trailing", "ack with a trailing byte", malformed, frame(7, id + [0]), "malformed"),
            ("D-end-truncated", "end with a 15-byte id", malformed, frame(6, Array(id.prefix(15))), "malformed"),
            ("D-reject-0", "reject with reason 0", malformed, frame(8, id + [0]), "malformed"),
            ("D-done-payload", "done with a payload byte", malformed, frame(9, [0]), "malformed"),
            ("D-error-not-utf8", "error whose reason is not UTF-8", ["NODE-1.3"], frame(11, [1, 0xc3, 0x28]), "malformed"),
            ("D-error-long-reason", "error with a reason of 1,001 bytes", ["NODE-1.3"],
             frame(11, [1] + Array(repeating: 0x78, count: 1001)), "malformed"),
            ("D-welcome-3-truncated", "welcome of version 3 without its progress window", malformed,
             frame(10, [3] + be(UInt32(65_536))), "malformed"),
            ("D-welcome-5-truncated", "welcome of version 5 without its linger", malformed,
             frame(10, [5] + be(UInt32(65_536)) + be(UInt32(262_144))), "malformed"),
            ("D-progress-truncated", "progress with a 4-byte count", malformed, frame(12, id + [0, 0, 0, 1]), "malformed"),
            ("D-item-file", "item carrying a file (kind 1)", malformed, item(flags: 0, kind: 1, size: 5, content: Array("hello".utf8)), "malformed"),
            ("D-item-flags-2", "item with flag bit 1 set", malformed, item(flags: 2, kind: 0, size: 5, content: Array("hello".utf8)), "malformed"),
            ("D-item-short", "item of 5 bytes with 3 content bytes", malformed, item(flags: 0, kind: 0, size: 5, content: Array("hel".utf8)), "malformed"),
            ("D-invalid-after-valid", "hello, then a frame of type 0", malformed, hello + frame(0, []), "unknown-frame-type"),
        ]
        cases += invalid.map { FrameVectorCase(id: $0.0, description: $0.1, requirements: $0.2, bytes: $0.3, expect: .invalid, error: $0.4) }
        cases += [
            .init(id: "D-header-partial", description: "three bytes of a header", requirements: layout,
                  bytes: [1, 0, 0], expect: .incomplete, frames: []),
            .init(id: "D-offer-partial", description: "an offer cut after 40 of its 75 payload bytes", requirements: layout,
                  bytes: Array(offerText.prefix(45)), expect: .incomplete, frames: []),
            .init(id: "D-after-hello", description: "hello, then two bytes of the next header", requirements: layout,
                  bytes: hello + [2, 0], expect: .incomplete, frames: [["type": "hello", "version": "2"]]),
        ]
        return FrameVectorSet(layer: .delivery, source: source, limits: ["max_frame_payload_bytes": 65_536], cases: cases)
    }

    // MARK: - yamux

    /// yamux frames (spec/multiplexer.md, "yamux"): 12-byte headers, data payloads.
    public static var yamux: FrameVectorSet {
        func frame(version: UInt8 = 0, _ type: UInt8, flags: UInt16 = 0, stream: UInt32, length: UInt32, body: [UInt8] = []) -> [UInt8] {
            [version, type] + be(flags) + be(stream) + be(length) + body
        }
        func fields(_ type: String, flags: UInt16, stream: UInt32, length: UInt32, body: [UInt8]? = nil) -> FrameFields {
            var fields = ["type": type, "flags": "\(flags)", "stream_id": "\(stream)", "length": "\(length)"]
            if let body { fields["body"] = hex(body) }
            return fields
        }
        let header = ["MUX-2.1", "MUX-2.2"]
        let hello = Array("hello".utf8)
        let update = frame(1, flags: 2, stream: 2, length: 262_144)
        let data = frame(0, flags: 1, stream: 1, length: 5, body: hello)
        let ping = frame(2, flags: 1, stream: 0, length: 7)
        return FrameVectorSet(layer: .yamux, source: source, limits: ["max_data_length": 262_144], cases: [
            .init(id: "Y-data-syn", description: "data opening stream 1 (SYN) with 5 bytes", requirements: header,
                  bytes: data, expect: .valid, frames: [fields("data", flags: 1, stream: 1, length: 5, body: hello)]),
            .init(id: "Y-window-update-ack", description: "window update accepting stream 2 (ACK), delta 256 KiB",
                  requirements: header, bytes: update, expect: .valid,
                  frames: [fields("window-update", flags: 2, stream: 2, length: 262_144)]),
            .init(id: "Y-ping-syn", description: "ping (SYN) with opaque value 7", requirements: header,
                  bytes: ping, expect: .valid, frames: [fields("ping", flags: 1, stream: 0, length: 7)]),
            .init(id: "Y-ping-ack", description: "ping answer (ACK), opaque value 7", requirements: header,
                  bytes: frame(2, flags: 2, stream: 0, length: 7), expect: .valid,
                  frames: [fields("ping", flags: 2, stream: 0, length: 7)]),
            .init(id: "Y-go-away-normal", description: "go away, code 0 (normal)", requirements: header,
                  bytes: frame(3, stream: 0, length: 0), expect: .valid, frames: [fields("go-away", flags: 0, stream: 0, length: 0)]),
            .init(id: "Y-go-away-protocol-error", description: "go away, code 1 (protocol error)", requirements: header,
                  bytes: frame(3, stream: 0, length: 1), expect: .valid, frames: [fields("go-away", flags: 0, stream: 0, length: 1)]),
            .init(id: "Y-data-fin-empty", description: "data with FIN and no bytes (half-close of stream 3)",
                  requirements: header, bytes: frame(0, flags: 4, stream: 3, length: 0), expect: .valid,
                  frames: [fields("data", flags: 4, stream: 3, length: 0, body: [])]),
            .init(id: "Y-window-update-rst", description: "window update with RST (stream 5 reset)", requirements: header,
                  bytes: frame(1, flags: 8, stream: 5, length: 0), expect: .valid,
                  frames: [fields("window-update", flags: 8, stream: 5, length: 0)]),
            .init(id: "Y-high-stream-id", description: "data on stream 4,294,967,295", requirements: header,
                  bytes: frame(0, stream: .max, length: 1, body: [0xff]), expect: .valid,
                  frames: [fields("data", flags: 0, stream: .max, length: 1, body: [0xff])]),
            .init(id: "Y-three-frames", description: "window update, data, ping back to back", requirements: header,
                  bytes: update + data + ping, expect: .valid,
                  frames: [fields("window-update", flags: 2, stream: 2, length: 262_144),
                           fields("data", flags: 1, stream: 1, length: 5, body: hello), fields("ping", flags: 1, stream: 0, length: 7)]),
            .init(id: "Y-unknown-flag", description: "data with flag bit 0x10, which yamux does not define",
                  requirements: header, bytes: frame(0, flags: 0x10, stream: 1, length: 1, body: [1]), expect: .acceptable,
                  frames: [fields("data", flags: 0x10, stream: 1, length: 1, body: [1])]),
            .init(id: "Y-version-1", description: "version 1", requirements: ["MUX-2.1"],
                  bytes: frame(version: 1, 2, flags: 1, stream: 0, length: 7), expect: .invalid, error: "unsupported-version"),
            .init(id: "Y-version-255", description: "version 255", requirements: ["MUX-2.1"],
                  bytes: frame(version: 255, 0, stream: 1, length: 0), expect: .invalid, error: "unsupported-version"),
            .init(id: "Y-type-4", description: "frame type 4", requirements: ["MUX-2.2"],
                  bytes: frame(4, stream: 0, length: 0), expect: .invalid, error: "unknown-frame-type"),
            .init(id: "Y-type-255", description: "frame type 255", requirements: ["MUX-2.2"],
                  bytes: frame(255, stream: 1, length: 0), expect: .invalid, error: "unknown-frame-type"),
            .init(id: "Y-invalid-after-valid", description: "a ping, then a header of version 1", requirements: ["MUX-2.1"],
                  bytes: ping + frame(version: 1, 0, stream: 1, length: 0), expect: .invalid, error: "unsupported-version"),
            .init(id: "Y-header-11", description: "eleven bytes of a header", requirements: header,
                  bytes: Array(ping.prefix(11)), expect: .incomplete, frames: []),
            .init(id: "Y-data-short", description: "a data header for 5 bytes, and 3 of them", requirements: header,
                  bytes: Array(data.prefix(15)), expect: .incomplete, frames: []),
            .init(id: "Y-after-ping", description: "a ping, then 4 bytes of the next header", requirements: header,
                  bytes: ping + [0, 0, 0, 0], expect: .incomplete, frames: [fields("ping", flags: 1, stream: 0, length: 7)]),
        ])
    }

    // MARK: - thali-multiplex

    /// `thali-multiplex` frames (spec/multiplexer.md, "thali-multiplex"): `uvarint(id << 3 | flag)
    /// uvarint(length) body`.
    public static var thaliMultiplex: FrameVectorSet {
        func frame(stream: UInt64, flag: UInt64, body: [UInt8]) -> [UInt8] {
            leb128(stream << 3 | flag) + leb128(UInt64(body.count)) + body
        }
        func fields(stream: UInt64, flag: UInt64, body: [UInt8]) -> FrameFields {
            ["stream_id": "\(stream)", "flag": "\(flag)", "body": hex(body)]
        }
        let layout = ["MUX-3.1"]
        let name = Array("delivery".utf8)
        let abc = Array("abc".utf8)
        let open = frame(stream: 1, flag: 0, body: name)
        let message = frame(stream: 1, flag: 2, body: abc)
        let close = frame(stream: 1, flag: 4, body: [])
        let maxID: UInt64 = UInt64.max >> 3
        let longBody = Array(repeating: UInt8(0x5a), count: 300)
        let overflow: [UInt8] = Array(repeating: 0xff, count: 9) + [0x02]
        return FrameVectorSet(layer: .thaliMultiplex, source: source,
                              limits: ["max_payload_bytes": 1 << 20, "max_control_body_bytes": 64 * 1024], cases: [
            .init(id: "M-open-unnamed", description: "open stream 0 with no name", requirements: layout,
                  bytes: [0x00, 0x00], expect: .valid, frames: [fields(stream: 0, flag: 0, body: [])]),
            .init(id: "M-open-named", description: "open stream 1 named \"delivery\"", requirements: layout,
                  bytes: open, expect: .valid, frames: [fields(stream: 1, flag: 0, body: name)]),
            .init(id: "M-message-initiator", description: "message from the opener (flag 2)", requirements: layout,
                  bytes: message, expect: .valid, frames: [fields(stream: 1, flag: 2, body: abc)]),
            .init(id: "M-message-receiver", description: "message from the acceptor (flag 1)", requirements: layout,
                  bytes: frame(stream: 1, flag: 1, body: abc), expect: .valid, frames: [fields(stream: 1, flag: 1, body: abc)]),
            .init(id: "M-close-initiator", description: "close from the opener (flag 4)", requirements: layout,
                  bytes: close, expect: .valid, frames: [fields(stream: 1, flag: 4, body: [])]),
            .init(id: "M-close-receiver", description: "close from the acceptor (flag 3)", requirements: layout,
                  bytes: frame(stream: 1, flag: 3, body: []), expect: .valid, frames: [fields(stream: 1, flag: 3, body: [])]),
            .init(id: "M-reset-initiator", description: "reset from the opener (flag 6) with a message", requirements: layout,
                  bytes: frame(stream: 1, flag: 6, body: Array("gone".utf8)), expect: .valid,
                  frames: [fields(stream: 1, flag: 6, body: Array("gone".utf8))]),
            .init(id: "M-reset-receiver", description: "reset from the acceptor (flag 5), no message", requirements: layout,
                  bytes: frame(stream: 1, flag: 5, body: []), expect: .valid, frames: [fields(stream: 1, flag: 5, body: [])]),
            .init(id: "M-message-300", description: "message of 300 bytes (a two-byte length)", requirements: layout,
                  bytes: frame(stream: 7, flag: 2, body: longBody), expect: .valid, frames: [fields(stream: 7, flag: 2, body: longBody)]),
            .init(id: "M-large-id", description: "message on stream 1,000,000 (a four-byte tag)", requirements: layout,
                  bytes: frame(stream: 1_000_000, flag: 1, body: [7]), expect: .valid,
                  frames: [fields(stream: 1_000_000, flag: 1, body: [7])]),
            .init(id: "M-max-id", description: "close on stream 2^61-1 (a ten-byte tag whose last byte is 1)", requirements: layout,
                  bytes: frame(stream: maxID, flag: 4, body: []), expect: .valid, frames: [fields(stream: maxID, flag: 4, body: [])]),
            .init(id: "M-stream", description: "open, message, close back to back", requirements: layout,
                  bytes: open + message + close, expect: .valid,
                  frames: [fields(stream: 1, flag: 0, body: name), fields(stream: 1, flag: 2, body: abc), fields(stream: 1, flag: 4, body: [])]),
            .init(id: "M-non-minimal-varint", description: "open stream 1 with its tag written in two bytes (0x88 0x00)",
                  requirements: layout, bytes: [0x88, 0x00, 0x00], expect: .acceptable, frames: [fields(stream: 1, flag: 0, body: [])]),
            .init(id: "M-flag-7", description: "flag 7", requirements: ["MUX-3.2"],
                  bytes: frame(stream: 1, flag: 7, body: []), expect: .invalid, error: "unknown-flag"),
            .init(id: "M-varint-11-bytes", description: "a tag of eleven varint bytes", requirements: layout,
                  bytes: Array(repeating: 0x80, count: 10) + [0x00, 0x00], expect: .invalid, error: "varint-too-long"),
            .init(id: "M-varint-overflow", description: "a tag past 64 bits (tenth byte 2)", requirements: layout,
                  bytes: overflow + [0x00], expect: .invalid, error: "varint-too-long"),
            .init(id: "M-length-overflow", description: "a length past 64 bits", requirements: layout,
                  bytes: [0x0a] + overflow, expect: .invalid, error: "varint-too-long"),
            .init(id: "M-message-over-limit", description: "a message header of 1 MiB + 1 bytes: refused from the header",
                  requirements: ["MUX-3.3"], bytes: [0x0a] + leb128(UInt64(1 << 20) + 1), expect: .invalid, error: "frame-too-large"),
            .init(id: "M-open-over-limit", description: "an open header with a 64 KiB + 1 byte name: refused from the header",
                  requirements: ["MUX-3.3"], bytes: [0x08] + leb128(64 * 1024 + 1), expect: .invalid, error: "frame-too-large"),
            .init(id: "M-tag-only", description: "a tag without its length", requirements: layout,
                  bytes: [0x0a], expect: .incomplete, frames: []),
            .init(id: "M-tag-partial", description: "the first byte of a two-byte tag", requirements: layout,
                  bytes: [0x80], expect: .incomplete, frames: []),
            .init(id: "M-open-short", description: "an open with an 8-byte name, 4 of them here", requirements: layout,
                  bytes: Array(open.prefix(6)), expect: .incomplete, frames: []),
            .init(id: "M-after-open", description: "an open, then a message cut after 1 of 3 bytes", requirements: layout,
                  bytes: open + Array(message.prefix(3)), expect: .incomplete, frames: [fields(stream: 1, flag: 0, body: name)]),
        ])
    }

    // MARK: - Byte layout helpers (independent of the codecs under test)

    static func be<T: FixedWidthInteger>(_ value: T) -> [UInt8] {
        (0..<(T.bitWidth / 8)).reversed().map { UInt8(truncatingIfNeeded: value >> ($0 * 8)) }
    }

    static func leb128(_ value: UInt64) -> [UInt8] {
        var value = value
        var out: [UInt8] = []
        repeat {
            let low = UInt8(value & 0x7f)
            value >>= 7
            out.append(value == 0 ? low : low | 0x80)
        } while value != 0
        return out
    }

    static func hex(_ bytes: [UInt8]) -> String { Hex.encode(bytes) }

    /// SHA-256 of "hello", as FIPS 180-4 gives it (a constant, so the set needs no hash code).
    static let sha256Hello: [UInt8] = [
        0x2c, 0xf2, 0x4d, 0xba, 0x5f, 0xb0, 0xa3, 0x0e, 0x26, 0xe8, 0x3b, 0x2a, 0xc5, 0xb9, 0xe2, 0x9e,
        0x1b, 0x16, 0x1e, 0x5c, 0x1f, 0xa7, 0x42, 0x5e, 0x73, 0x04, 0x33, 0x62, 0x93, 0x8b, 0x98, 0x24,
    ]
}
