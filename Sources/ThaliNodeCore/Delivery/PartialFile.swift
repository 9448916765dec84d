import Foundation
import NIOCore
#if canImport(Glibc)
import Glibc
#endif

/// A file being received: truncated to the agreed offset, then appended to in blocks. Used by one
/// session at a time (each write awaited before the next; a writeback request, which only reads the
/// descriptor, may run beside a write), hence unchecked.
///
/// Where the file system allows it, content goes to the disk with direct I/O (`O_DIRECT`) rather than
/// through the page cache: each block is copied into memory aligned for the device (the same memory
/// every time) and its whole aligned part written from there; what does not fill an aligned unit waits
/// for the next block, and the last of it goes through the page cache at ``finish()``. Writing a large
/// file through the page cache costs a fresh page of memory for every 4 KiB, which on a virtual
/// machine that returns freed memory to its host (free page reporting) is faulted in on the host:
/// there it cost more CPU than the rest of the delivery (spec/node.md). An offset or a length that is
/// not aligned, and a file system that refuses direct I/O, use the page cache as before.
final class PartialFile: @unchecked Sendable {
    /// The unit direct writes are aligned to, in the file and in memory: a page, which is a multiple of
    /// every logical block size Linux file systems use for direct I/O.
    static let directAlignment = 4096

    private let handle: FileHandle
    private let path: String
    private var closed = false
    /// Where the next byte goes in the file.
    private var end: UInt64
    /// The descriptor opened with `O_DIRECT` and its aligned staging memory; nil where direct I/O is
    /// unavailable or was refused.
    private var direct: DirectWrites?
    /// Bytes at the start of `direct`'s staging memory not yet written (fewer than `directAlignment`).
    private var staged = 0

    /// Opens (creating) `path` and keeps its first `offset` bytes. `directWriteBytes` (0: never) is
    /// the size of the writes to make with direct I/O.
    init(path: String, keeping offset: UInt64, directWriteBytes: Int = 0) throws {
        if !FileManager.default.fileExists(atPath: path) {
            guard FileManager.default.createFile(atPath: path, contents: nil) else {
                throw NodeError.dataDirectoryUnusable(path: path, reason: "cannot create the partial file")
            }
        }
        guard let handle = FileHandle(forUpdatingAtPath: path) else {
            throw NodeError.dataDirectoryUnusable(path: path, reason: "cannot open the partial file")
        }
        self.handle = handle
        self.path = path
        self.end = offset
        try handle.truncate(atOffset: offset)
        try handle.seekToEnd()
        if directWriteBytes > 0 { direct = DirectWrites(path: path, writeBytes: directWriteBytes) }
    }

    deinit { close() }

    /// Whether writes go to the disk with direct I/O (false once the file system refused one).
    var writesDirectly: Bool { direct != nil }

    /// Writes `bytes` at the end (with direct I/O where it can, else straight from the buffer).
    func append(_ bytes: ByteBuffer) throws {
        try bytes.withUnsafeReadableBytes { raw in
            try inWords {
                var rest = raw
                // An unaligned end (a resumed offset) is brought to alignment through the page cache.
                if direct != nil, staged == 0, end % UInt64(Self.directAlignment) != 0 {
                    let head = min(rest.count, Self.directAlignment - Int(end % UInt64(Self.directAlignment)))
                    try writeBuffered(UnsafeRawBufferPointer(rebasing: rest.prefix(head)))
                    rest = UnsafeRawBufferPointer(rebasing: rest.dropFirst(head))
                }
                while let direct, !rest.isEmpty {
                    let taken = direct.stage(UnsafeRawBufferPointer(rebasing: rest.prefix(direct.capacity - staged)), after: staged)
                    staged += taken
                    rest = UnsafeRawBufferPointer(rebasing: rest.dropFirst(taken))
                    let whole = staged - staged % Self.directAlignment
                    guard whole > 0 else { continue }
                    do {
                        try direct.write(whole, at: end)
                    } catch let error as POSIXError where error.code == .EINVAL {
                        // The file system refuses direct I/O here: everything from now on is buffered.
                        self.direct = nil
                        try writeBuffered(direct.stagedBytes(staged))
                        staged = 0
                        break
                    }
                    end += UInt64(whole)
                    direct.keepTail(from: whole, count: staged - whole)
                    staged -= whole
                }
                if !rest.isEmpty { try writeBuffered(rest) }
            }
        }
    }

    /// Asks the kernel to start writing `length` bytes at `offset` to the disk (not waiting for it).
    func startWriteback(offset: UInt64, length: UInt64) {
        FileContent.startWriteback(of: handle.fileDescriptor, offset: offset, length: Int(clamping: length))
    }

    /// Writes what is staged, makes the content durable and closes the file.
    func finish() throws {
        try inWords {
            try writeStaged()
            try handle.synchronize()
        }
        close()
    }

    /// Writes what is staged (kept for a resume) and closes the file; errors are ignored (the session
    /// is failing anyway).
    func close() {
        guard !closed else { return }
        closed = true
        try? writeStaged()
        direct?.close()
        direct = nil
        try? handle.close()
    }

    /// Writes the staged bytes (less than an aligned unit) through the page cache.
    private func writeStaged() throws {
        guard let direct, staged > 0 else { return }
        try writeBuffered(direct.stagedBytes(staged))
        staged = 0
    }

    /// Writes `bytes` at `end` through the page cache.
    private func writeBuffered(_ bytes: UnsafeRawBufferPointer) throws {
        try FileContent.writeAll(bytes, to: handle.fileDescriptor, at: end)
        end += UInt64(bytes.count)
    }

    /// Runs a write; its failure (a full disk) becomes a ``NodeError`` in words, as events print it.
    private func inWords(_ body: () throws -> Void) throws {
        do { try body() } catch {
            throw NodeError.dataDirectoryUnusable(path: path, reason: SystemErrorText.describe(error))
        }
    }
}

/// A descriptor of a file opened for direct I/O and the aligned memory its writes come from; owns both.
private final class DirectWrites {
    /// `O_DIRECT`, which Glibc's Swift module does not export; nil where its value is not known here.
    private static let directFlag: Int32? = {
        #if arch(x86_64) || arch(i386)
        return 0o40000
        #elseif arch(arm64) || arch(arm)
        return 0o200000
        #else
        return nil
        #endif
    }()

    private let descriptor: Int32
    private let memory: UnsafeMutableRawPointer
    /// How many bytes the staging memory holds.
    let capacity: Int

    /// Opens `path` for direct writes with room to stage `writeBytes` (and an aligned unit more); nil
    /// where the file system or the platform has no direct I/O.
    init?(path: String, writeBytes: Int) {
        guard let flag = Self.directFlag else { return nil }
        let alignment = PartialFile.directAlignment
        let capacity = (writeBytes + 2 * alignment - 1) / alignment * alignment
        let descriptor = Glibc.open(path, O_WRONLY | O_CLOEXEC | flag)
        guard descriptor >= 0 else { return nil }
        var memory: UnsafeMutableRawPointer?
        guard posix_memalign(&memory, alignment, capacity) == 0, let memory else {
            Glibc.close(descriptor)
            return nil
        }
        (self.descriptor, self.memory, self.capacity) = (descriptor, memory, capacity)
    }

    deinit {
        close()
        free(memory)
    }

    /// Copies as much of `bytes` as fits after the first `offset` staged bytes; returns how many.
    func stage(_ bytes: UnsafeRawBufferPointer, after offset: Int) -> Int {
        let count = min(bytes.count, capacity - offset)
        if count > 0, let source = bytes.baseAddress { (memory + offset).copyMemory(from: source, byteCount: count) }
        return count
    }

    /// The first `count` staged bytes.
    func stagedBytes(_ count: Int) -> UnsafeRawBufferPointer {
        UnsafeRawBufferPointer(start: memory, count: count)
    }

    /// Writes the first `count` staged bytes (a multiple of the alignment) at `offset` (aligned). A
    /// short write would leave the rest unaligned, which the next direct write refuses (`EINVAL`): the
    /// caller then writes what is staged through the page cache.
    func write(_ count: Int, at offset: UInt64) throws {
        try FileContent.writeAll(UnsafeRawBufferPointer(start: memory, count: count), to: descriptor, at: offset)
    }

    /// Moves the `count` bytes staged after `offset` to the start.
    func keepTail(from offset: Int, count: Int) {
        if count > 0 { memory.copyMemory(from: memory + offset, byteCount: count) }
    }

    private var isOpen = true

    /// Closes the descriptor (the memory stays until this object goes).
    func close() {
        guard isOpen else { return }
        isOpen = false
        Glibc.close(descriptor)
    }
}
