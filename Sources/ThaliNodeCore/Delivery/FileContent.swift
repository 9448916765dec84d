import Crypto
import Foundation
import NIOCore
#if canImport(Glibc)
import Glibc
#endif

/// File operations of the delivery with hashing on the way; all reads are in bounded chunks.
enum FileContent {
    /// The read size for copying and hashing.
    static let blockBytes = 64 * 1024

    /// Copies `source` to `destination` (through a temporary name, so a half copy is never taken for a
    /// whole one) and returns the size and SHA-256; refuses files above `limit` bytes, counted as they are
    /// read. `source` is a regular file, or — when `acceptingPipe` (the caller named the delivered file) —
    /// a pipe this process inherited (``isInheritedDescriptor(_:)``). `progress` hears the bytes copied
    /// after each block, with the size when it is known (a regular file).
    static func copy(from source: String, to destination: String, limit: UInt64, acceptingPipe: Bool = false,
                     progress: ((_ copied: UInt64, _ total: UInt64?) -> Void)? = nil) throws -> (UInt64, [UInt8]) {
        // Checked before opening, on the target of links: opening a FIFO without a writer blocks forever.
        // An inherited pipe (`<(cmd)`, `/dev/stdin`) has its writer already, or is at its end; it is read
        // like a file, and the limit is enforced as it is read.
        var status = stat()
        guard stat(source, &status) == 0 else {
            throw NodeError.unreadableFile(path: source, reason: errno == ENOENT ? "no such file" : String(cString: strerror(errno)))
        }
        let type = status.st_mode & S_IFMT
        let inheritedPipe = type == S_IFIFO && isInheritedDescriptor(source)
        if inheritedPipe && !acceptingPipe {
            throw NodeError.unreadableFile(path: source, reason: "a pipe; give the name the contact receives it under with --name")
        }
        guard type == S_IFREG || inheritedPipe else {
            let kind = switch type {
            case S_IFDIR: "a directory"
            case S_IFIFO: "a named pipe (FIFO; opening it waits for a writer)"
            case S_IFSOCK: "a socket"
            case S_IFCHR, S_IFBLK: "a device"
            default: "not a regular file"
            }
            throw NodeError.unreadableFile(path: source, reason: "\(kind), not a regular file; save the content to a file first")
        }
        // A regular file's size is known before a byte is read: a file over the limit is refused at once,
        // with its true size (reading up to the limit first took seconds and named a wrong size).
        if type == S_IFREG && UInt64(status.st_size) > limit {
            throw NodeError.itemTooLarge(size: UInt64(status.st_size), limit: limit)
        }
        guard let input = FileHandle(forReadingAtPath: source) else {
            throw NodeError.unreadableFile(path: source, reason: "permission denied")
        }
        defer { try? input.close() }
        // What the file was when opened: a copy is kept only if it is still that file, unchanged, at the end.
        let before = FileIdentity(descriptor: input.fileDescriptor)
        let temporary = destination + copyingSuffix
        guard FileManager.default.createFile(atPath: temporary, contents: nil,
                                             attributes: [.posixPermissions: NodeHome.fileMode]),
              let output = FileHandle(forWritingAtPath: temporary) else {
            throw NodeError.dataDirectoryUnusable(path: temporary, reason: "cannot create file")
        }
        // Held while the copy runs: ``removeInterruptedCopies(in:)`` removes only copies nobody holds.
        _ = flock(output.fileDescriptor, LOCK_EX)
        var hasher = SHA256()
        var size: UInt64 = 0
        do {
            defer { try? output.close() }
            // A failed write (a full disk) is the data directory's problem, not the source file's.
            func writing(_ body: () throws -> Void) throws {
                do { try body() } catch {
                    throw NodeError.dataDirectoryUnusable(path: destination, reason: SystemErrorText.describe(error))
                }
            }
            while let block = try input.read(upToCount: blockBytes), !block.isEmpty {
                size += UInt64(block.count)
                guard size <= limit else { throw NodeError.itemTooLarge(size: size, limit: limit) }
                hasher.update(data: block)
                try writing { try output.write(contentsOf: block) }
                progress?(size, type == S_IFREG ? UInt64(status.st_size) : nil)
            }
            // A file rewritten, truncated or appended to while it was read would be queued as content that
            // never existed (old data, zeros, new data): refused, as tar's "file changed as we read it".
            if let before, let change = before.change(to: FileIdentity(descriptor: input.fileDescriptor), bytesRead: size) {
                throw NodeError.fileChangedWhileRead(path: source, what: change)
            }
            try writing { try output.synchronize() }
        } catch {
            try? FileManager.default.removeItem(atPath: temporary)
            if error is NodeError { throw error }
            throw NodeError.unreadableFile(path: source, reason: SystemErrorText.describe(error))
        }
        if FileManager.default.fileExists(atPath: destination) { try FileManager.default.removeItem(atPath: destination) }
        try FileManager.default.moveItem(atPath: temporary, toPath: destination)
        try syncDirectory(containing: destination)
        return (size, Array(hasher.finalize()))
    }

    /// The suffix of a copy into the outbox while it is being made.
    static let copyingSuffix = ".copying"

    /// Removes the copies into `directory` that an interrupted `send --file` left (`<id>.copying`, which
    /// nothing holds: a copy running now holds its lock and is left alone); returns their names and sizes.
    static func removeInterruptedCopies(in directory: String) -> [(name: String, bytes: UInt64)] {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return [] }
        var removed: [(name: String, bytes: UInt64)] = []
        for name in names.sorted() where name.hasSuffix(copyingSuffix) {
            let path = directory + "/" + name
            let descriptor = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
            guard descriptor >= 0 else { continue }
            defer { close(descriptor) }
            guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else { continue }
            let bytes = size(of: path) ?? 0
            if unlink(path) == 0 { removed.append((name, bytes)) }
        }
        return removed
    }

    /// Makes the entries of the directory holding `path` durable (`fsync` on the directory). A file's
    /// own `fsync` does not cover its name: after a rename into place, a power loss can take the new name
    /// back while a row committed later points at it. Throws ``NodeError/dataDirectoryUnusable(path:reason:)``.
    static func syncDirectory(containing path: String) throws {
        try syncDirectory(URL(fileURLWithPath: path).deletingLastPathComponent().path)
    }

    /// `fsync` on the directory `directory` itself, so the names created, renamed or removed in it are on disk.
    static func syncDirectory(_ directory: String) throws {
        let descriptor = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard descriptor >= 0 else {
            throw NodeError.dataDirectoryUnusable(path: directory, reason: String(cString: strerror(errno)))
        }
        defer { close(descriptor) }
        guard fsync(descriptor) == 0 else {
            throw NodeError.dataDirectoryUnusable(path: directory, reason: String(cString: strerror(errno)))
        }
    }

    /// Whether `path` names a descriptor of this process (`/dev/stdin`, `/dev/fd/N`, `/proc/self/fd/N`)
    /// rather than a file of the file system: a pipe there was inherited with its writer.
    static func isInheritedDescriptor(_ path: String) -> Bool {
        path == "/dev/stdin" || path.hasPrefix("/dev/fd/") || path.hasPrefix("/proc/self/fd/")
    }

    /// The SHA-256 state after the first `length` bytes of `path` (fewer if the file is shorter), and how
    /// many bytes were hashed.
    static func hashPrefix(of path: String, length: UInt64) throws -> (SHA256, UInt64) {
        var hasher = SHA256()
        guard let handle = FileHandle(forReadingAtPath: path) else { return (hasher, 0) }
        defer { try? handle.close() }
        var remaining = length
        var hashed: UInt64 = 0
        while remaining > 0, let block = try handle.read(upToCount: Int(min(UInt64(blockBytes), remaining))), !block.isEmpty {
            hasher.update(data: block)
            remaining -= UInt64(block.count)
            hashed += UInt64(block.count)
        }
        return (hasher, hashed)
    }

    /// Writes all of `bytes` to `descriptor` at `offset` (`pwrite`: the descriptor's position is neither
    /// used nor moved), retrying short writes and interruptions.
    static func writeAll(_ bytes: UnsafeRawBufferPointer, to descriptor: Int32, at offset: UInt64) throws {
        var done = 0
        while done < bytes.count {
            let count = Glibc.pwrite(descriptor, bytes.baseAddress.map { $0 + done }, bytes.count - done, off_t(offset) + off_t(done))
            if count < 0 {
                if errno == EINTR { continue }
                throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)
            }
            done += count
        }
    }

    /// Reads exactly `count` bytes at `offset` of `descriptor` (`pread`: the descriptor's position is
    /// neither used nor moved, so reads may run at once) into `buffer`, cleared first (no copy through
    /// `Data`): a buffer held by nothing else keeps its memory (``BufferHandoff``), so a stream of blocks
    /// does not allocate, and fault in, fresh pages for each. False if the file ends first.
    static func read(_ count: Int, at offset: UInt64, from descriptor: Int32, into buffer: inout ByteBuffer) throws -> Bool {
        buffer.clear(minimumCapacity: count)
        while buffer.readableBytes < count {
            let wanted = count - buffer.readableBytes
            let position = off_t(offset) + off_t(buffer.readableBytes)
            let got = try buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: wanted) { target -> Int in
                while true {
                    let result = Glibc.pread(descriptor, target.baseAddress, wanted, position)
                    if result < 0 && errno == EINTR { continue }
                    if result < 0 { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
                    return result
                }
            }
            if got == 0 { return false }
        }
        return true
    }

    /// Asks the kernel to start writing `length` bytes at `offset` of `descriptor` to the disk now,
    /// without waiting for the disk to finish (Linux `sync_file_range` with `SYNC_FILE_RANGE_WRITE`): a
    /// receiver calls it every ``DeliveryLimits/writebackBytes``, so the disk works while the rest arrives
    /// and the one `fsync` at the end finds little left to write. It may block while the device's queue is
    /// full, so a caller runs it where nothing else waits for it. Not a durability step (that stays the
    /// `fsync`); a no-op where unavailable.
    static func startWriteback(of descriptor: Int32, offset: UInt64, length: Int) {
        guard let address = syncFileRangeAddress, let function = UnsafeRawPointer(bitPattern: address) else { return }
        let syncFileRange = unsafeBitCast(function, to: SyncFileRange.self)
        _ = syncFileRange(descriptor, Int64(offset), Int64(length), startWritebackFlag)
    }

    /// `sync_file_range(fd, offset, nbytes, flags)`, looked up at run time: Glibc's module does not
    /// import it.
    private typealias SyncFileRange = @convention(c) (Int32, Int64, Int64, UInt32) -> Int32
    private static let syncFileRangeAddress: Int? = dlsym(nil, "sync_file_range").map { Int(bitPattern: $0) }
    /// `SYNC_FILE_RANGE_WRITE`: start writeback of the dirty pages in the range, do not wait.
    private static let startWritebackFlag: UInt32 = 2

    /// The size of the file at `path`, or nil if there is none.
    static func size(of path: String) -> UInt64? {
        guard let attributes = try? FileManager.default.attributesOfItem(atPath: path),
              let size = attributes[.size] as? NSNumber else { return nil }
        return size.uint64Value
    }
}

/// What says whether an open file's content changed without reading it again: `fstat`'s size, and its
/// modification and change times (nanoseconds; any write or truncation moves the change time). Taken on
/// the open descriptor, so a file renamed over the path meanwhile does not count: the copy read the old one.
struct FileIdentity {
    let size: Int64
    let modified: timespec
    let changed: timespec

    /// The identity of the open file `descriptor`; nil if `fstat` fails, or for a pipe (its size and times
    /// say nothing of its content).
    init?(descriptor: Int32) {
        var status = stat()
        guard fstat(descriptor, &status) == 0, status.st_mode & S_IFMT == S_IFREG else { return nil }
        (size, modified, changed) = (Int64(status.st_size), status.st_mtim, status.st_ctim)
    }

    /// How the file changed from `self` to `later`, after `bytesRead` bytes were read from it; nil if not.
    func change(to later: FileIdentity?, bytesRead: UInt64) -> String? {
        guard let later else { return "it can no longer be examined" }
        if later.size != size { return "its size went from \(size) to \(later.size) bytes" }
        if bytesRead != UInt64(size) { return "\(bytesRead) bytes could be read of \(size)" }
        func same(_ a: timespec, _ b: timespec) -> Bool { a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec }
        if !same(later.modified, modified) || !same(later.changed, changed) { return "it was written to" }
        return nil
    }
}
