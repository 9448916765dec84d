import NIOCore
import NIOEmbedded
import Testing
@testable import ThaliPSKTLS

extension PSKTLSTests {
    /// How the handler packs ciphertext into the buffers it hands the channel (the relay's cost per byte,
    /// spec/psk-tls.md "Performance").
    @Suite struct CiphertextBufferTests {
        /// Every ciphertext buffer the client has written so far.
        private func written(by channel: EmbeddedChannel) throws -> [ByteBuffer] {
            var buffers: [ByteBuffer] = []
            while let buffer = try channel.readOutbound(as: ByteBuffer.self) { buffers.append(buffer) }
            return buffers
        }

        /// Runs `body` on a client and server that have completed their handshake, checking for leaks.
        private func afterHandshake(_ body: (EmbeddedPair) throws -> Void) throws {
            try expectNoLeaksNow {
                let pair = try EmbeddedPair()
                defer { pair.finish() }
                try pair.activate()
                try pair.exchange()
                try body(pair)
            }
        }

        private func deliver(_ buffers: [ByteBuffer], to pair: EmbeddedPair) throws {
            for buffer in buffers { try pair.server.writeInbound(buffer) }
        }

        @Test func theWritesOfOneFlushGoOutInOneBufferWithEveryPromiseKept() throws {
            try afterHandshake { pair in
                // A multiplexer frame: a 12-byte header, then its payload; then a second frame.
                let writes = [ByteBuffer(repeating: 1, count: 12), ByteBuffer(repeating: 2, count: 65_536),
                              ByteBuffer(repeating: 3, count: 12), ByteBuffer(repeating: 4, count: 1000)]
                let promises = writes.map { _ in pair.client.eventLoop.makePromise(of: Void.self) }
                for (write, promise) in zip(writes, promises) { pair.client.write(write, promise: promise) }
                pair.client.flush()
                let buffers = try written(by: pair.client)
                #expect(buffers.count == 1)
                for promise in promises { #expect(throws: Never.self) { try promise.futureResult.wait() } }
                try deliver(buffers, to: pair)
                #expect(pair.serverRecorder.received == writes.flatMap { Array($0.readableBytesView) })
            }
        }

        /// The plaintext length of each TLS record in `buffers` (5-byte header, 8-byte nonce, 16-byte tag).
        private func recordPlaintextLengths(_ buffers: [ByteBuffer]) -> [Int] {
            var lengths: [Int] = []
            for var buffer in buffers {
                while buffer.readableBytes >= 5, let length = buffer.getInteger(at: buffer.readerIndex + 3, as: UInt16.self) {
                    lengths.append(Int(length) - 24)
                    buffer.moveReaderIndex(forwardBy: 5 + Int(length))
                }
                #expect(buffer.readableBytes == 0)
            }
            return lengths
        }

        @Test func theSmallWritesOfOneFlushAreOneRecord() throws {
            try afterHandshake { pair in
                // A relayed 64-byte message: the multiplexer's 12-byte frame header, then the payload.
                let writes = [ByteBuffer(repeating: 1, count: 12), ByteBuffer(repeating: 2, count: 64)]
                let promises = writes.map { _ in pair.client.eventLoop.makePromise(of: Void.self) }
                for (write, promise) in zip(writes, promises) { pair.client.write(write, promise: promise) }
                pair.client.flush()
                let buffers = try written(by: pair.client)
                #expect(recordPlaintextLengths(buffers) == [76])
                for promise in promises { #expect(throws: Never.self) { try promise.futureResult.wait() } }
                try deliver(buffers, to: pair)
                #expect(pair.serverRecorder.received == writes.flatMap { Array($0.readableBytesView) })
            }
        }

        @Test func smallWritesAreGatheredUpToOneRecordAndLargeOnesEncryptedWhereTheyAre() throws {
            try afterHandshake { pair in
                let writes = [ByteBuffer(repeating: 1, count: 12), ByteBuffer(repeating: 2, count: 65_536),
                              ByteBuffer(repeating: 3, count: 12), ByteBuffer(repeating: 4, count: 1000)]
                    + (0..<5).map { ByteBuffer(repeating: UInt8(5 + $0), count: 4000) }
                for write in writes { pair.client.write(write, promise: nil) }
                pair.client.flush()
                let buffers = try written(by: pair.client)
                // The header alone (the payload is too large to copy), the payload in full records, then
                // the small writes together until the next would overflow a record.
                #expect(recordPlaintextLengths(buffers) == [12, 16_384, 16_384, 16_384, 16_384, 1012 + 12_000, 8000])
                try deliver(buffers, to: pair)
                #expect(pair.serverRecorder.received == writes.flatMap { Array($0.readableBytesView) })
            }
        }

        @Test func coalescingCanBeTurnedOff() throws {
            try expectNoLeaksNow {
                let pair = try EmbeddedPair(configure: { $0.coalescedWriteLimit = 0 })
                defer { pair.finish() }
                try pair.activate()
                try pair.exchange()
                pair.client.write(ByteBuffer(repeating: 1, count: 12), promise: nil)
                pair.client.write(ByteBuffer(repeating: 2, count: 64), promise: nil)
                pair.client.flush()
                #expect(recordPlaintextLengths(try written(by: pair.client)) == [12, 64])
            }
        }

        @Test func aLargeWriteIsCutIntoBuffersOfTheConfiguredSize() throws {
            try afterHandshake { pair in
                let message = (0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 7) }
                try pair.client.writeOutbound(ByteBuffer(bytes: message))
                let buffers = try written(by: pair.client)
                // 1 MiB of plaintext is about four 256 KiB buffers of ciphertext, none larger.
                #expect(buffers.count == 5)
                #expect(buffers.allSatisfy { $0.readableBytes <= 256 << 10 && $0.capacity <= 256 << 10 },
                        "\(buffers.map(\.capacity))")
                try deliver(buffers, to: pair)
                #expect(pair.serverRecorder.received == message)
            }
        }

        @Test func ciphertextGoesIntoABufferTheChannelHasFinishedWithAndNeverIntoOneItHolds() throws {
            try afterHandshake { pair in
                let handler = try pair.client.pipeline.syncOperations.handler(type: PSKTLSHandler.self)
                // The channel still holds the first buffer when the second write comes: fresh memory,
                // and the first buffer's ciphertext stays intact.
                do {
                    try pair.client.writeOutbound(ByteBuffer(repeating: 5, count: 100_000))
                    let held = try written(by: pair.client)
                    let heldCopy = held.map { Array($0.readableBytesView) }
                    try pair.client.writeOutbound(ByteBuffer(repeating: 6, count: 100_000))
                    #expect(handler.connection.reusedOutputBuffers == 0)
                    #expect(held.map { Array($0.readableBytesView) } == heldCopy)
                    try deliver(held + written(by: pair.client), to: pair)
                }
                // Now the channel is done with both: the next large writes reuse their memory.
                try pair.client.writeOutbound(ByteBuffer(repeating: 7, count: 100_000))
                try deliver(try written(by: pair.client), to: pair)
                try pair.client.writeOutbound(ByteBuffer(repeating: 8, count: 100_000))
                try deliver(try written(by: pair.client), to: pair)
                #expect(handler.connection.reusedOutputBuffers == 2)
                let expected = [UInt8](repeating: 5, count: 100_000) + [UInt8](repeating: 6, count: 100_000)
                    + [UInt8](repeating: 7, count: 100_000) + [UInt8](repeating: 8, count: 100_000)
                #expect(pair.serverRecorder.received == expected)
            }
        }
    }
}
