import NIOCore
import NIOEmbedded
import NIOHTTP1
import ThaliNodeCore
import ThaliSSDP

/// Cuts `bytes` into pieces at offsets the fuzzer chooses: one byte says how many cuts, two bytes each
/// say where. Every surface that reads a stream is fed this way, to split headers, lengths and records at
/// awkward places.
func splitPieces(_ bytes: [UInt8], cuts: [Int]) -> [ArraySlice<UInt8>] {
    guard !bytes.isEmpty else { return [] }
    let offsets = Set(cuts.map { $0 % bytes.count }).filter { $0 > 0 }.sorted()
    var pieces: [ArraySlice<UInt8>] = []
    var start = 0
    for offset in offsets + [bytes.count] {
        pieces.append(bytes[start..<offset])
        start = offset
    }
    return pieces
}

/// Reads the cut list (a count, then that many 16-bit offsets) from the front of the input.
func takeCuts(_ input: inout FuzzInput, maximum: Int = 16) -> [Int] {
    (0..<(Int(input.byte()) % (maximum + 1))).map { _ in Int(input.uint16()) }
}

/// `/NotificationBeacons` responses, as the client's real pipeline reads them (byte limit, NIO's HTTP
/// decoder, the beacon response handler), split at random points, followed by the end of the connection.
///
/// Invariants: the fetch always completes once the connection ends (no hang); an accepted body is
/// within `maxBodyBytes`; the outcome does not depend on where the bytes were split.
enum BeaconHTTPResponseHarness {
    static let name = "beacon-http-response"
    static let configuration = BeaconHTTPClientConfiguration()

    static let harness = FuzzHarness(name: name, summary: "the /NotificationBeacons client reading a response", seeds: seeds) {
        (input: inout FuzzInput) throws(FuzzInvariantViolation) in
        let cuts = takeCuts(&input)
        let response = input.rest()
        let whole = fetch(pieces: [response[...]])
        let split = fetch(pieces: splitPieces(response, cuts: cuts))
        switch (whole, split) {
        case (nil, _), (_, nil):
            throw FuzzInvariantViolation(harness: name, detail: "the fetch did not complete after the connection ended")
        case (.success(let body)?, .success(let other)?):
            try check(body.count <= configuration.maxBodyBytes, name, "accepted a body of \(body.count) bytes")
            try check(body == other, name, "the body depends on where the response was split")
        case (.failure?, .failure?):
            break
        case (let a?, let b?):
            throw FuzzInvariantViolation(harness: name, detail: "whole: \(a), split: \(b)")
        }
    }

    /// Feeds `pieces` to a fresh client pipeline, then ends the connection; nil if the fetch never completed.
    static func fetch(pieces: [ArraySlice<UInt8>]) -> Result<[UInt8], BeaconFetchError.Reason>? {
        let channel = EmbeddedChannel()
        let promise = channel.eventLoop.makePromise(of: [UInt8].self)
        let outcome = OutcomeBox<Result<[UInt8], BeaconFetchError.Reason>>()
        promise.futureResult.whenComplete { result in
            outcome.value = result.mapError { ($0 as? BeaconFetchError.Reason) ?? .malformedResponse("\($0)") }
        }
        do {
            let sync = channel.pipeline.syncOperations
            try sync.addHandler(InboundByteLimitHandler(limit: configuration.maxHeadBytes + configuration.maxBodyBytes))
            try sync.addHTTPClientHandlers()
            try sync.addHandler(BeaconResponseHandler(host: "192.0.2.1", maxBodyBytes: configuration.maxBodyBytes, promise: promise))
            try channel.connect(to: SocketAddress(ipAddress: "192.0.2.1", port: 80)).wait()
        } catch {
            promise.fail(error)
        }
        for piece in pieces where channel.isActive {
            _ = try? channel.writeInbound(ByteBuffer(bytes: piece))
        }
        channel.pipeline.fireChannelInactive()
        _ = try? channel.finish(acceptAlreadyClosed: true)
        return outcome.value
    }

    static func seeds() -> [[UInt8]] {
        let body = BeaconStreamHarness.seeds().first.map { Array($0.dropFirst()) } ?? []
        let ok = "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: \(body.count)\r\n\r\n"
        let chunked = "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream; charset=binary\r\nTransfer-Encoding: chunked\r\n\r\n"
            + "10\r\n0123456789abcdef\r\n0\r\n\r\n"
        return [
            [2, 0x10, 0, 0x40, 0] + Array(ok.utf8) + body,
            [0] + Array(chunked.utf8),
            [0] + Array("HTTP/1.1 204 No Content\r\n\r\n".utf8),
            [0] + Array("HTTP/1.0 200 OK\r\nContent-Type: application/octet-stream\r\n\r\nabc".utf8),
            [0] + Array("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".utf8),
        ]
    }
}

/// What arrives on the node's single port: the first-byte sniffer, then either the `/NotificationBeacons`
/// request pipeline (NIO's HTTP server handlers and ours) or, for a TLS record, a recorder standing where
/// PSK-TLS would be.
///
/// Invariants: on the TLS side every byte arrives, in order and exactly once (the sniffer re-delivers
/// what it held); on the HTTP side whatever we answer is an HTTP/1.1 response and never larger than one
/// response carrying the stream.
enum BeaconHTTPRequestHarness {
    static let name = "beacon-http-request"
    static let served: [UInt8] = Array((0..<(136 + 48)).map { UInt8(truncatingIfNeeded: $0) })

    final class Recorder: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        var received: [UInt8] = []
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            received += unwrapInboundIn(data).readableBytesView
        }
    }

    static let harness = FuzzHarness(name: name, summary: "the node's port: sniffer, then the beacon request handler", seeds: seeds) {
        (input: inout FuzzInput) throws(FuzzInvariantViolation) in
        let cuts = takeCuts(&input)
        let request = input.rest()
        let channel = EmbeddedChannel()
        let recorder = Recorder()
        let served = BeaconHTTPRequestHarness.served
        do {
            try channel.pipeline.syncOperations.addHandler(ConnectionKindSniffer(
                http: { channel in try BeaconHTTPServer.configureRequestHandling(on: channel, beacons: { served }) },
                secure: { channel in channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(recorder) } }))
            try channel.connect(to: SocketAddress(ipAddress: "192.0.2.1", port: 80)).wait()
        } catch {
            return
        }
        for piece in splitPieces(request, cuts: cuts) where channel.isActive {
            _ = try? channel.writeInbound(ByteBuffer(bytes: piece))
        }
        var answer: [UInt8] = []
        while let buffer = try? channel.readOutbound(as: ByteBuffer.self) { answer += buffer.readableBytesView }
        _ = try? channel.finish(acceptAlreadyClosed: true)
        if request.first == 0x16 {
            try check(recorder.received == request, name,
                      "TLS side received \(recorder.received.count) of \(request.count) bytes, or out of order")
            try check(answer.isEmpty, name, "answered a TLS connection with \(answer.count) bytes")
        } else {
            try check(recorder.received.isEmpty, name, "HTTP bytes reached the TLS side")
            if !answer.isEmpty {
                try check(answer.starts(with: Array("HTTP/1.1 ".utf8)), name, "answer is not an HTTP/1.1 response")
                try check(answer.count <= served.count + 1024, name, "answer of \(answer.count) bytes")
            }
        }
    }

    static func seeds() -> [[UInt8]] {
        let get = "GET /NotificationBeacons HTTP/1.1\r\nHost: 192.0.2.1\r\nConnection: close\r\nAccept: application/octet-stream\r\n\r\n"
        return [
            [0] + Array(get.utf8),
            [3, 1, 0, 7, 0, 30, 0] + Array(get.utf8),
            [0] + Array("GET /other HTTP/1.0\r\n\r\n".utf8),
            [0] + Array("POST /NotificationBeacons HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc".utf8),
            [2, 1, 0, 5, 0, 0x16, 0x03, 0x01, 0x00, 0x05, 0x01, 0x00, 0x00, 0x01, 0x00],
        ]
    }
}
