import Foundation
import NIOCore
import NIOEmbedded
import NIOHTTP1
import NIOPosix
import Testing
import ThaliTestSupport

@testable import ThaliSSDP

/// A TCP server that answers every connection with canned bytes (or nothing), to play a misbehaving peer.
final class CannedHTTPServer: @unchecked Sendable {
    let channel: Channel
    var port: Int { channel.localAddress?.port ?? 0 }

    /// `respond(n)` gives the bytes for the n-th connection (1-based); nil sends nothing and keeps it open.
    init(group: EventLoopGroup, respond: @escaping @Sendable (Int) -> [UInt8]?) async throws {
        let counter = NIOLockedCounter()
        channel = try await ServerBootstrap(group: group)
            .childChannelInitializer { channel in
                let n = counter.increment()
                if let bytes = respond(n) {
                    channel.writeAndFlush(channel.allocator.buffer(bytes: bytes)).whenComplete { _ in
                        channel.close(promise: nil)
                    }
                }
                return channel.eventLoop.makeSucceededVoidFuture()
            }
            .bind(host: "127.0.0.1", port: 0).get()
        self.counter = counter
    }
    private let counter: NIOLockedCounter
    var accepted: Int { counter.value }
    deinit { channel.close(promise: nil) }
}

final class NIOLockedCounter: @unchecked Sendable {
    private let lock = NSLock()
    private var count = 0
    func increment() -> Int { lock.withLock { count += 1; return count } }
    var value: Int { lock.withLock { count } }
}

/// Reads one request head off a real socket as raw bytes (no HTTP parser between the client and the
/// assertion), hands it to `heads`, answers `204 No Content` and closes.
private final class RequestHeadRecorder: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = ByteBuffer
    /// Longer heads are cut here and reported as they are.
    static let maxHeadBytes = 4096
    private var bytes: [UInt8] = []
    private var answered = false
    private let heads: AsyncStream<String>.Continuation

    init(heads: AsyncStream<String>.Continuation) { self.heads = heads }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !answered else { return }
        bytes.append(contentsOf: unwrapInboundIn(data).readableBytesView.prefix(Self.maxHeadBytes - bytes.count))
        let text = String(decoding: bytes, as: UTF8.self)
        guard text.contains("\r\n\r\n") || bytes.count >= Self.maxHeadBytes else { return }
        heads.yield(text)
        answered = true  // one head per connection
        context.writeAndFlush(NIOAny(context.channel.allocator.buffer(string: "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")))
            .whenComplete { [channel = context.channel] _ in channel.close(promise: nil) }
    }
}

private func response(status: String = "200 OK", type: String? = "application/octet-stream", body: [UInt8]) -> [UInt8] {
    var head = "HTTP/1.1 \(status)\r\nContent-Length: \(body.count)\r\nConnection: close\r\n"
    if let type { head += "Content-Type: \(type)\r\n" }
    return Array((head + "\r\n").utf8) + body
}

@Suite("GET /NotificationBeacons server and client", .serialized)
struct BeaconHTTPTests {
    let group = MultiThreadedEventLoopGroup.singleton

    var fastClient: BeaconHTTPClientConfiguration {
        var configuration = BeaconHTTPClientConfiguration()
        configuration.responseTimeout = .milliseconds(300)
        configuration.initialBackoff = .milliseconds(20)
        configuration.maxBodyBytes = 1024
        return configuration
    }

    @Test func serverAnswers204ThenTheStreamWithTheExactHeadersAndCurlAgrees() async throws {
        let server = BeaconHTTPServer(host: "127.0.0.1", group: group)
        let port = try await server.start()
        defer { Task { await server.stop() } }
        let client = BeaconHTTPClient(configuration: fastClient, group: group)
        let location = BeaconLocation(host: "127.0.0.1", port: port)
        #expect(try await client.fetch(location) == [])

        let stream: [UInt8] = (0..<200).map { UInt8($0 & 0xFF) }
        server.setBeacons(stream)
        #expect(try await client.fetch(location) == stream)

        // An independent HTTP client sees the same headers and body.
        let curl = try ChildProcess("curl", ["-s", "-i", "http://127.0.0.1:\(port)/NotificationBeacons", "-o", "-"])
        try await curl.waitForExit()
        let text = curl.output
        #expect(text.hasPrefix("HTTP/1.1 200 OK"))
        #expect(text.contains("Content-Type: application/octet-stream\r\n"))
        #expect(text.contains("Cache-Control: no-cache\r\n"))
        #expect(text.contains("Content-Length: 200\r\n"))

        let notFound = try ChildProcess("curl", ["-s", "-o", "/dev/null", "-w", "%{http_code}", "http://127.0.0.1:\(port)/other"])
        try await notFound.waitForExit()
        #expect(notFound.output == "404")
        let post = try ChildProcess("curl", ["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST",
                                             "http://127.0.0.1:\(port)/NotificationBeacons"])
        try await post.waitForExit()
        #expect(post.output == "405")
    }

    @Test func clientAcceptsLocationsWithoutPathAndAlwaysAsksForNotificationBeacons() async throws {
        let server = BeaconHTTPServer(host: "127.0.0.1", group: group)
        let port = try await server.start()
        defer { Task { await server.stop() } }
        server.setBeacons([7, 7])
        let location = try #require(BeaconLocation(parsing: "http://127.0.0.1:\(port)"))
        #expect(try await BeaconHTTPClient(configuration: fastClient, group: group).fetch(location) == [7, 7])
    }

    @Test func clientSendsHostWithThePortOfTheLocation() async throws {
        let (heads, sink) = AsyncStream.makeStream(of: String.self)
        let server = try await ServerBootstrap(group: group)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(RequestHeadRecorder(heads: sink)) }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        defer { server.close(promise: nil) }
        let port = try #require(server.localAddress?.port)
        #expect(try await BeaconHTTPClient(configuration: fastClient, group: group).fetch(BeaconLocation(host: "127.0.0.1", port: port)) == [])
        sink.finish()
        var iterator = heads.makeAsyncIterator()
        let head = try #require(await iterator.next())
        let lines = head.components(separatedBy: "\r\n")
        #expect(lines.first == "GET /NotificationBeacons HTTP/1.1")
        let hosts = lines.filter { $0.lowercased().hasPrefix("host:") }
        #expect(hosts == ["Host: 127.0.0.1:\(port)"], "RFC 9110 §7.2: the port is part of Host unless it is 80 [SSDP-6.8]")
        #expect(lines.contains("Connection: close"))
        #expect(lines.contains("Accept: application/octet-stream"))
    }

    @Test func hostHeaderLeavesOutOnlyHTTPsDefaultPort() {
        #expect(BeaconLocation(host: "192.0.2.7", port: 80).hostHeader == "192.0.2.7")
        #expect(BeaconLocation(host: "192.0.2.7", port: 8080).hostHeader == "192.0.2.7:8080")
        #expect(BeaconLocation(host: "192.0.2.7", port: 443).hostHeader == "192.0.2.7:443")
        #expect(BeaconLocation(parsing: "http://192.0.2.7/x")?.hostHeader == "192.0.2.7")
    }

    @Test func clientCutsOversizedBodiesDeclaredOrStreamed() async throws {
        let client = BeaconHTTPClient(configuration: fastClient, group: group)
        let declared = try await CannedHTTPServer(group: group) { _ in response(body: [UInt8](repeating: 1, count: 5000)) }
        await #expect(throws: BeaconFetchError(reason: .responseTooLarge(limit: 1024), location: BeaconLocation(host: "127.0.0.1", port: declared.port), attempts: 1)) {
            try await client.fetch(BeaconLocation(host: "127.0.0.1", port: declared.port))
        }
        let chunked = try await CannedHTTPServer(group: group) { _ in
            Array("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n".utf8)
                + Array(repeating: Array("100\r\n".utf8) + [UInt8](repeating: 2, count: 256) + Array("\r\n".utf8), count: 40).flatMap { $0 }
        }
        do {
            _ = try await client.fetch(BeaconLocation(host: "127.0.0.1", port: chunked.port))
            Issue.record("an endless chunked body was accepted")
        } catch {
            #expect(error.reason == .responseTooLarge(limit: 1024) || error.reason == .responseTooLarge(limit: 1024 + 8 * 1024))
            #expect(error.attempts == 1)  // not retried
        }
    }

    @Test func clientCutsSlowPeersAndRetriesWithBackoff() async throws {
        let client = BeaconHTTPClient(configuration: fastClient, group: group)
        let silent = try await CannedHTTPServer(group: group) { _ in nil }
        let started = ContinuousClock.now
        do {
            _ = try await client.fetch(BeaconLocation(host: "127.0.0.1", port: silent.port))
            Issue.record("a silent peer answered")
        } catch {
            #expect(error.reason == .timedOut)
            #expect(error.attempts == 3)
        }
        #expect(silent.accepted == 3)
        #expect(ContinuousClock.now - started >= .milliseconds(900))  // three 300 ms timeouts, not a hang

        // A 502 twice, then the stream: retries succeed.
        let flaky = try await CannedHTTPServer(group: group) { n in
            n < 3 ? response(status: "502 Bad Gateway", type: nil, body: []) : response(body: [1, 2, 3])
        }
        #expect(try await client.fetch(BeaconLocation(host: "127.0.0.1", port: flaky.port)) == [1, 2, 3])
        #expect(flaky.accepted == 3)
        // A 503 is a busy server's "later" (spec/ssdp.md 6.1): not retried at once; without a Retry-After
        // in seconds, the default wait.
        let busy = try await CannedHTTPServer(group: group) { _ in response(status: "503 Service Unavailable", type: nil, body: []) }
        do {
            _ = try await client.fetch(BeaconLocation(host: "127.0.0.1", port: busy.port))
            Issue.record("a busy server served")
        } catch {
            #expect(error.reason == .busy(retryAfter: .seconds(5)))
            #expect(error.attempts == 1)
        }
        #expect(busy.accepted == 1)
    }

    @Test func clientChecksStatusAndContentTypeWithoutRetrying() async throws {
        let client = BeaconHTTPClient(configuration: fastClient, group: group)
        let html = try await CannedHTTPServer(group: group) { _ in response(type: "text/html", body: [1]) }
        await #expect(throws: BeaconFetchError(reason: .unexpectedContentType("text/html"), location: BeaconLocation(host: "127.0.0.1", port: html.port), attempts: 1)) {
            try await client.fetch(BeaconLocation(host: "127.0.0.1", port: html.port))
        }
        let missing = try await CannedHTTPServer(group: group) { _ in response(status: "404 Not Found", type: nil, body: []) }
        await #expect(throws: BeaconFetchError(reason: .unexpectedStatus(404), location: BeaconLocation(host: "127.0.0.1", port: missing.port), attempts: 1)) {
            try await client.fetch(BeaconLocation(host: "127.0.0.1", port: missing.port))
        }
        let garbage = try await CannedHTTPServer(group: group) { _ in Array("SSH-2.0-OpenSSH\r\n\r\n".utf8) }
        do {
            _ = try await client.fetch(BeaconLocation(host: "127.0.0.1", port: garbage.port))
            Issue.record("garbage accepted")
        } catch {
            guard case .malformedResponse = error.reason else { Issue.record("\(error)"); return }
        }
    }

    @Test func clientReportsRefusedConnectionsAfterItsAttempts() async throws {
        // Bind then close to get a port nobody listens on.
        let probe = try await ServerBootstrap(group: group).bind(host: "127.0.0.1", port: 0).get()
        let port = try #require(probe.localAddress?.port)
        try await probe.close()
        do {
            _ = try await BeaconHTTPClient(configuration: fastClient, group: group).fetch(BeaconLocation(host: "127.0.0.1", port: port))
            Issue.record("connected to a closed port")
        } catch {
            guard case .connectFailed = error.reason else { Issue.record("\(error)"); return }
            #expect(error.attempts == 3)
        }
    }

    @Test func connectWaitsDoublePerAttemptAndGrowWithTheMeasuredRoundTripWithinTheirCaps() {
        let configuration = BeaconHTTPClientConfiguration()
        // Nothing measured: 1 s, then 2 s and 4 s, so that a first contact over a path slower than 1 s
        // connects on a later attempt, as TCP's own SYN retransmissions back off.
        #expect((1...5).map { configuration.connectTimeout(forAttempt: $0, roundTrip: nil) }
                == [.seconds(1), .seconds(2), .seconds(4), .seconds(8), .seconds(8)])
        // A fast path keeps the floor; a 1.4 s round trip's first sample (RTO 4.2 s) waits 8.4 s, capped at 8.
        #expect(configuration.connectTimeout(forAttempt: 1, roundTrip: .milliseconds(3)) == .seconds(1))
        #expect(configuration.connectTimeout(forAttempt: 1, roundTrip: .milliseconds(1500)) == .seconds(3))
        #expect(configuration.connectTimeout(forAttempt: 1, roundTrip: .milliseconds(4200)) == .seconds(8))
        #expect(configuration.connectTimeout(forAttempt: 2, roundTrip: .milliseconds(1500)) == .seconds(6))
        // The response: its floor plus two retransmission timeouts of the connection, capped.
        #expect(configuration.responseTimeout(roundTrip: nil) == .seconds(2))
        #expect(configuration.responseTimeout(roundTrip: .milliseconds(1500)) == .seconds(5))
        #expect(configuration.responseTimeout(roundTrip: .seconds(30)) == .seconds(10))
        // A cap set below the floor never shortens the floor.
        var tight = configuration
        tight.maxConnectTimeout = .milliseconds(500)
        tight.maxResponseTimeout = .milliseconds(500)
        #expect(tight.connectTimeout(forAttempt: 3, roundTrip: nil) == .seconds(1))
        #expect(tight.responseTimeout(roundTrip: .seconds(1)) == .seconds(2))
    }

    @Test func aFetchLearnsTheRoundTripTheKernelMeasuredAndKeepsItAcrossClients() async throws {
        let server = BeaconHTTPServer(host: "127.0.0.1", group: group)
        let port = try await server.start()
        defer { Task { await server.stop() } }
        server.setBeacons([9])
        let client = BeaconHTTPClient(configuration: fastClient, group: group)
        let location = BeaconLocation(host: "127.0.0.1", port: port)
        #expect(client.roundTrips.estimate(for: "127.0.0.1") == nil)
        #expect(try await client.fetch(location) == [9])
        let first = try #require(client.roundTrips.estimate(for: "127.0.0.1"), "no round trip learnt from the fetch")
        #expect(first.samples == 1 && first.smoothed > .zero && first.smoothed < .seconds(1))
        let next = BeaconHTTPClient(configuration: fastClient, group: group, roundTrips: client.roundTrips)
        #expect(try await next.fetch(location) == [9])
        #expect(client.roundTrips.estimate(for: "127.0.0.1")?.samples == 2)
    }

    @Test func backoffDoublesWithinTheJitterAndIsCapped() {
        var configuration = BeaconHTTPClientConfiguration()
        configuration.initialBackoff = .milliseconds(100)
        configuration.maxBackoff = .milliseconds(300)
        configuration.jitter = 0.5
        let client = BeaconHTTPClient(configuration: configuration, group: group)
        for _ in 0..<50 {
            let second = client.backoff(beforeAttempt: 2)
            let third = client.backoff(beforeAttempt: 3)
            let tenth = client.backoff(beforeAttempt: 10)
            #expect(second >= .milliseconds(50) && second <= .milliseconds(150))
            #expect(third >= .milliseconds(100) && third <= .milliseconds(300))
            #expect(tenth >= .milliseconds(150) && tenth <= .milliseconds(450))
        }
    }

    @Test func serverFiltersExcessiveRequestersAndCutsSlowOnes() async throws {
        var limits = BeaconHTTPServerLimits()
        limits.maxRequestsPerSource = 3
        limits.connectionTimeout = .milliseconds(200)
        let server = BeaconHTTPServer(host: "127.0.0.1", limits: limits, group: group)
        let port = try await server.start()
        defer { Task { await server.stop() } }
        server.setBeacons([1])
        let client = BeaconHTTPClient(configuration: fastClient, group: group)
        let location = BeaconLocation(host: "127.0.0.1", port: port)
        for _ in 0..<2 { #expect(try await client.fetch(location) == [1]) }

        // A requester that connects and says nothing is cut after the connection timeout.
        let slow = try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: port).get()
        try await slow.closeFuture.get()
        #expect(server.counters.timedOut == 1)

        // The fourth connection from this source within the window is refused: closed at once.
        var once = fastClient
        once.maxAttempts = 1
        once.connectTimeout = .milliseconds(300)
        let onceClient = BeaconHTTPClient(configuration: once, group: group)
        do {
            _ = try await onceClient.fetch(location)
            Issue.record("the per-source limit let a fourth request through")
        } catch {
            #expect(error.reason == .connectionClosed)
        }
        // For the rest of its refusal the kernel drops the source's SYNs: a connect gets no answer. The
        // filter is installed on the listener's event loop just after the refusal, so a connect racing it
        // may still be accepted and closed by the gate; it never gets an answer.
        var droppedByKernel = false
        for _ in 0..<20 where !droppedByKernel {
            do {
                _ = try await onceClient.fetch(location)
                Issue.record("the refused source got through")
            } catch {
                if case .connectTimedOut = error.reason { droppedByKernel = true } else { #expect(error.reason == .connectionClosed) }
            }
        }
        #expect(droppedByKernel, "the kernel never dropped the refused source's SYNs")
        #expect(server.counters.rejectedPerSource >= 1)
        #expect(server.counters.requestsAnswered == 2)
    }

    @Test func serverClosesItsPortUnderOverloadAndReopensIt() async throws {
        var limits = BeaconHTTPServerLimits()
        limits.maxRequestsGlobal = 5
        limits.globalWindow = .seconds(30)
        limits.overloadClosePeriod = .milliseconds(500)
        let overloads = NIOLockedCounter()
        let server = BeaconHTTPServer(host: "127.0.0.1", limits: limits, group: group) { _ in _ = overloads.increment() }
        let port = try await server.start()
        defer { Task { await server.stop() } }
        server.setBeacons([4])
        var configuration = fastClient
        configuration.maxAttempts = 1
        let client = BeaconHTTPClient(configuration: configuration, group: group)
        let location = BeaconLocation(host: "127.0.0.1", port: port)
        for _ in 0..<5 { #expect(try await client.fetch(location) == [4]) }
        await #expect(throws: BeaconFetchError.self) { try await client.fetch(location) }  // the sixth trips it
        #expect(server.counters.overloadShutdowns == 1)
        #expect(overloads.value == 1)
        #expect(server.isClosedForOverload)
        do {
            _ = try await client.fetch(location)
            Issue.record("the port stayed open")
        } catch {
            guard case .connectFailed = error.reason else { Issue.record("\(error)"); return }
        }
        try await eventually("the port reopens after the close period") { !server.isClosedForOverload }
        // The close period was the penalty: the reopened port counts afresh and serves again.
        #expect(try await client.fetch(location) == [4])
        #expect(server.counters.overloadShutdowns == 1)
    }

    @Test func responseHandlerCopesWithBytesSplitAnywhere() throws {
        let stream: [UInt8] = Array(0..<100)
        let wire = Array("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 100\r\n\r\n".utf8) + stream
        for split in [1, 2, 7, 17, 50] {
            let channel = EmbeddedChannel()
            let promise = channel.eventLoop.makePromise(of: [UInt8].self)
            try channel.pipeline.syncOperations.addHTTPClientHandlers()
            try channel.pipeline.syncOperations.addHandler(BeaconResponseHandler(host: "h", maxBodyBytes: 1000, promise: promise))
            try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
            var request = try #require(try channel.readOutbound(as: ByteBuffer.self))
            var more = try channel.readOutbound(as: ByteBuffer.self)
            while let next = more { request.writeImmutableBuffer(next); more = try channel.readOutbound(as: ByteBuffer.self) }
            let requestText = String(buffer: request)
            #expect(requestText.hasPrefix("GET /NotificationBeacons HTTP/1.1\r\n"))
            var offset = 0
            while offset < wire.count {
                let end = min(offset + split, wire.count)
                try channel.writeInbound(ByteBuffer(bytes: wire[offset..<end]))
                offset = end
            }
            #expect(try promise.futureResult.wait() == stream)
            _ = try? channel.finish()
        }
    }
}

@Suite("Beacon request handler")
struct BeaconRequestHandlerTests {
    /// Sends `request` through the server pipeline in an EmbeddedChannel and returns the response text.
    func exchange(_ request: String, beacons: [UInt8]?) throws -> String {
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.configureHTTPServerPipeline(withPipeliningAssistance: false)
        try channel.pipeline.syncOperations.addHandler(BeaconRequestHandler(beacons: { beacons }))
        for byte in request.utf8 {  // one byte at a time: the worst split there is
            try channel.writeInbound(ByteBuffer(bytes: [byte]))
        }
        var text = ""
        while let buffer = try channel.readOutbound(as: ByteBuffer.self) { text += String(buffer: buffer) }
        _ = try? channel.finish()
        return text
    }

    @Test func answersWithTheExactStatusAndHeaders() throws {
        let get = "GET /NotificationBeacons HTTP/1.1\r\nHost: x\r\n\r\n"
        let empty = try exchange(get, beacons: nil)
        #expect(empty.hasPrefix("HTTP/1.1 204 No Content\r\n"))
        #expect(!empty.contains("Content-Type"))
        let full = try exchange(get, beacons: [0x41, 0x42])
        #expect(full.hasPrefix("HTTP/1.1 200 OK\r\n"))
        #expect(full.contains("\r\nContent-Type: application/octet-stream\r\n"))
        #expect(full.contains("\r\nCache-Control: no-cache\r\n"))
        #expect(full.contains("\r\nContent-Length: 2\r\n"))
        #expect(full.hasSuffix("\r\n\r\nAB"))
        #expect(try exchange("GET /NotificationBeacons?x=1 HTTP/1.1\r\nHost: x\r\n\r\n", beacons: [1]).hasPrefix("HTTP/1.1 200 OK"))
        #expect(try exchange("GET / HTTP/1.1\r\nHost: x\r\n\r\n", beacons: [1]).hasPrefix("HTTP/1.1 404 Not Found"))
        let head = try exchange("HEAD /NotificationBeacons HTTP/1.1\r\nHost: x\r\n\r\n", beacons: [1])
        #expect(head.hasPrefix("HTTP/1.1 405 Method Not Allowed") && head.contains("Allow: GET"))
    }

    /// Found by the beacon-http-request fuzz harness: requests pipelined behind the first were each
    /// answered before the close took effect, so one small packet drew the beacon stream many times.
    /// A connection gets one answer.
    @Test func pipelinedRequestsGetOneAnswer() throws {
        let get = "GET /NotificationBeacons HTTP/1.1\r\nHost: x\r\n\r\n"
        let stream = [UInt8](repeating: 0x42, count: 184)
        let channel = EmbeddedChannel()
        try BeaconHTTPServer.configureRequestHandling(on: channel, beacons: { stream })
        try channel.writeInbound(ByteBuffer(string: String(repeating: get, count: 20)))
        var text = ""
        while let buffer = try channel.readOutbound(as: ByteBuffer.self) { text += String(buffer: buffer) }
        _ = try? channel.finish()
        #expect(text.components(separatedBy: "HTTP/1.1 200 OK").count == 2, "\(text.count) bytes answered")
        #expect(text.hasSuffix(String(repeating: "B", count: 184)))
    }
}
