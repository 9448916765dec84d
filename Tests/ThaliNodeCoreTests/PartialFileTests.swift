import Foundation
import NIOCore
import Testing
@testable import ThaliNodeCore

/// The receiver's partial file with direct I/O: whatever the sizes of the appends and wherever a resume
/// starts, the file holds exactly the bytes appended, in order; what does not fill an aligned unit is
/// written at the end (and when a failing session closes the file, for its resume).
@Suite("Partial files written with direct I/O")
struct PartialFileTests {
    static func content(_ count: Int, seed: Int = 0) -> [UInt8] {
        (0..<count).map { UInt8(truncatingIfNeeded: ($0 &+ seed) &* 2654435761 >> 13) }
    }

    static func scratch(in directory: String = FileManager.default.temporaryDirectory.path) -> String {
        directory + "/thali-partial-\(UUID().uuidString).part"
    }

    @Test("appends of awkward sizes, a resume at an unaligned offset: the file holds exactly what was appended",
          arguments: [0, 1, 4095, 4096, 70_000])
    func contentIsExact(resumeAt offset: Int) throws {
        let path = Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: path) }
        let prefix = Self.content(offset, seed: 7)
        try Data(prefix + Self.content(5000, seed: 99)).write(to: URL(fileURLWithPath: path))  // beyond the offset: cut off
        let file = try PartialFile(path: path, keeping: UInt64(offset), directWriteBytes: 64 << 10)
        #expect(file.writesDirectly, "this test's directory is on a file system without direct I/O")
        var expected = prefix
        // 1-byte, sub-page, page-sized, block-sized and over-block appends in a mixed order.
        for (index, size) in [1, 3000, 4096, 65_536, 5, 70_001, 8191, 65_536 + 4096, 1, 100_000].enumerated() {
            let bytes = Self.content(size, seed: index * 1000)
            try file.append(ByteBuffer(bytes: bytes))
            expected += bytes
        }
        try file.finish()
        let written = try [UInt8](Data(contentsOf: URL(fileURLWithPath: path)))
        #expect(written.count == expected.count)
        #expect(written == expected)
    }

    @Test("a file closed without finishing keeps every byte appended, the unaligned tail included")
    func closeKeepsTheTail() throws {
        let path = Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: path) }
        let file = try PartialFile(path: path, keeping: 0, directWriteBytes: 64 << 10)
        let bytes = Self.content(3 * 4096 + 123)
        try file.append(ByteBuffer(bytes: bytes))
        file.close()
        #expect(try [UInt8](Data(contentsOf: URL(fileURLWithPath: path))) == bytes)
    }

    @Test("on tmpfs (direct I/O or not, depending on the kernel) the content is the same")
    func tmpfsContentIsExact() throws {
        let shm = "/dev/shm"
        try #require(FileManager.default.isWritableFile(atPath: shm), "no tmpfs at /dev/shm")
        let path = Self.scratch(in: shm)
        defer { try? FileManager.default.removeItem(atPath: path) }
        let file = try PartialFile(path: path, keeping: 0, directWriteBytes: 64 << 10)
        let bytes = Self.content(200_001)
        try file.append(ByteBuffer(bytes: bytes))
        try file.finish()
        #expect(try [UInt8](Data(contentsOf: URL(fileURLWithPath: path))) == bytes)
    }

    @Test("without direct writes asked for, the file is written through the page cache")
    func bufferedWhenNotAsked() throws {
        let path = Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: path) }
        let file = try PartialFile(path: path, keeping: 0)
        #expect(!file.writesDirectly)
        let bytes = Self.content(10_000)
        try file.append(ByteBuffer(bytes: bytes))
        try file.finish()
        #expect(try [UInt8](Data(contentsOf: URL(fileURLWithPath: path))) == bytes)
    }
}
