import Foundation
import NIOConcurrencyHelpers
import NIOPosix
import Testing
import ThaliTestSupport
@testable import ThaliNodeCore

/// ``NodeEventFeed`` on a real UNIX socket, followed by plain sockets as `thali-node events` follows it.
@Suite("NodeEventFeed")
struct NodeEventFeedTests {
    /// A connected follower socket.
    final class Follower {
        let descriptor: Int32
        init(_ path: String) throws {
            descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
            var address = sockaddr_un()
            address.sun_family = sa_family_t(AF_UNIX)
            withUnsafeMutableBytes(of: &address.sun_path) { raw in
                for (index, byte) in path.utf8.enumerated() { raw[index] = byte }
            }
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
            }
            guard connected == 0 else { throw POSIXError(.ECONNREFUSED) }
            var timeout = timeval(tv_sec: 5, tv_usec: 0)
            setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        }
        deinit { close(descriptor) }

        /// Reads until `count` bytes came or the connection ended (or 5 s passed without a byte).
        func read(_ count: Int) -> [UInt8] {
            var collected = [UInt8]()
            var buffer = [UInt8](repeating: 0, count: 64 << 10)
            while collected.count < count {
                let got = buffer.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, min($0.count, count - collected.count)) }
                guard got > 0 else { break }
                collected += buffer.prefix(got)
            }
            return collected
        }

        /// Whether the feed closed this follower (reads end-of-file, or the connection was reset).
        func isClosedByFeed() -> Bool {
            var buffer = [UInt8](repeating: 0, count: 1 << 20)
            while true {
                let got = buffer.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, $0.count) }
                if got == 0 || (got < 0 && errno == ECONNRESET) { return true }
                if got < 0 { return false }  // timed out: still open
            }
        }
    }

    private func path(_ label: String) -> String {
        let directory = NSTemporaryDirectory() + "feed-\(label)-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        return directory + "/events.sock"
    }

    /// Removes the directory ``path(_:)`` made (the feed removes only its socket).
    private func removeDirectory(of socketPath: String) {
        try? FileManager.default.removeItem(atPath: (socketPath as NSString).deletingLastPathComponent)
    }

    private func waitFor(_ condition: () -> Bool) async throws {
        _ = try await waitUntil(timeout: .seconds(5), every: .milliseconds(25), condition)
    }

    /// Returns once every loop of the group the feeds run on has run what was queued to it before.
    private func eventLoopsDrained() async throws {
        for loop in MultiThreadedEventLoopGroup.singleton.makeIterator() { try await loop.submit {}.get() }
    }

    @Test("every follower gets every line published while it follows; a closed feed ends them and removes its socket")
    func linesReachEveryFollower() async throws {
        let socketPath = path("lines")
        defer { removeDirectory(of: socketPath) }
        let feed = try await NodeEventFeed.start(at: socketPath, group: MultiThreadedEventLoopGroup.singleton)
        let first = try Follower(socketPath), second = try Follower(socketPath)
        try await waitFor { feed.followerCount == 2 }
        #expect(feed.followerCount == 2)
        let mode = try #require(try FileManager.default.attributesOfItem(atPath: socketPath)[.posixPermissions] as? Int)
        #expect(mode == 0o600)
        let lines = (0..<100).map { Data("{\"event\":\"n\",\"i\":\($0)}\n".utf8) }
        for line in lines { feed.publish(line) }
        let expected = Array(lines.joined())
        #expect(first.read(expected.count) == expected)
        #expect(second.read(expected.count) == expected)
        await feed.close()
        #expect(first.isClosedByFeed() && second.isClosedByFeed())
        #expect(!FileManager.default.fileExists(atPath: socketPath))
    }

    @Test("bytes a follower sends nudge the node, once per batch read; a follower that only reads does not")
    func bytesFromAFollowerNudge() async throws {
        let socketPath = path("nudge")
        defer { removeDirectory(of: socketPath) }
        let nudges = NIOLockedValueBox(0)
        let feed = try await NodeEventFeed.start(at: socketPath, group: MultiThreadedEventLoopGroup.singleton,
                                                 nudged: { nudges.withLockedValue { $0 += 1 } })
        defer { Task { await feed.close() } }
        let reader = try Follower(socketPath)
        try await waitFor { feed.followerCount == 1 }
        let line = Data("{\"event\":\"n\"}\n".utf8)
        feed.publish(line)
        #expect(reader.read(line.count) == Array(line))
        try await eventLoopsDrained()
        #expect(nudges.withLockedValue { $0 } == 0, "reading is not a nudge")

        let sender = try Follower(socketPath)
        var byte: UInt8 = 0x0a
        #expect(write(sender.descriptor, &byte, 1) == 1)
        try await waitFor { nudges.withLockedValue { $0 } >= 1 }
        #expect(nudges.withLockedValue { $0 } >= 1)
        // The byte is dropped, not echoed or kept: the sender still gets the lines as a follower.
        feed.publish(line)
        #expect(sender.read(line.count) == Array(line))
    }

    @Test("a follower that stops reading is dropped once its queue passes the bound; the feed goes on for others")
    func slowFollowerIsDropped() async throws {
        let socketPath = path("slow")
        defer { removeDirectory(of: socketPath) }
        var limits = NodeEventFeed.Limits()
        limits.maxPendingBytesPerFollower = 64 << 10
        let feed = try await NodeEventFeed.start(at: socketPath, limits: limits, group: MultiThreadedEventLoopGroup.singleton)
        let stalled = try Follower(socketPath)
        try await waitFor { feed.followerCount == 1 }
        let line = Data((String(repeating: "x", count: 1023) + "\n").utf8)
        // Up to 16 MiB: far past what the kernel's socket buffers and the bound hold for a follower that reads nothing.
        var published = 0
        while feed.droppedFollowers == 0 && published < 16 << 10 {
            feed.publish(line)
            published += 1
            // Every 64 lines, until the loops have run what was queued to them: the writes, and with them the
            // follower's writability (the drop happens on the next publish to a follower not writable).
            if published % 64 == 0 { try await eventLoopsDrained() }
        }
        #expect(feed.droppedFollowers == 1, "after \(published) lines")
        #expect(feed.followerCount == 0)
        #expect(published < 16 << 10, "dropped well before 16 MiB: \(published) KiB")
        #expect(stalled.isClosedByFeed())
        // The node went on: a new follower gets what is published next.
        let reader = try Follower(socketPath)
        try await waitFor { feed.followerCount == 1 }
        feed.publish(line)
        #expect(reader.read(line.count) == Array(line))
        await feed.close()
    }

    @Test("followers beyond the limit are closed as they connect")
    func followersBeyondTheLimit() async throws {
        let socketPath = path("limit")
        defer { removeDirectory(of: socketPath) }
        var limits = NodeEventFeed.Limits()
        limits.maxFollowers = 1
        let feed = try await NodeEventFeed.start(at: socketPath, limits: limits, group: MultiThreadedEventLoopGroup.singleton)
        let admitted = try Follower(socketPath)
        try await waitFor { feed.followerCount == 1 }
        let refused = try Follower(socketPath)
        #expect(refused.isClosedByFeed())
        #expect(feed.followerCount == 1 && feed.droppedFollowers == 1)
        let line = Array("{\"event\":\"x\"}\n".utf8)
        feed.publish(Data(line))
        #expect(admitted.read(line.count) == line)
        await feed.close()
    }

    @Test("a path longer than a UNIX socket's is a typed error")
    func pathTooLong() async throws {
        let long = "/tmp/" + String(repeating: "d", count: 120) + "/events.sock"
        await #expect(throws: NodeEventFeedError.pathTooLong(path: long, maximum: NodeEventFeed.maxPathBytes)) {
            _ = try await NodeEventFeed.start(at: long, group: MultiThreadedEventLoopGroup.singleton)
        }
    }

    @Test("JSON lines escape what drives a terminal (DEL, C1, bidirectional overrides) and decode to the same text")
    func jsonLinesAreTerminalSafe() throws {
        let text = "a\u{7F}b\u{9B}31mc\u{202E}d\u{2066}e é"
        let id = UUID()
        let event = NodeEvent.delivery(contact: .sample("bob"), .received(NodeEvent.Item(id: id, kind: .text, size: 15, text: text)))
        let line = try event.jsonLine()
        let printed = String(decoding: line, as: UTF8.self)
        #expect(printed.unicodeScalars.allSatisfy { !(0x7F...0x9F).contains($0.value) && $0.value != 0x202E && $0.value != 0x2066 })
        #expect(printed.contains("\\u009B") && printed.contains("é"))
        #expect(try NodeEvent(jsonLine: line) == event)
    }
}
