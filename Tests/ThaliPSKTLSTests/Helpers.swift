import Foundation
import NIOCore
import NIOPosix
import Testing
import ThaliPSKTLS
import ThaliTestSupport

/// Every test in this target shares one global counter of live OpenSSL objects and starts peer
/// processes, so the whole target runs serialized (the nested suites inherit the trait).
@Suite(.serialized) struct PSKTLSTests {}

enum Fixtures {
    /// A 192-character identity, the length of a Thali (profile `spec`) identity: base64 of 144 bytes.
    static let identity192 = Data((0..<144).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 3) }).base64EncodedString()
    static let psk: [UInt8] = Array(0x10..<0x20)
    static let otherPSK: [UInt8] = Array(0x20..<0x30)

    static func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

    /// A directory for files the tests generate (DH parameter files, GnuTLS PSK files), removed when
    /// the test process exits.
    static let scratch: String = {
        let path = NSTemporaryDirectory() + "thali-psktls-\(getpid())"
        try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        atexit { try? FileManager.default.removeItem(atPath: Fixtures.scratch) }
        return path
    }()

    /// A PEM file with the parameters of a named DH group, made by `openssl genpkey`.
    static func dhParameterFile(_ group: String) async throws -> String {
        let path = "\(scratch)/\(group).pem"
        if FileManager.default.fileExists(atPath: path) { return path }
        let tool = try ChildProcess("openssl", ["genpkey", "-genparam", "-algorithm", "DH", "-pkeyopt", "group:\(group)", "-out", path])
        let status = try await tool.waitForExit()
        #expect(status == 0, "openssl genpkey: \(tool.output)")
        return path
    }
}

/// Runs `body`, then waits until every OpenSSL object it created has been freed (channels close
/// asynchronously) and fails the test if some remain. All test targets share one process, so an earlier
/// suite's connections may still be closing when this starts: the baseline is taken once the counts
/// have settled, and a count may end below it (those late frees) but never above.
func expectNoLeaks(_ body: () async throws -> Void, sourceLocation: SourceLocation = #_sourceLocation) async throws {
    let before = try await settledLiveObjects()
    try await body()
    _ = try await waitUntil(timeout: .seconds(5)) { PSKTLSDiagnostics.liveObjects.isWithin(before) }
    #expect(PSKTLSDiagnostics.liveObjects.isWithin(before), "live OpenSSL objects before: \(before)",
            sourceLocation: sourceLocation)
}

/// Runs `body` (which frees everything synchronously, like EmbeddedChannel tests) and fails the test
/// if OpenSSL objects it created remain.
func expectNoLeaksNow(_ body: () throws -> Void, sourceLocation: SourceLocation = #_sourceLocation) throws {
    let before = PSKTLSDiagnostics.liveObjects
    try body()
    #expect(PSKTLSDiagnostics.liveObjects.isWithin(before), "live OpenSSL objects before: \(before)",
            sourceLocation: sourceLocation)
}

/// The live-object counts once they have stopped changing for 100 ms (at most 5 s).
func settledLiveObjects() async throws -> PSKTLSDiagnostics.LiveObjects {
    try await waitUntilSettled(quiet: .milliseconds(100), timeout: .seconds(5)) { PSKTLSDiagnostics.liveObjects }.value
}

extension PSKTLSDiagnostics.LiveObjects {
    /// Whether no count exceeds `baseline`'s.
    func isWithin(_ baseline: Self) -> Bool {
        contexts <= baseline.contexts && connections <= baseline.connections && dhParameters <= baseline.dhParameters
    }
}

/// Polls `condition` until it holds or `timeout` passes (for state another thread updates, such as a
/// server's counters after its side of a connection closed); returns whether it held.
func eventually(timeout: Duration = .seconds(5), _ condition: () -> Bool) async throws -> Bool {
    try await waitUntil(timeout: timeout, every: .milliseconds(10), condition)
}

/// Waits for `ACCEPT host:port` from `openssl s_server` and returns the port.
func acceptPort(of server: ChildProcess) async throws -> Int {
    try await server.waitForOutput(containing: "ACCEPT")
    let line = try #require(server.output.split(separator: "\n").first { $0.hasPrefix("ACCEPT") })
    return try #require(Int(line.split(separator: ":").last ?? ""))
}

/// Reads from the inbound stream until `count` bytes arrived or it ended.
func readBytes(_ iterator: inout NIOAsyncChannelInboundStream<ByteBuffer>.AsyncIterator, count: Int) async throws -> [UInt8] {
    var received: [UInt8] = []
    while received.count < count, let buffer = try await iterator.next() {
        received += buffer.readableBytesView
    }
    return received
}

/// Reads until the stream ends.
func readAll(_ iterator: inout NIOAsyncChannelInboundStream<ByteBuffer>.AsyncIterator) async throws -> [UInt8] {
    var received: [UInt8] = []
    while let buffer = try await iterator.next() { received += buffer.readableBytesView }
    return received
}

/// A TCP peer that is not TLS: it sends fixed bytes (or nothing) and keeps the connection open.
final class RawTCPClient {
    let channel: any Channel

    init(port: Int, sending bytes: [UInt8]) async throws {
        channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connect(host: "127.0.0.1", port: port).get()
        if !bytes.isEmpty { try await channel.writeAndFlush(ByteBuffer(bytes: bytes)) }
    }

    func close() async { try? await channel.close() }
}

/// A TCP listener that accepts and never answers (a peer that stalls in the handshake), or that hangs
/// up at once.
final class SilentTCPServer {
    let channel: any Channel
    var port: Int { channel.localAddress?.port ?? 0 }

    init(hangUp: Bool = false) async throws {
        channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelInitializer { child in
                if hangUp { child.close(promise: nil) }
                return child.eventLoop.makeSucceededVoidFuture()
            }
            .bind(host: "127.0.0.1", port: 0).get()
    }

    func close() async { try? await channel.close() }
}

extension PSKTLSError.Reason {
    /// The alert of an `alertSent`/`alertReceived` reason.
    var alert: TLSAlert? {
        switch self {
        case .alertSent(let alert), .alertReceived(let alert): alert
        default: nil
        }
    }
}
