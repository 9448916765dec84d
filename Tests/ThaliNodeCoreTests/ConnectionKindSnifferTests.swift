import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import Testing
@testable import ThaliNodeCore

/// The single port's first-byte switch, fed bytes split at awkward places.
@Suite("ConnectionKindSniffer")
struct ConnectionKindSnifferTests {
    /// Records which initializer ran and what reached the end of the pipeline.
    final class Recorder: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        let bytes = NIOLockedValueBox<[UInt8]>([])
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            bytes.withLockedValue { $0 += unwrapInboundIn(data).readableBytesView }
        }
    }

    private func run(_ input: [UInt8], splits: [Int]) throws -> (kind: String?, bytes: [UInt8]) {
        let channel = EmbeddedChannel()
        let kind = NIOLockedValueBox<String?>(nil)
        let recorder = Recorder()
        try channel.pipeline.syncOperations.addHandler(ConnectionKindSniffer(
            http: { channel in
                kind.withLockedValue { $0 = "http" }
                try channel.pipeline.syncOperations.addHandler(recorder)
            },
            secure: { channel in
                kind.withLockedValue { $0 = "tls" }
                return channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(recorder) }
            }))
        var start = 0
        for end in splits + [input.count] where end > start {
            try channel.writeInbound(channel.allocator.buffer(bytes: input[start..<end]))
            start = end
        }
        _ = try? channel.finish()
        return (kind.withLockedValue { $0 }, recorder.bytes.withLockedValue { $0 })
    }

    @Test("0x16 first goes to TLS with every byte, however the bytes are split", arguments: [[], [1], [1, 2], [3, 7, 8]])
    func tlsGetsEveryByte(splits: [Int]) throws {
        let hello: [UInt8] = [0x16, 0x03, 0x01, 0x00, 0x2F, 0x01, 0x00, 0x00, 0x2B, 0x03, 0x03] + Array(repeating: 0xAB, count: 20)
        let (kind, bytes) = try run(hello, splits: splits)
        #expect(kind == "tls")
        #expect(bytes == hello)
    }

    @Test("anything else is HTTP with every byte", arguments: [[], [1], [4, 5]])
    func httpGetsEveryByte(splits: [Int]) throws {
        let request = Array("GET /NotificationBeacons HTTP/1.1\r\nHost: x\r\n\r\n".utf8)
        let (kind, bytes) = try run(request, splits: splits)
        #expect(kind == "http")
        #expect(bytes == request)
    }

    @Test("an empty read decides nothing")
    func emptyReadWaits() throws {
        let (kind, bytes) = try run([], splits: [])
        #expect(kind == nil)
        #expect(bytes.isEmpty)
    }
}
