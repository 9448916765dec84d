import ArgumentParser
import Foundation
import ThaliNodeCore

/// `thali-node events`: follows the events of the `run` using the data directory.
struct Events: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Follow the events of the node running on the data directory, as JSON lines.",
        discussion: """
            Prints every event the running `thali-node run` reports from now on, one JSON object per line \
            (the records `run --json` prints, with the same keys), until that run stops (exit 0) or this \
            command is interrupted. It reads them from the run's events.sock in the data directory; a \
            follower that stops reading is dropped by the node, which never waits for it. The conformance \
            suite's adapter contract uses it as its `events` verb (spec/conformance.md).
            """)

    @OptionGroup var options: NodeOptions
    @Flag(help: "Accepted for symmetry with the other commands: the output is always JSON lines.")
    var json = false

    /// The longest line accepted from the feed (the node's largest record is a `status` with its lists).
    static let maxLineBytes = 1 << 20

    func run() throws {
        let home = try options.checkedHome(writing: false)
        guard RunLock.holder(of: home) != nil else {
            throw CommandFailure(exitCode: .unavailable, message: "no node is running on \(home.path): start `thali-node run` there first")
        }
        let descriptor = try Self.connect(to: home.eventsSocketPath)
        defer { close(descriptor) }
        var pending = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 64 << 10)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { break }  // the run stopped (or the feed dropped us)
            pending.append(contentsOf: buffer.prefix(count))
            var start = 0
            while let newline = pending[start...].firstIndex(of: UInt8(ascii: "\n")) {
                // Ends when its reader does (`events | head -1`), as `run` does.
                guard StandardStream.output.write(Data(pending[start...newline])) else { return }
                start = newline + 1
            }
            pending.removeFirst(start)
            if pending.count > Self.maxLineBytes {
                throw ValidationError("the node sent a line longer than \(Self.maxLineBytes) bytes")
            }
        }
        guard pending.isEmpty else { throw ValidationError("the node's events ended in the middle of a line") }
    }

    /// Tells the node running on `home`, if any, that its store changed (a `send` just committed an item),
    /// so that it reads the store now rather than at its next outbox poll: one byte on its events socket
    /// (``NodeEventFeed``). Best effort and quiet: with no node running, a stale socket or a full feed, the
    /// node's own poll finds the change within `outboxPollInterval`. A node from before nudges discards
    /// the byte. No SIGPIPE: the node may close a follower it has no room for.
    static func nudgeRunningNode(on home: NodeHome) {
        guard RunLock.holder(of: home) != nil, let descriptor = try? connect(to: home.eventsSocketPath) else { return }
        defer { close(descriptor) }
        var byte: UInt8 = 0x0a
        _ = send(descriptor, &byte, 1, Int32(MSG_NOSIGNAL))
    }

    /// A connected UNIX stream socket to `path`, or an error in words.
    static func connect(to path: String) throws -> Int32 {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count <= NodeEventFeed.maxPathBytes else {
            throw ValidationError(NodeEventFeedError.pathTooLong(path: path, maximum: NodeEventFeed.maxPathBytes).description)
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (index, byte) in bytes.enumerated() { raw[index] = byte }
        }
        let descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { throw ValidationError("cannot open a socket: \(String(cString: strerror(errno)))") }
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard connected == 0 else {
            let reason = String(cString: strerror(errno))
            close(descriptor)
            throw ValidationError("cannot follow the running node's events at \(path): \(reason) (a run from before `events` existed serves none: restart it)")
        }
        return descriptor
    }
}
