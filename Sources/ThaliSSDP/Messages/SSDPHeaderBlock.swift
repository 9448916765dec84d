import ThaliMutants

/// The lexical layer of an SSDP datagram: a start line and unique, case-insensitive headers.
///
/// Grammar (RFC 9112 message syntax, narrowed): every line ends in CRLF; a header is
/// `token ":" OWS field-content OWS`; no line folding, no body, no duplicate header names; only visible
/// ASCII, space and horizontal tab. Anything else is rejected with the offset of the offending byte.
struct SSDPHeaderBlock {
    /// The start line, exactly as received.
    var startLine: String
    /// Header names lower-cased, values with surrounding whitespace removed, in arrival order.
    var headers: [(name: String, value: String)]

    init(startLine: String, headers: [(name: String, value: String)]) {
        self.startLine = startLine
        self.headers = headers
    }

    /// The value of header `name` (lower-case), if present.
    func value(_ name: String) -> String? {
        headers.first(where: { $0.name == name })?.value
    }

    /// The value of header `name`, or `missingHeader`.
    func required(_ name: String) throws(SSDPParseError) -> String {
        guard let value = value(name) else { throw SSDPParseError(.missingHeader(name.uppercased())) }
        return value
    }

    /// Splits `bytes` into a start line and headers, enforcing `limits`.
    static func parse(_ bytes: UnsafeRawBufferPointer, limits: SSDPParserLimits) throws(SSDPParseError) -> SSDPHeaderBlock {
        guard bytes.count <= limits.maxDatagramBytes else {
            throw SSDPParseError(.datagramTooLarge(size: bytes.count, limit: limits.maxDatagramBytes))
        }
        var lines: [Range<Int>] = []
        var lineStart = 0
        var index = 0
        var ended = false
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\r") {
                guard index + 1 < bytes.count, bytes[index + 1] == UInt8(ascii: "\n") else {
                    throw SSDPParseError(.badLineEnding(offset: index))
                }
                if index == lineStart {  // the blank line: end of the header block
                    ended = true
                    index += 2
                    break
                }
                lines.append(lineStart..<index)
                guard lines.count <= limits.maxHeaderCount + 1 else {
                    throw SSDPParseError(.tooManyHeaders(limit: limits.maxHeaderCount))
                }
                index += 2
                lineStart = index
                continue
            }
            if byte == UInt8(ascii: "\n") { throw SSDPParseError(.badLineEnding(offset: index)) }
            guard byte == UInt8(ascii: "\t") || (byte >= 0x20 && byte < 0x7F) else {
                throw SSDPParseError(.invalidByte(offset: index, value: byte))
            }
            index += 1
        }
        guard ended, !lines.isEmpty else { throw SSDPParseError(.badLineEnding(offset: bytes.count)) }
        guard index == bytes.count else { throw SSDPParseError(.unexpectedBody(bytes: bytes.count - index)) }

        let startLine = String(decoding: UnsafeRawBufferPointer(rebasing: bytes[lines[0]]), as: UTF8.self)
        var headers: [(name: String, value: String)] = []
        headers.reserveCapacity(lines.count - 1)
        for (number, range) in lines.dropFirst().enumerated() {
            let line = UnsafeRawBufferPointer(rebasing: bytes[range])
            guard let colon = line.firstIndex(of: UInt8(ascii: ":")), colon > 0,
                line[..<colon].allSatisfy(isTokenCharacter)
            else { throw SSDPParseError(.malformedHeader(line: number + 2)) }
            var valueStart = colon + 1
            var valueEnd = line.count
            while valueStart < valueEnd, isWhitespace(line[valueStart]) { valueStart += 1 }
            while valueEnd > valueStart, isWhitespace(line[valueEnd - 1]) { valueEnd -= 1 }
            let name = String(decoding: UnsafeRawBufferPointer(rebasing: line[..<colon]), as: UTF8.self).lowercased()
            let value = String(decoding: UnsafeRawBufferPointer(rebasing: line[valueStart..<valueEnd]), as: UTF8.self)
            if headers.contains(where: { $0.name == name }) {
                if Mutant.ssdpAcceptsDuplicateHeaders.isActive { continue }
                throw SSDPParseError(.duplicateHeader(name.uppercased()))
            }
            headers.append((name, value))
        }
        return SSDPHeaderBlock(startLine: startLine, headers: headers)
    }

    /// Renders the block with CRLF line ends and the terminating blank line.
    func serialize() -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(64 + headers.count * 48)
        out.append(contentsOf: startLine.utf8)
        out.append(contentsOf: [0x0D, 0x0A])
        for header in headers {
            out.append(contentsOf: header.name.utf8)
            out.append(UInt8(ascii: ":"))
            // An empty value (UDA 1.1's `EXT:`) has no space after the colon: no trailing whitespace.
            if !header.value.isEmpty {
                out.append(UInt8(ascii: " "))
                out.append(contentsOf: header.value.utf8)
            }
            out.append(contentsOf: [0x0D, 0x0A])
        }
        out.append(contentsOf: [0x0D, 0x0A])
        return out
    }

    private static func isWhitespace(_ byte: UInt8) -> Bool { byte == 0x20 || byte == 0x09 }

    /// RFC 9110 `tchar`.
    private static func isTokenCharacter(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"):
            return true
        default:
            return "!#$%&'*+-.^_`|~".utf8.contains(byte)
        }
    }
}

/// Shared value checks for header values.
enum SSDPValue {
    /// `max-age` from a CACHE-CONTROL value such as `max-age=60`, `max-age = 60` or `no-cache, max-age=60`.
    static func maxAge(_ value: String) -> Int? {
        for directive in value.split(separator: ",") {
            let parts = directive.split(separator: "=", maxSplits: 1)
            guard parts.count == 2,
                parts[0].trimmingWhitespace().lowercased() == "max-age"
            else { continue }
            return decimal(parts[1].trimmingWhitespace(), maxDigits: 9)
        }
        return nil
    }

    /// A non-negative decimal of at most `maxDigits` digits, no sign, no spaces.
    static func decimal(_ text: Substring, maxDigits: Int) -> Int? {
        guard !text.isEmpty, text.utf8.count <= maxDigits,
            text.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") })
        else { return nil }
        return Int(text)
    }

    /// Whether `value` is a non-empty identifier (USN, NT, ST) within `limit` bytes without spaces.
    static func isIdentifier(_ value: String, limit: Int) -> Bool {
        !value.isEmpty && value.utf8.count <= limit && !value.utf8.contains(where: { $0 == 0x20 || $0 == 0x09 })
    }
}

extension Substring {
    func trimmingWhitespace() -> Substring {
        var result = self
        while let first = result.first, first == " " || first == "\t" { result.removeFirst() }
        while let last = result.last, last == " " || last == "\t" { result.removeLast() }
        return result
    }
}
