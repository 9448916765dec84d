/// Why a datagram is not an SSDP message this parser accepts. Carries enough context to log, never
/// the whole (untrusted) datagram.
public struct SSDPParseError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The kinds of rejection.
    public enum Reason: Hashable, Sendable {
        /// The datagram is larger than `SSDPParserLimits.maxDatagramBytes`.
        case datagramTooLarge(size: Int, limit: Int)
        /// A byte that may not appear in an SSDP header block (control character, non-ASCII).
        case invalidByte(offset: Int, value: UInt8)
        /// A line does not end with CRLF (bare CR or LF, or the header block is not terminated).
        case badLineEnding(offset: Int)
        /// The first line is none of `NOTIFY * HTTP/1.1`, `M-SEARCH * HTTP/1.1`, `HTTP/1.1 200 OK`.
        case unknownStartLine(String)
        /// A header line is not `token ":" OWS value OWS`.
        case malformedHeader(line: Int)
        /// More header lines than `SSDPParserLimits.maxHeaderCount`.
        case tooManyHeaders(limit: Int)
        /// The same header appears twice.
        case duplicateHeader(String)
        /// A header the message kind requires is absent.
        case missingHeader(String)
        /// A header is present but its value has the wrong form.
        case invalidHeaderValue(header: String, value: String)
        /// Bytes follow the blank line that ends the header block.
        case unexpectedBody(bytes: Int)
    }

    /// Why the datagram was rejected.
    public let reason: Reason

    /// Creates an error for `reason`.
    public init(_ reason: Reason) { self.reason = reason }

    public var description: String { "SSDP parse error: \(reason)" }
}
