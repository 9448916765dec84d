import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

/// A running node's events for local followers: a UNIX stream socket in the data directory
/// (``NodeHome/eventsSocketPath``) to which the node writes every event as it prints it, one JSON object
/// per line (``PeerEventRecord/jsonLine()``), to every follower connected at the time.
///
/// `thali-node events` follows it, and through it the conformance suite's adapter reads a node's events
/// (spec/conformance.md, "Adapter contract"). The node never waits for a follower: one that does not
/// read is dropped once ``Limits/maxPendingBytesPerFollower`` are queued for it, and followers beyond
/// ``Limits/maxFollowers`` are closed at once. What a follower sends is not read as anything but a
/// nudge: any bytes tell the node that its store changed (`thali-node send` in another process sends one
/// byte and closes), so that it reads the store at once rather than at its next outbox poll; the bytes
/// themselves are discarded. The socket is a file in the private data directory (mode 0600, the directory
/// 0700): only the node's user can follow or nudge it.
public final class NodeEventFeed: Sendable {
    /// The feed's bounds.
    public struct Limits: Sendable, Hashable {
        /// Followers connected at once; more are closed as they connect.
        public var maxFollowers = 8
        /// Bytes queued for one follower that does not read; past them it is dropped.
        public var maxPendingBytesPerFollower = 1 << 20

        /// The defaults: 8 followers, 1 MiB each.
        public init() {}
    }

    /// The socket's path.
    public let path: String
    private let server: Channel
    private let followers = NIOLockedValueBox<[ObjectIdentifier: Channel]>([:])
    private let dropped = NIOLockedValueBox(0)

    private init(path: String, server: Channel) {
        self.path = path
        self.server = server
    }

    /// The longest socket path (`sockaddr_un.sun_path` less its terminating NUL).
    public static let maxPathBytes = MemoryLayout.size(ofValue: sockaddr_un().sun_path) - 1

    /// Listens at `path`, replacing a socket a run that ended without cleaning up left there (the caller
    /// holds the data directory's ``RunLock``, so no other run uses it). `nudged` runs, on an event loop,
    /// once for each batch of bytes a follower sends (``ThaliPeer/storeChanged()`` is what a node passes).
    public static func start(at path: String, limits: Limits = Limits(),
                             nudged: @escaping @Sendable () -> Void = {}) async throws -> NodeEventFeed {
        try await start(at: path, limits: limits, group: MultiThreadedEventLoopGroup.singleton, nudged: nudged)
    }

    /// ``start(at:limits:nudged:)`` on `group`'s event loops.
    package static func start(at path: String, limits: Limits = Limits(), group: any EventLoopGroup,
                              nudged: @escaping @Sendable () -> Void = {}) async throws -> NodeEventFeed {
        guard path.utf8.count <= maxPathBytes else { throw NodeEventFeedError.pathTooLong(path: path, maximum: maxPathBytes) }
        let registry = FollowerRegistry(limits: limits, nudged: nudged)
        let server = try await ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 8)
            .childChannelInitializer { channel in
                registry.admit(channel)
            }
            .bind(unixDomainSocketPath: path, cleanupExistingSocketFile: true)
            .get()
        _ = chmod(path, NodeHome.fileMode)
        let feed = NodeEventFeed(path: path, server: server)
        registry.feed.withLockedValue { $0 = feed }
        return feed
    }

    /// Followers connected now.
    public var followerCount: Int { followers.withLockedValue { $0.count } }

    /// Followers dropped so far, for not reading or for coming beyond the limit.
    public var droppedFollowers: Int { dropped.withLockedValue { $0 } }

    /// Writes `line` (one JSON object and its newline) to every follower; drops those that fell behind.
    public func publish(_ line: Data) {
        let current = followers.withLockedValue { Array($0.values) }
        guard !current.isEmpty else { return }
        for channel in current {
            guard channel.isWritable else {
                // Its queue passed the high water mark: it stopped reading, and the node does not wait.
                if followers.withLockedValue({ $0.removeValue(forKey: ObjectIdentifier(channel)) }) != nil {
                    dropped.withLockedValue { $0 += 1 }
                    channel.close(promise: nil)
                }
                continue
            }
            channel.writeAndFlush(ByteBuffer(bytes: line), promise: nil)
        }
    }

    /// Stops listening, closes every follower (their `events` ends) and removes the socket file.
    public func close() async {
        try? await server.close().get()
        let current = followers.withLockedValue { Array($0.values) }
        for channel in current { try? await channel.close().get() }
        _ = unlink(path)
    }

    /// Adds `channel` unless `maximum` follow already: the check and the addition under one lock, so
    /// that followers connecting at once cannot pass the bound together.
    fileprivate func added(_ channel: Channel, maximum: Int) -> Bool {
        followers.withLockedValue { followers in
            guard followers.count < maximum else { return false }
            followers[ObjectIdentifier(channel)] = channel
            return true
        }
    }

    fileprivate func removed(_ channel: Channel) {
        _ = followers.withLockedValue { $0.removeValue(forKey: ObjectIdentifier(channel)) }
    }

    fileprivate func refused() { dropped.withLockedValue { $0 += 1 } }

    /// Admits followers until the feed exists and within the limit.
    private final class FollowerRegistry: Sendable {
        let limits: Limits
        let nudged: @Sendable () -> Void
        let feed = NIOLockedValueBox<NodeEventFeed?>(nil)

        init(limits: Limits, nudged: @escaping @Sendable () -> Void) {
            self.limits = limits
            self.nudged = nudged
        }

        func admit(_ channel: Channel) -> EventLoopFuture<Void> {
            guard let feed = feed.withLockedValue({ $0 }), feed.added(channel, maximum: limits.maxFollowers) else {
                self.feed.withLockedValue { $0?.refused() }
                return channel.close()
            }
            let high = max(1, limits.maxPendingBytesPerFollower)
            channel.closeFuture.whenComplete { [weak feed] _ in feed?.removed(channel) }
            let nudged = self.nudged
            return channel.setOption(.writeBufferWaterMark, value: .init(low: high / 2, high: high)).flatMapThrowing {
                try channel.pipeline.syncOperations.addHandler(NudgeReader(nudged: nudged))
            }
        }
    }

    /// What a follower sends is a nudge, not a message: the bytes are dropped, and each batch read that
    /// had bytes (one wake-up of the loop, however many) nudges once, so a follower that writes without
    /// pause costs the node one call per read, not per byte. Its end of input (which NIO also ends with a
    /// read-complete) closes the connection and nudges nothing.
    private final class NudgeReader: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        private let nudged: @Sendable () -> Void
        private var readBytes = false
        init(nudged: @escaping @Sendable () -> Void) { self.nudged = nudged }
        func channelRead(context: ChannelHandlerContext, data: NIOAny) { readBytes = true }
        func channelReadComplete(context: ChannelHandlerContext) {
            guard readBytes else { return }
            readBytes = false
            nudged()
        }
    }
}

/// Why a node's event feed could not start.
public enum NodeEventFeedError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The data directory's path is too long for a UNIX socket's address.
    case pathTooLong(path: String, maximum: Int)

    public var description: String {
        switch self {
        case .pathTooLong(let path, let maximum):
            "\(path) is \(path.utf8.count) bytes, longer than a UNIX socket's path may be (\(maximum)); use a shorter data directory to follow its events"
        }
    }
}
