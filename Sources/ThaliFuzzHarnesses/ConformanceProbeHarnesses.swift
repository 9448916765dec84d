import NIOCore
import NIOEmbedded
import ThaliConformance
import ThaliPSKTLS
import ThaliSSDP

/// A server's answer to the conformance suite's hand-built ClientHello, as `TLSHelloProbe`'s
/// `FlightParser` reads it: whole and split at random points.
///
/// Invariants: the outcome does not depend on where the answer was split; an answer over
/// `TLSHelloProbe.maximumAnswerBytes` is decided (the probe never reads without end); the fields of a
/// ServerHello outcome come from the answer's bytes.
enum TLSHelloFlightHarness {
    static let name = "tls-hello-flight"

    static let harness = FuzzHarness(name: name, summary: "the conformance TLS probe reading a server's first flight", seeds: seeds) {
        (input: inout FuzzInput) throws(FuzzInvariantViolation) in
        let cuts = takeCuts(&input)
        let answer = input.rest()
        let whole = decide([answer[...]])
        let split = decide(splitPieces(answer, cuts: cuts))
        try check(whole == split, name, "the outcome depends on the split: \(describe(whole)) vs \(describe(split))")
        if answer.count > TLSHelloProbe.maximumAnswerBytes {
            try check(whole != nil, name, "\(answer.count) bytes read without a verdict")
        }
        if case .serverHello(let flight) = whole, let exchange = flight.keyExchange {
            let fields = exchange.identityHint.count + exchange.prime.count + exchange.generator.count + exchange.serverPublic.count
            try check(fields <= answer.count, name, "a key exchange of \(fields) bytes from an answer of \(answer.count)")
            try check(exchange.primeBits <= exchange.prime.count * 8, name, "\(exchange.primeBits) bits in \(exchange.prime.count) bytes")
        }
        _ = whole?.description
    }

    /// The parser's verdict once the pieces are fed in order, or `nil` when they decide nothing (the real
    /// probe then waits for more bytes, the end of the connection or its timeout).
    static func decide(_ pieces: [ArraySlice<UInt8>]) -> TLSHelloProbe.Outcome? {
        var parser = TLSHelloProbe.FlightParser()
        for piece in pieces {
            if let outcome = parser.feed(Array(piece)) { return outcome }
        }
        return nil
    }

    static func describe(_ outcome: TLSHelloProbe.Outcome?) -> String { outcome.map { "\($0)" } ?? "undecided" }

    /// What our own PSK-TLS server answers to `hello` (OpenSSL's real first flight, or its alert).
    static func serverAnswer(to hello: TLSHelloProbe.Hello) -> [UInt8] {
        guard let fixture = PSKTLSFixture.shared, let (channel, _) = fixture.endpoint(server: true) else { return [] }
        defer { _ = try? channel.finish(acceptAlreadyClosed: true) }
        _ = try? channel.writeInbound(ByteBuffer(bytes: TLSHelloProbe.record(hello)))
        return drainOutbound(channel)
    }

    static func seeds() -> [[UInt8]] {
        let flight = serverAnswer(to: .thaliSuite)
        let refusal = serverAnswer(to: .tls13Only)
        // A record header for `length` bytes of `type`.
        func record(_ type: UInt8, _ fragment: [UInt8]) -> [UInt8] {
            [type, 0x03, 0x03, UInt8(fragment.count >> 8), UInt8(fragment.count & 0xFF)] + fragment
        }
        let serverHello: [UInt8] = [2, 0, 0, 38, 0x03, 0x03] + [UInt8](repeating: 0x42, count: 32) + [0, 0x00, 0xAB, 0]
        return [
            [0] + flight,  // the whole flight in one read
            [3, 3, 0, 9, 0, 0x30, 0x01] + flight,  // split inside the first record header and the messages
            [0] + flight.prefix(flight.count / 2),  // cut off halfway: undecided
            [0] + refusal,  // TLS 1.3 only: an alert
            [0] + record(0x16, serverHello) + record(0x14, [1]),  // a TLS 1.3 server's ServerHello and change_cipher_spec
            [0] + record(0x16, [12, 0, 0, 4, 0, 0, 0, 0]),  // ServerKeyExchange before any ServerHello
            [0] + record(0x16, [99, 0xFF, 0xFF, 0xFF] + [UInt8](repeating: 0, count: 64)),  // an unknown message of 16 MiB
            [0, 0x16, 0x03, 0x03, 0x48, 0x01],  // a record header over 18 KiB
        ]
    }
}

/// The datagrams that reach the conformance suite's SSDP search socket, as `SSDPSearchProbe` reads them
/// (each a `u16` length and its bytes, from one sender), looking for the answer that carries the
/// expected USN.
///
/// Invariants: the search stops at that answer, and only there; it reads at most `maxDatagrams`; every
/// datagram it read is counted.
enum SSDPSearchAnswersHarness {
    static let name = "ssdp-search-answers"
    static let usn = "uuid:3f2c1a9e-6b7d-4e21-9c3a-0d5e8f7a6b10:0"
    static let maxDatagrams = 8
    static let sender = try? SocketAddress(ipAddress: "192.0.2.7", port: 1900)

    static let harness = FuzzHarness(name: name, summary: "the conformance SSDP search reading answers", seeds: seeds) {
        (input: inout FuzzInput) throws(FuzzInvariantViolation) in
        guard let sender else { return }
        var outcome = SSDPSearchProbe.Outcome()
        var read = 0
        var stopped = false
        while !input.isEmpty {
            let datagram = input.bytes(Int(input.uint16()))
            read += 1
            stopped = outcome.consider(ByteBuffer(bytes: datagram).readableBytesView, from: sender, expecting: usn,
                                       maxDatagrams: maxDatagrams)
            if stopped { break }
        }
        try check(outcome.datagrams == read, name, "\(read) datagrams read, \(outcome.datagrams) counted")
        try check(outcome.datagrams <= maxDatagrams, name, "\(outcome.datagrams) datagrams read, limit \(maxDatagrams)")
        if let (answer, from) = outcome.answer {
            try check(stopped, name, "the search went on after its answer")
            try check(answer.uniqueServiceName == usn, name, "answer with USN \(answer.uniqueServiceName)")
            try check(from == sender, name, "answer attributed to \(from)")
        } else if stopped {
            try check(read == maxDatagrams, name, "stopped after \(read) datagrams without an answer")
        }
    }

    static func seeds() -> [[UInt8]] {
        let answer = "HTTP/1.1 200 OK\r\nST: http://www.thaliproject.org/ssdp\r\nUSN: \(usn)\r\n"
            + "LOCATION: http://192.0.2.7:4242/NotificationBeacons\r\nCACHE-CONTROL: max-age=1800\r\nEXT:\r\n\r\n"
        let otherAnswer = answer.replacingOccurrences(of: "6b10:0", with: "6b10:1")
        let notify = "NOTIFY * HTTP/1.1\r\nHOST: 239.255.255.250:1900\r\nNT: http://www.thaliproject.org/ssdp\r\n"
            + "NTS: ssdp:alive\r\nUSN: \(usn)\r\nLOCATION: http://192.0.2.7:4242/NotificationBeacons\r\n\r\n"
        func datagram(_ text: String) -> [UInt8] { datagram(Array(text.utf8)) }
        func datagram(_ bytes: [UInt8]) -> [UInt8] { [UInt8(bytes.count & 0xFF), UInt8(bytes.count >> 8)] + bytes }
        return [
            datagram(answer),  // the answer at once
            datagram(otherAnswer) + datagram(notify) + datagram(answer),  // another service's answer and an announcement first
            datagram(String(answer.prefix(60))) + datagram(answer),  // a truncated answer, then the whole one
            datagram([UInt8](repeating: 0xFF, count: 40)) + datagram("HTTP/1.1 200 OK\r\n\r\n"),  // garbage, no headers
            (0..<10).flatMap { _ in datagram(notify) },  // more datagrams than the search reads
        ]
    }
}
