import Foundation
import NIOCore
import NIOPosix
import Testing
@testable import ThaliNodeCore

/// Delivery moves a file in blocks (1 MiB by default) and reuses a block's memory once nothing holds it
/// any more: allocating a fresh block for each had the allocator hand memory back to the kernel and fault
/// it in again (half the page faults of a 256 MiB delivery, spec/node.md). Reuse must never touch a
/// block whose frames are still in flight.
@Suite("Block buffers reused, never while held")
struct BlockBufferReuseTests {
    /// Where `buffer`'s readable bytes are in memory.
    static func address(of buffer: ByteBuffer) -> Int {
        buffer.withUnsafeReadableBytes { Int(bitPattern: $0.baseAddress) }
    }

    @Test("a block read into a buffer nothing else holds keeps its memory; one still held keeps its bytes")
    func readReusesOnlyAFreeBuffer() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("thali-reuse-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        let content = (0..<(192 << 10)).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ $0 >> 9) }
        try Data(content).write(to: URL(fileURLWithPath: path))
        let handle = try #require(FileHandle(forReadingAtPath: path))
        defer { try? handle.close() }
        let block = 64 << 10

        var buffer = ByteBuffer()
        #expect(try FileContent.read(block, at: 0, from: handle.fileDescriptor, into: &buffer))
        #expect(Array(buffer.readableBytesView) == Array(content[0..<block]))
        let first = Self.address(of: buffer)
        #expect(try FileContent.read(block, at: UInt64(block), from: handle.fileDescriptor, into: &buffer))
        #expect(Array(buffer.readableBytesView) == Array(content[block..<2 * block]))
        #expect(Self.address(of: buffer) == first, "a buffer held by nothing else was not reused")

        // A frame of this block still on its way holds the memory: the next read goes elsewhere.
        let inFlight = buffer.getSlice(at: buffer.readerIndex, length: 1024)
        #expect(try FileContent.read(block, at: UInt64(2 * block), from: handle.fileDescriptor, into: &buffer))
        #expect(Array(buffer.readableBytesView) == Array(content[(2 * block)...]))
        #expect(inFlight.map { Array($0.readableBytesView) } == Array(content[block..<block + 1024]))
        #expect(Self.address(of: buffer) != first)

        // Past the end: the file is shorter than asked.
        #expect(try !FileContent.read(block, at: UInt64(3 * block) - 10, from: handle.fileDescriptor, into: &buffer))
    }

    @Test("a handoff gives the job that takes a buffer its only reference, and is empty after")
    func handoffGivesTheOnlyReference() async throws {
        var block = ByteBuffer(repeating: 0xAB, count: 1 << 20)
        let original = Self.address(of: block)
        let handoff = BufferHandoff(block)
        block = ByteBuffer()
        // As a pool job does: take the block, clear it for the next content.
        let reused = try await NIOThreadPool.singleton.runIfActive { () -> Bool in
            guard var taken = handoff.take() else { return false }
            taken.clear(minimumCapacity: 1 << 20)
            taken.writeRepeatingByte(0xCD, count: 16)
            return Self.address(of: taken) == original
        }
        #expect(reused, "the taken buffer was not the only reference to its memory")
        #expect(handoff.take() == nil)
        handoff.put(ByteBuffer(bytes: [1, 2, 3]))
        #expect(handoff.take()?.readableBytes == 3)
    }
}
