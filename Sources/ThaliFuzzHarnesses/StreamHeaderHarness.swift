import NIOCore
import ThaliNodeCore

/// Stream headers and their answers (spec/node.md, "Stream marking") as the accepting side and the opener
/// read them: a run of headers, or of statuses, decoded whole and split at random points.
///
/// Invariants: decoding does not depend on where the bytes were split; a decoded header or status
/// re-encodes to exactly the bytes it came from; an incomplete one never holds more than the encoded
/// maximum (a header's or a status's fate is decided within its bounded length).
enum StreamHeaderHarness {
    static let name = "stream-header"

    static let harness = FuzzHarness(name: name, summary: "stream headers and statuses of marked sessions", seeds: seeds) {
        (input: inout FuzzInput) throws(FuzzInvariantViolation) in
        let statuses = input.bool()
        let cuts = takeCuts(&input)
        let bytes = input.rest()
        let whole = decodeAll([bytes[...]], statuses: statuses)
        let split = decodeAll(splitPieces(bytes, cuts: cuts), statuses: statuses)
        try check(whole == split, name, "decoding depends on the split: \(whole.encodings.count) vs \(split.encodings.count) decoded")
        let bound = statuses ? StreamStatus.maximumEncodedLength : StreamHeader.maximumEncodedLength
        try check(whole.pending < bound, name, "\(whole.pending) bytes held undecided, bound \(bound)")
        var offset = 0
        for encoding in whole.encodings {
            try check(Array(bytes[offset..<offset + encoding.count]) == encoding, name, "a decoded value does not re-encode to its bytes")
            offset += encoding.count
        }
    }

    struct Outcome: Equatable {
        var encodings: [[UInt8]] = []
        var failure: StreamHeaderError?
        var pending = 0
    }

    /// Feeds `pieces` in order, decoding as many values as they hold, until the first error.
    static func decodeAll(_ pieces: [ArraySlice<UInt8>], statuses: Bool) -> Outcome {
        var outcome = Outcome()
        var buffer = ByteBuffer()
        for piece in pieces {
            buffer.writeBytes(piece)
            while true {
                do throws(StreamHeaderError) {
                    var encoded = ByteBuffer()
                    if statuses {
                        guard let status = try StreamStatus.decode(from: &buffer) else { break }
                        status.encode(into: &encoded)
                    } else {
                        guard let header = try StreamHeader.decode(from: &buffer) else { break }
                        header.encode(into: &encoded)
                    }
                    outcome.encodings.append(Array(encoded.readableBytesView))
                } catch {
                    outcome.failure = error
                    return outcome
                }
            }
        }
        outcome.pending = buffer.readableBytes
        return outcome
    }

    static func seeds() -> [[UInt8]] {
        func encoded(_ write: (inout ByteBuffer) -> Void) -> [UInt8] {
            var buffer = ByteBuffer()
            write(&buffer)
            return Array(buffer.readableBytesView)
        }
        let headers = encoded { buffer in
            StreamHeader(kind: .delivery).encode(into: &buffer)
            StreamHeader(kind: .relay).encode(into: &buffer)
            if let kind = try? StreamKind.app("chat") { StreamHeader(kind: kind).encode(into: &buffer) }
        }
        let statuses = encoded { buffer in
            StreamStatus.accepted.encode(into: &buffer)
            StreamStatus.refused(StreamRefusal(.notServed, reason: "relay is not served: this node has no app port")).encode(into: &buffer)
            StreamStatus.refused(StreamRefusal(.unknownKind, reason: "unknown stream kind x")).encode(into: &buffer)
        }
        // Mode byte (bit 0: statuses), cut count, two cuts, then the bytes.
        return [[0, 2, 1, 0, 9, 0] + headers, [1, 2, 1, 0, 3, 0] + statuses, [0, 0, 65] + Array(repeating: 0x61, count: 65),
                [0, 0, 4, 0x61, 0x80]]
    }
}
