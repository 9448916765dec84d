/// Where a JSON text (RFC 8259) first breaks its grammar, as a line and a column a person can find.
///
/// The configuration is decoded by Foundation, whose errors give a byte offset at best and "end of file"
/// for several other mistakes (`{"a": tru}` included), in words that may change. This scanner only
/// checks the syntax, with no values built, so the message names the real place and the real mistake.
/// A value type over bytes, with no I/O.
package struct JSONSyntaxLocator {
    /// Deepest nesting of arrays and objects it follows (the scanner recurses, possibly on a task's
    /// small stack); deeper text is reported rather than recursed into. A configuration nests two deep.
    package static let maxDepth = 128

    /// What is wrong at a place.
    package enum Problem: Equatable, Sendable {
        case unexpectedEnd
        case unexpectedCharacter(Unicode.Scalar)
        case invalidUTF8
        case controlCharacterInString
        case invalidEscape
        case invalidNumber
        case tooDeep(limit: Int)
        case trailingContent

        package var description: String {
            switch self {
            case .unexpectedEnd: return "unexpected end of the file"
            case .unexpectedCharacter(let scalar):
                let shown = scalar.properties.generalCategory == .control || scalar.value > 0x7E
                    ? "U+" + String(scalar.value, radix: 16, uppercase: true) : "'\(Character(scalar))'"
                return "unexpected \(shown)"
            case .invalidUTF8: return "bytes that are not UTF-8"
            case .controlCharacterInString: return "a control character inside a string (write it as an escape)"
            case .invalidEscape: return "an invalid escape in a string"
            case .invalidNumber: return "an invalid number"
            case .tooDeep(let limit): return "arrays and objects nested deeper than \(limit)"
            case .trailingContent: return "more after the JSON value"
            }
        }
    }

    /// A syntax error: its byte offset, its line and column (both from 1; columns count characters) and
    /// what is wrong.
    package struct SyntaxError: Error, Equatable, Sendable, CustomStringConvertible {
        package var offset: Int
        package var line: Int
        package var column: Int
        package var problem: Problem

        package var description: String { "line \(line), column \(column): \(problem.description)" }
    }

    private let bytes: [UInt8]
    private var index = 0

    private init(_ bytes: [UInt8]) { self.bytes = bytes }

    /// The first syntax error of `bytes`, or `nil` if they are one JSON value (with white space around it).
    package static func firstError(in bytes: [UInt8]) -> SyntaxError? {
        var locator = JSONSyntaxLocator(bytes)
        do throws(SyntaxError) {
            locator.skipByteOrderMark()
            try locator.value(depth: 0)
            locator.skipWhitespace()
            guard locator.index == bytes.count else { throw locator.failure(.trailingContent) }
            return nil
        } catch {
            return error
        }
    }

    // MARK: Grammar

    private mutating func value(depth: Int) throws(SyntaxError) {
        skipWhitespace()
        guard let byte = peek() else { throw failure(.unexpectedEnd) }
        switch byte {
        case UInt8(ascii: "{"): try object(depth: depth + 1)
        case UInt8(ascii: "["): try array(depth: depth + 1)
        case UInt8(ascii: "\""): try string()
        case UInt8(ascii: "t"): try literal("true")
        case UInt8(ascii: "f"): try literal("false")
        case UInt8(ascii: "n"): try literal("null")
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): try number()
        default: throw unexpected()
        }
    }

    private mutating func object(depth: Int) throws(SyntaxError) {
        guard depth <= Self.maxDepth else { throw failure(.tooDeep(limit: Self.maxDepth)) }
        index += 1
        skipWhitespace()
        if peek() == UInt8(ascii: "}") { index += 1; return }
        while true {
            skipWhitespace()
            guard let byte = peek() else { throw failure(.unexpectedEnd) }
            guard byte == UInt8(ascii: "\"") else { throw unexpected() }
            try string()
            try expect(UInt8(ascii: ":"))
            try value(depth: depth)
            skipWhitespace()
            guard let next = peek() else { throw failure(.unexpectedEnd) }
            index += 1
            if next == UInt8(ascii: "}") { return }
            guard next == UInt8(ascii: ",") else { index -= 1; throw unexpected() }
        }
    }

    private mutating func array(depth: Int) throws(SyntaxError) {
        guard depth <= Self.maxDepth else { throw failure(.tooDeep(limit: Self.maxDepth)) }
        index += 1
        skipWhitespace()
        if peek() == UInt8(ascii: "]") { index += 1; return }
        while true {
            try value(depth: depth)
            skipWhitespace()
            guard let next = peek() else { throw failure(.unexpectedEnd) }
            index += 1
            if next == UInt8(ascii: "]") { return }
            guard next == UInt8(ascii: ",") else { index -= 1; throw unexpected() }
        }
    }

    private mutating func string() throws(SyntaxError) {
        index += 1
        while let byte = peek() {
            switch byte {
            case UInt8(ascii: "\""):
                index += 1
                return
            case UInt8(ascii: "\\"):
                index += 1
                guard let escaped = peek() else { throw failure(.unexpectedEnd) }
                switch escaped {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"), UInt8(ascii: "f"),
                     UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                    index += 1
                case UInt8(ascii: "u"):
                    index += 1
                    for _ in 0..<4 {
                        guard let digit = peek() else { throw failure(.unexpectedEnd) }
                        guard Self.isHexDigit(digit) else { throw failure(.invalidEscape) }
                        index += 1
                    }
                default:
                    throw failure(.invalidEscape)
                }
            case 0..<0x20:
                throw failure(.controlCharacterInString)
            case 0x80...:
                try skipUTF8Sequence()
            default:
                index += 1
            }
        }
        throw failure(.unexpectedEnd)
    }

    private mutating func number() throws(SyntaxError) {
        if peek() == UInt8(ascii: "-") { index += 1 }
        guard let first = peek() else { throw failure(.unexpectedEnd) }
        guard Self.isDigit(first) else { throw failure(.invalidNumber) }
        index += 1
        if first != UInt8(ascii: "0") { skipDigits() }
        if peek() == UInt8(ascii: ".") {
            index += 1
            guard let digit = peek(), Self.isDigit(digit) else { throw failure(peek() == nil ? .unexpectedEnd : .invalidNumber) }
            skipDigits()
        }
        if peek() == UInt8(ascii: "e") || peek() == UInt8(ascii: "E") {
            index += 1
            if peek() == UInt8(ascii: "+") || peek() == UInt8(ascii: "-") { index += 1 }
            guard let digit = peek(), Self.isDigit(digit) else { throw failure(peek() == nil ? .unexpectedEnd : .invalidNumber) }
            skipDigits()
        }
        // "01" or "1x": the number ends where a delimiter must follow.
        if let next = peek(), Self.isDigit(next) || next == UInt8(ascii: ".") || Self.isLetter(next) { throw failure(.invalidNumber) }
    }

    private mutating func literal(_ word: StaticString) throws(SyntaxError) {
        let expected = UnsafeBufferPointer(start: word.utf8Start, count: word.utf8CodeUnitCount)
        for byte in expected {
            guard let actual = peek() else { throw failure(.unexpectedEnd) }
            guard actual == byte else { throw unexpected() }
            index += 1
        }
        if let next = peek(), Self.isLetter(next) { throw unexpected() }
    }

    private mutating func expect(_ byte: UInt8) throws(SyntaxError) {
        skipWhitespace()
        guard let actual = peek() else { throw failure(.unexpectedEnd) }
        guard actual == byte else { throw unexpected() }
        index += 1
    }

    // MARK: Bytes

    private func peek() -> UInt8? { index < bytes.count ? bytes[index] : nil }

    private mutating func skipWhitespace() {
        while let byte = peek(), byte == 0x20 || byte == 0x0A || byte == 0x0D || byte == 0x09 { index += 1 }
    }

    private mutating func skipDigits() {
        while let byte = peek(), Self.isDigit(byte) { index += 1 }
    }

    private mutating func skipByteOrderMark() {
        if bytes.starts(with: [0xEF, 0xBB, 0xBF]) { index = 3 }
    }

    /// Steps over one well-formed UTF-8 sequence of two to four bytes.
    private mutating func skipUTF8Sequence() throws(SyntaxError) {
        var decoder = UTF8()
        var iterator = bytes[index...].makeIterator()
        switch decoder.decode(&iterator) {
        case .scalarValue(let scalar):
            index += UTF8.width(scalar)
        case .emptyInput:
            throw failure(.unexpectedEnd)
        case .error:
            throw failure(.invalidUTF8)
        }
    }

    private static func isDigit(_ byte: UInt8) -> Bool { byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") }
    private static func isLetter(_ byte: UInt8) -> Bool {
        (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "z")) || (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z"))
    }
    private static func isHexDigit(_ byte: UInt8) -> Bool {
        isDigit(byte) || (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "f")) || (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "F"))
    }

    // MARK: Errors

    /// An unexpected character at the current place (a whole scalar, or invalid UTF-8).
    private func unexpected() -> SyntaxError {
        var decoder = UTF8()
        var iterator = bytes[index...].makeIterator()
        switch decoder.decode(&iterator) {
        case .scalarValue(let scalar): return failure(.unexpectedCharacter(scalar))
        case .emptyInput: return failure(.unexpectedEnd)
        case .error: return failure(.invalidUTF8)
        }
    }

    /// `problem` at the current place, with its line and column.
    private func failure(_ problem: Problem) -> SyntaxError {
        let before = bytes[..<min(index, bytes.count)]
        let lineStart = before.lastIndex(of: 0x0A).map { $0 + 1 } ?? 0
        let line = before.reduce(1) { $1 == 0x0A ? $0 + 1 : $0 }
        // Characters, not bytes: UTF-8 continuation bytes do not start a column.
        let column = bytes[lineStart..<before.endIndex].reduce(1) { $1 & 0xC0 == 0x80 ? $0 : $0 + 1 }
        return SyntaxError(offset: index, line: line, column: column, problem: problem)
    }
}
