import Testing
@testable import ThaliConformance

/// The probe reads a server's first flight, which is outside input: its buffers stay bounded.
@Suite("TLS hello probe: the answer's parser")
struct TLSHelloProbeParserTests {
    /// A handshake record of `count` bytes (the content of one message, spread over records).
    private func handshakeRecord(_ body: [UInt8]) -> [UInt8] {
        [0x16, 0x03, 0x03, UInt8(body.count >> 8), UInt8(body.count & 0xff)] + body
    }

    @Test("records that each fit cannot add up to a handshake message beyond the answer's bound")
    func manySmallRecordsOfOneHugeMessageAreRefused() {
        var parser = TLSHelloProbe.FlightParser()
        // A message of unknown type that claims 16 MiB, then record after record of its body.
        var outcome = parser.feed(handshakeRecord([99, 0xff, 0xff, 0xff]))
        #expect(outcome == nil)
        var fed = 9
        while outcome == nil, fed < 4 * TLSHelloProbe.maximumAnswerBytes {
            let record = handshakeRecord([UInt8](repeating: 0, count: 16_000))
            outcome = parser.feed(record)
            fed += record.count
        }
        #expect(outcome == .malformed("answer over 64 KiB"))
        #expect(fed <= TLSHelloProbe.maximumAnswerBytes + 16_005)
    }

    @Test("an alert is read whichever way its bytes are split")
    func alertSplitAnywhere() {
        let alert: [UInt8] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x73]
        for cut in 0...alert.count {
            var parser = TLSHelloProbe.FlightParser()
            let first = parser.feed(Array(alert[..<cut]))
            let outcome = first ?? parser.feed(Array(alert[cut...]))
            #expect(outcome == .alert(level: 2, description: 0x73), "cut at \(cut)")
        }
    }
}
