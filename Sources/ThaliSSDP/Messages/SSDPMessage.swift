/// One SSDP datagram, parsed strictly: a NOTIFY (alive or byebye), an M-SEARCH, or a 200 OK search
/// response. Value type, no I/O: `parse` reads bytes, `serialize` writes them.
public enum SSDPMessage: Hashable, Sendable {
    /// `NOTIFY * HTTP/1.1` with `NTS: ssdp:alive` or `ssdp:byebye`.
    case notification(SSDPNotification)
    /// `M-SEARCH * HTTP/1.1`.
    case search(SSDPSearchRequest)
    /// `HTTP/1.1 200 OK`, the unicast answer to an M-SEARCH.
    case searchResponse(SSDPSearchResponse)

    static let notifyLine = "NOTIFY * HTTP/1.1"
    static let searchLine = "M-SEARCH * HTTP/1.1"
    static let responseLine = "HTTP/1.1 200 OK"

    /// Parses one datagram. Throws `SSDPParseError` for anything outside the grammar or `limits`.
    public static func parse(_ bytes: some Collection<UInt8>, limits: SSDPParserLimits = .init()) throws(SSDPParseError) -> SSDPMessage {
        if bytes.count > limits.maxDatagramBytes {  // before copying anything
            throw SSDPParseError(.datagramTooLarge(size: bytes.count, limit: limits.maxDatagramBytes))
        }
        let parseBuffer = { (buffer: UnsafeRawBufferPointer) -> Result<SSDPMessage, SSDPParseError> in
            Result { () throws(SSDPParseError) in try parse(buffer, limits: limits) }
        }
        let result = bytes.withContiguousStorageIfAvailable { parseBuffer(UnsafeRawBufferPointer($0)) }
            ?? Array(bytes).withUnsafeBytes(parseBuffer)
        return try result.get()
    }

    static func parse(_ bytes: UnsafeRawBufferPointer, limits: SSDPParserLimits) throws(SSDPParseError) -> SSDPMessage {
        let block = try SSDPHeaderBlock.parse(bytes, limits: limits)
        switch block.startLine {
        case notifyLine: return .notification(try SSDPNotification(block, limits: limits))
        case searchLine: return .search(try SSDPSearchRequest(block, limits: limits))
        case responseLine: return .searchResponse(try SSDPSearchResponse(block, limits: limits))
        default:
            // Cap what we echo back: the start line came from the network.
            throw SSDPParseError(.unknownStartLine(String(block.startLine.prefix(64))))
        }
    }

    /// The datagram bytes, CRLF-terminated, headers in a fixed order.
    public func serialize() -> [UInt8] {
        switch self {
        case .notification(let message): return message.headerBlock.serialize()
        case .search(let message): return message.headerBlock.serialize()
        case .searchResponse(let message): return message.headerBlock.serialize()
        }
    }
}
