import Foundation
import NIOCore
import NIOEmbedded
import TCPMultiplexer

/// Two real sessions back to back, with the wire between them moved only when the input says so:
/// streams opened from both ends, writes, half-closes, resets, reads stopped and resumed (window and
/// credit updates) all race in both directions.
///
/// Invariants, after everything still in flight is delivered: every stream that neither end reset
/// carries exactly the bytes written to it, in order, in both directions; a half-closed direction
/// ends with the reader seeing the end of input; a reset stream carries a prefix of what was written
/// (thali-multiplex has no flow control, so a reader that stops reading may lose its stream that way);
/// no stream receives data after it ended.
enum MultiplexerPairHarness {
    static let yamux = harness(.yamux)
    static let thaliMultiplex = harness(.thaliMultiplex)
    /// `FUZZ_TRACE=1` prints each operation as it runs: for reading a finding.
    static let tracing = ProcessInfo.processInfo.environment["FUZZ_TRACE"] != nil
    static func trace(_ line: @autoclosure () -> String) { if tracing { try? FileHandle.standardError.write(contentsOf: Data((line() + "\n").utf8)) } }

    /// One logical stream as both ends see it.
    final class Pair: @unchecked Sendable {
        var ends: [(channel: Channel, log: StreamLog)?] = [nil, nil]
        var written: [[UInt8]] = [[], []]  // by writer side
        var writeFailed = [false, false]
        var halfClosed = [false, false]
        var reset = false
        let opener: Int
        let index: Int
        init(opener: Int, index: Int) { self.opener = opener; self.index = index }
    }

    static func harness(_ framing: MultiplexerFraming) -> FuzzHarness {
        let name = framing == .yamux ? "yamux-pair" : "thali-multiplex-pair"
        let configuration = fuzzMultiplexerConfiguration(framing)
        return FuzzHarness(name: name, summary: "two \(framing.rawValue) sessions back to back, checked byte for byte",
                           seeds: { seeds() }) { (input: inout FuzzInput) throws(FuzzInvariantViolation) in
            guard let client = MultiplexerEndpoint(role: .client, configuration: configuration, autoRead: true),
                  let server = MultiplexerEndpoint(role: .server, configuration: configuration, autoRead: true)
            else { return }
            let ends = [client, server]
            defer { client.finish(); server.finish() }
            var pairs: [Pair] = []
            var inFlight: [[UInt8]] = [[], []]  // wire bytes written by side, not yet delivered

            func pump(from side: Int, limit: Int) {
                inFlight[side] += ends[side].takeOutbound()
                let count = min(limit, inFlight[side].count)
                guard count > 0 else { return }
                let piece = inFlight[side].prefix(count)
                inFlight[side].removeFirst(count)
                ends[1 - side].feed(piece)
            }
            /// Pairs the streams each end accepted with the ones the other opened, by stream id.
            func match() {
                for side in 0..<2 {
                    for stream in ends[side].streamsBoxAccepted() {
                        let id = (stream.channel as? MultiplexerStreamChannel)?.streamID
                        if let pair = pairs.first(where: {
                            $0.opener == 1 - side && $0.ends[side] == nil
                                && ($0.ends[1 - side]?.channel as? MultiplexerStreamChannel)?.streamID == id
                        }) {
                            pair.ends[side] = stream
                        }
                    }
                }
            }

            var steps = 0
            while !input.isEmpty, steps < 200 {
                steps += 1
                let operation = input.byte()
                let side = Int(operation >> 7)
                let pair = pairs.isEmpty ? nil : pairs[input.int(below: pairs.count)]
                switch (operation & 0x7F) % 8 {
                case 0:
                    if pairs.count < 12, let stream = ends[side].open(autoRead: true) {
                        let pair = Pair(opener: side, index: pairs.count)
                        pair.ends[side] = stream
                        pairs.append(pair)
                        trace("side \(side) opens stream \(pair.index)")
                    }
                case 1, 2:
                    guard let pair, let end = pair.ends[side], !pair.halfClosed[side], !pair.reset else { break }
                    let count = 1 + Int(input.uint16()) % (operation & 1 == 0 ? 512 : 96 * 1024)
                    let start = pair.written[side].count
                    let bytes = WrittenBytes.content(stream: pair.index * 2 + side, offset: start, count: count)
                    pair.written[side] += bytes
                    trace("side \(side) writes \(count) on stream \(pair.index) (\(pair.written[side].count) in all)")
                    end.channel.writeAndFlush(ByteBuffer(bytes: bytes)).whenFailure { _ in pair.writeFailed[side] = true }
                case 3:
                    guard let pair, let end = pair.ends[side], !pair.reset else { break }
                    pair.halfClosed[side] = true
                    trace("side \(side) half-closes stream \(pair.index)")
                    end.channel.close(mode: .output, promise: nil)
                case 4:
                    guard let pair, let end = pair.ends[side], input.byte() < 32 else { break }  // resets are rare
                    pair.reset = true
                    trace("side \(side) resets stream \(pair.index)")
                    end.channel.close(promise: nil)
                case 5:
                    guard let pair, let end = pair.ends[side] else { break }
                    let reading = input.bool()
                    trace("side \(side) \(reading ? "resumes" : "stops") reading stream \(pair.index)")
                    try? end.channel.syncOptions?.setOption(.autoRead, value: reading)
                    if reading { end.channel.read() }
                default:
                    let limit = 1 + Int(input.uint16())
                    trace("side \(side) sends up to \(limit) wire bytes (\(inFlight[side].count) held + new)")
                    pump(from: side, limit: limit)
                }
                client.channel.embeddedEventLoop.run()
                server.channel.embeddedEventLoop.run()
                match()
            }
            // Let everything in flight arrive, with every stream reading.
            for _ in 0..<10_000 {
                for pair in pairs {
                    for end in pair.ends.compactMap({ $0 }) where end.channel.isActive {
                        try? end.channel.syncOptions?.setOption(.autoRead, value: true)
                        end.channel.read()
                    }
                }
                pump(from: 0, limit: .max)
                pump(from: 1, limit: .max)
                match()
                inFlight[0] += client.takeOutbound()
                inFlight[1] += server.takeOutbound()
                if inFlight[0].isEmpty && inFlight[1].isEmpty { break }
            }
            let broken = !client.channel.isActive || !server.channel.isActive
            if broken {
                throw FuzzInvariantViolation(harness: name, detail:
                    "the connection ended between two honest sessions: \(client.sessionError ?? client.catcher.error ?? server.sessionError ?? server.catcher.error as Any)")
            }
            for pair in pairs {
                for side in 0..<2 {
                    guard let end = pair.ends[side] else { trace("stream \(pair.index) side \(side): never accepted"); continue }
                    trace("stream \(pair.index) side \(side): active \(end.channel.isActive), received \(end.log.received.count), "
                          + "input closed \(end.log.inputClosed), inactive \(end.log.inactive), error \(end.log.error.map { "\($0)" } ?? "none"), "
                          + "write failed \(pair.writeFailed[side])")
                }
            }
            for pair in pairs {
                for writer in 0..<2 {
                    let reader = 1 - writer
                    guard let readEnd = pair.ends[reader] else {
                        try check(pair.reset || pair.written[writer].isEmpty || pair.opener == reader, name,
                                  "stream \(pair.index) never reached the other end")
                        continue
                    }
                    let received = readEnd.log.received
                    let sent = pair.written[writer]
                    try check(!readEnd.log.readAfterClose, name, "stream \(pair.index) received data after it ended")
                    let overflowed = pair.ends.contains { $0?.log.overflowed == true }
                    if pair.reset || pair.writeFailed[writer] || overflowed {
                        try check(WrittenBytes.isPrefix(received, of: sent), name,
                                  "stream \(pair.index), side \(writer)→\(reader): received \(received.count) bytes that are not a prefix of the \(sent.count) written")
                    } else {
                        try check(WrittenBytes.same(received, sent), name,
                                  "stream \(pair.index) (opened by side \(pair.opener)), side \(writer)→\(reader): received \(received.count) bytes, wrote \(sent.count)"
                                    + (received.count == sent.count ? " (contents differ)" : "") + origin(of: received, among: pairs))
                        if pair.halfClosed[writer] {
                            try check(readEnd.log.inputClosed, name, "stream \(pair.index): half-close \(writer)→\(reader) never arrived")
                        }
                    }
                }
            }
        }
    }

    /// Names the stream and direction whose pattern the first received bytes follow (for a finding's report).
    static func origin(of received: [UInt8], among pairs: [Pair]) -> String {
        let probe = Array(received.prefix(8))
        guard !probe.isEmpty else { return "" }
        for pair in pairs {
            for side in 0..<2 {
                let written = pair.written[side]
                guard written.count >= probe.count else { continue }
                for start in 0...(written.count - probe.count) where Array(written[start..<start + probe.count]) == probe {
                    return "; the first bytes are stream \(pair.index)'s (opened by side \(pair.opener)) from side \(side), at offset \(start)"
                }
            }
        }
        return "; the first bytes match no stream's"
    }

    static func seeds() -> [[UInt8]] {
        [
            // open from the client, write both ways, pump, half-close both, pump
            [0x00, 0x01, 0, 0x10, 0x00, 0x06, 0xFF, 0xFF, 0x81, 0, 0x20, 0x00, 0x86, 0xFF, 0xFF, 0x03, 0, 0x83, 0, 0x06, 0xFF, 0xFF, 0x86, 0xFF, 0xFF],
            // two streams, one from each end, a large write with reads stopped (window), then resumed
            [0x00, 0x80, 0x85, 1, 0, 0x02, 1, 0xFF, 0xFF, 0x06, 0xFF, 0xFF, 0x86, 0xFF, 0xFF, 0x05, 1, 1, 0x06, 0xFF, 0xFF],
            // a reset racing a write
            [0x00, 0x01, 0, 0x00, 0x02, 0x84, 0, 0x00, 0x06, 0x00, 0x10, 0x86, 0xFF, 0xFF],
        ]
    }
}

extension MultiplexerEndpoint {
    /// The streams accepted since the last call (also added to `streams`).
    func streamsBoxAccepted() -> [(channel: Channel, log: StreamLog)] {
        let before = streams.count
        collectAccepted()
        return Array(streams[before...])
    }
}
