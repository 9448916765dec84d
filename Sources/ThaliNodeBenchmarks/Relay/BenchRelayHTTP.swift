import ArgumentParser
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The chatty app of `bench relay --peers`: small HTTP/1.1 keep-alive GETs on one connection, the shape
/// of CouchDB replication (a document, then the next). ``RelayBenchApp`` serves them on its one port: a
/// connection whose first bytes are ``httpMethod`` speaks HTTP, every other one the pattern protocol
/// (whose 8-byte count starts with a zero byte).
extension RelayBenchApp {
    /// The first bytes of every request of the chatty app.
    static let httpMethod = Array("GET ".utf8)
    /// The most bytes a request's or response's header may take; a longer one ends the connection.
    static let maxHTTPHeaderBytes = 8192
    /// The documents' path prefix: the request for document `n` is `GET /db/doc-n`.
    static let httpPathPrefix = "/db/doc-"

    /// The body of document `index`: a small JSON document that differs from request to request.
    static func httpBody(_ index: Int) -> [UInt8] {
        let revision = String(UInt32(truncatingIfNeeded: index &* 2654435761), radix: 16)
        return Array("{\"_id\":\"doc-\(index)\",\"_rev\":\"1-\(revision)\",\"type\":\"note\",\"text\":\"relayed keep-alive GET \(index)\"}".utf8)
    }

    /// Answers GETs on `connection` until it ends; `received` holds the bytes read so far.
    static func serveHTTP(_ connection: Int32, received: [UInt8]) {
        var buffer = received
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            guard let end = headerEnd(buffer) else {
                guard buffer.count < maxHTTPHeaderBytes else { return }
                let count = chunk.withUnsafeMutableBytes { recv(connection, $0.baseAddress!, $0.count, 0) }
                if count < 0 && errno == EINTR { continue }
                guard count > 0 else { return }
                buffer += chunk[..<count]
                continue
            }
            let line = String(decoding: buffer[..<(buffer.firstIndex(of: UInt8(ascii: "\r")) ?? end)], as: UTF8.self)
            buffer.removeFirst(end)
            let parts = line.split(separator: " ")
            var response: [UInt8]
            if parts.count == 3, parts[1].hasPrefix(httpPathPrefix), let index = Int(parts[1].dropFirst(httpPathPrefix.count)) {
                let body = httpBody(index)
                response = Array("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: \(body.count)\r\n\r\n".utf8) + body
            } else {
                response = Array("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".utf8)
            }
            guard sendAll(connection, &response) else { return }
        }
    }

    /// `gets` keep-alive GETs of consecutive documents on one connection, one at a time, each response
    /// checked; the first (setting the connection up through every forwarder) is not timed.
    static func keepAliveGets(port: Int, gets: Int) throws -> (seconds: Double, bytes: Int) {
        let connection = try connect(port: port)
        defer { Glibc.close(connection) }
        var buffer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        var bytes = 0
        var start = ContinuousClock.now
        for index in 0...gets {
            if index == 1 { start = ContinuousClock.now }
            var request = Array("GET \(httpPathPrefix)\(index) HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json\r\n\r\n".utf8)
            guard sendAll(connection, &request) else { throw failure("sending GET \(index)") }
            let expected = httpBody(index)
            var bodyStart: Int?
            var length = 0
            while true {
                if bodyStart == nil, let end = headerEnd(buffer) {
                    let header = String(decoding: buffer[..<end], as: UTF8.self)
                    guard header.hasPrefix("HTTP/1.1 200 ") else { throw ValidationError("GET \(index): \(header.prefix(40))") }
                    let field = header.split(separator: "\r\n").first { $0.lowercased().hasPrefix("content-length:") }
                    guard let field, let value = Int(field.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces)),
                          value == expected.count else {
                        throw ValidationError("GET \(index): no Content-Length of \(expected.count)")
                    }
                    (bodyStart, length) = (end, value)
                }
                if let bodyStart, buffer.count >= bodyStart + length {
                    guard buffer.count == bodyStart + length, buffer[bodyStart...].elementsEqual(expected) else {
                        throw ValidationError("GET \(index): the body differs from the document")
                    }
                    bytes += length
                    buffer.removeAll(keepingCapacity: true)
                    break
                }
                guard buffer.count < maxHTTPHeaderBytes + expected.count else { throw ValidationError("GET \(index): response too long") }
                let count = chunk.withUnsafeMutableBytes { recv(connection, $0.baseAddress!, $0.count, 0) }
                if count < 0 && errno == EINTR { continue }
                guard count > 0 else { throw ValidationError("GET \(index): the connection ended after \(buffer.count) bytes") }
                buffer += chunk[..<count]
            }
        }
        return ((ContinuousClock.now - start).seconds, bytes)
    }

    /// The index just past the blank line that ends a header in `buffer`, if it holds one.
    private static func headerEnd(_ buffer: [UInt8]) -> Int? {
        let terminator: [UInt8] = [13, 10, 13, 10]
        guard buffer.count >= 4 else { return nil }
        for index in 0...(buffer.count - 4) where buffer[index] == 13 && Array(buffer[index..<(index + 4)]) == terminator {
            return index + 4
        }
        return nil
    }

    private static func sendAll(_ connection: Int32, _ bytes: inout [UInt8]) -> Bool {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes.withUnsafeBytes { send(connection, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
            if sent < 0 && errno == EINTR { continue }
            guard sent > 0 else { return false }
            offset += sent
        }
        return true
    }
}
