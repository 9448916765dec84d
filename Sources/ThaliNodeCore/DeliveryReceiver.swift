import Crypto
import Foundation
import Logging
import NIOCore
import NIOPosix

/// Receives items from one contact over one delivery stream: the session driver of
/// ``DeliveryReceiverStateMachine``, doing the store and file I/O it asks for.
///
/// Content goes to a partial file under `partial/` (kept across sessions for resuming), is made durable
/// and verified (size and SHA-256), then committed to the inbox in one transaction; only then is the
/// item acknowledged. An item the inbox already holds is acknowledged without a transfer.
public struct DeliveryReceiver: Sendable {
    /// What one session achieved.
    public struct Summary: Sendable, Hashable {
        /// Items committed to the inbox in this session.
        public var received: [InboxItem] = []
        /// Items offered again that the inbox already held.
        public var duplicates: [UUID] = []
        /// Items refused before any transfer.
        public var refused: [UUID] = []
        /// Items whose content failed verification and was discarded.
        public var discarded: [UUID] = []
        /// Content bytes received.
        public var bytesReceived: UInt64 = 0
    }

    /// The store whose inbox receives.
    public let store: NodeStore
    /// The authenticated peer: the contact the items come from.
    public let peer: Contact
    /// Bounds for frames and offers.
    public let limits: DeliveryLimits
    private let now: @Sendable () -> Date
    private let events: DeliveryEventHandler?
    private let logger: Logger
    private let blockingPool: NIOThreadPool

    /// Creates a receiver into `store`'s inbox from `authenticatedPeer`, the contact whose identity the
    /// transport below proved (never a name taken from the stream itself). Database and file work runs on
    /// `blockingPool`, never on the event loop or the concurrency pool.
    public init(store: NodeStore, authenticatedPeer: Contact, limits: DeliveryLimits? = nil,
                now: @escaping @Sendable () -> Date = { Date() }, events: DeliveryEventHandler? = nil,
                logger: Logger = Logger(label: "thali.delivery.receiver"), blockingPool: NIOThreadPool = .singleton) {
        self.blockingPool = blockingPool
        self.store = store
        self.peer = authenticatedPeer
        self.limits = limits ?? store.limits
        self.now = now
        self.events = events
        var logger = logger
        logger[metadataKey: "peer"] = "\(authenticatedPeer.name)"
        self.logger = logger
    }

    /// Runs one session on `channel` (configured by ``DeliveryChannel``) until the sender says `done`, then
    /// closes it. Throws on a protocol violation, a lost connection or a timeout; what was committed stays.
    ///
    /// One session per direction and contact runs at a time: a second one throws
    /// ``NodeError/sessionInProgress(contact:role:)`` and closes its channel.
    public func run(on channel: DeliveryChannel.AsyncFrames) async throws -> Summary {
        try await store.withSessionClaim(
            NodeStore.SessionRole.receiving, with: peer, onRefusal: { try? await channel.channel.close() }
        ) {
            try await runClaimed(on: channel)
        }
    }

    /// The session itself, once ``run(on:)`` holds the claim.
    private func runClaimed(on channel: DeliveryChannel.AsyncFrames) async throws -> Summary {
        let clock = now, store = self.store, peer = self.peer
        let cutoff = now().addingTimeInterval(-Double(limits.partialRetention.nanoseconds) / 1e9)
        let stale = try await blocking { store.sweepStalePartials(from: peer, before: cutoff) }
        if stale > 0 { logger.info("deleted abandoned partial files", metadata: ["count": "\(stale)"]) }
        return try await channel.executeThenClose { inbound, outbound in
            var machine = DeliveryReceiverStateMachine(limits: limits, now: { UInt64(max(0, clock().milliseconds)) })
            do {
                return try await session(inbound, outbound, &machine)
            } catch let error as DeliveryProtocolError {
                // A version 2 sender hears why the session ends: a frame over our maximum, a name too
                // long, a frame out of place. It would otherwise see only the stream end.
                if machine.senderHearsErrors, let report = DeliveryFrame.error(reporting: error) {
                    try? await outbound.write(report)
                }
                throw error.naming(peer: peer.name)
            }
        }
    }

    /// The frames of one session, after the claim and the sweep.
    private func session(_ inbound: NIOAsyncChannelInboundStream<DeliveryFrame>,
                         _ outbound: NIOAsyncChannelOutboundWriter<DeliveryFrame>,
                         _ machine: inout DeliveryReceiverStateMachine) async throws -> Summary {
        let store = self.store, peer = self.peer, now = self.now
        var summary = Summary()
        var partial: PartialFile?
        var found: FoundPartial?
        defer { partial?.close() }
        for try await frame in inbound {
            var action = try machine.receive(frame)
            while true {
                switch action {
                case .none:
                    break
                case .send(let reply):
                    if case .answer(let id, .refused) = reply { summary.refused.append(id) }
                    try await outbound.write(reply)
                case .lookUp(let offer):
                    let (result, state) = try await blocking { try lookUp(offer) }
                    found = state
                    if result == .complete {
                        summary.duplicates.append(offer.id)
                        events?(.duplicate(id: offer.id))
                    }
                    action = try machine.lookUpCompleted(result)
                    continue
                case .preparePartial(let offer, let offset):
                    let resumed = found.flatMap { $0.length == offset && offset > 0 ? HashState(value: $0.hasher) : nil }
                    let path = store.partialPath(for: offer.id, from: peer)
                    partial = try await blocking { try PartialFile(path: path, keeping: offset, hasher: resumed?.value) }
                    found = nil
                    if offset > 0 { logger.info("resuming", metadata: ["item": "\(offer.id)", "offset": "\(offset)"]) }
                    events?(.transferStarted(id: offer.id, offset: offset, total: offer.size))
                case .append(let bytes):
                    if let file = partial { try await blocking { try file.append(bytes) } }
                    summary.bytesReceived += UInt64(bytes.readableBytes)
                    if case .receiving(let offer, let received) = machine.state {
                        events?(.progress(id: offer.id, bytes: received, total: offer.size))
                    }
                case .verify:
                    let file = partial
                    let digest = try await blocking { try file?.finish() ?? [] }
                    partial = nil
                    action = try machine.contentVerified(digest: digest)
                    continue
                case .commit(let offer):
                    let received = now()
                    switch try await blocking({ try store.commitReceived(offer, from: peer, now: received) }) {
                    case .stored(let item):
                        summary.received.append(item)
                        logger.info("received", metadata: ["item": "\(offer.id)", "kind": "\(offer.kind.rawValue)"])
                        events?(.received(item))
                    case .alreadyStored:
                        summary.duplicates.append(offer.id)
                        events?(.duplicate(id: offer.id))
                    case .invalidText:
                        action = try machine.commitRefusedInvalidText()
                        continue
                    }
                    action = try machine.committed()
                    continue
                case .discardPartial(let offer, let reply):
                    let path = store.partialPath(for: offer.id, from: peer)
                    _ = try? await blocking { try FileManager.default.removeItem(atPath: path) }
                    if case .reject(_, let failure) = reply {
                        summary.discarded.append(offer.id)
                        logger.warning("discarded damaged content", metadata: ["item": "\(offer.id)", "reason": "\(failure)"])
                        events?(.discarded(id: offer.id, failure))
                    }
                    try await outbound.write(reply)
                case .finish:
                    return summary
                }
                break
            }
        }
        try machine.streamEnded()
        return summary
    }

    /// Runs blocking database or file work on the blocking pool.
    private func blocking<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await blockingPool.runIfActive(body)
    }

    /// What is stored of `offer`: in the inbox, a usable partial file (with its hash state), or nothing.
    private func lookUp(_ offer: ItemOffer) throws -> (DeliveryReceiverStateMachine.LookUpResult, FoundPartial?) {
        if try store.inboxContains(offer.id, from: peer) { return (.complete, nil) }
        let path = store.partialPath(for: offer.id, from: peer)
        guard let length = FileContent.size(of: path), length > 0 else { return (.nothing, nil) }
        guard length <= offer.size else {
            try? FileManager.default.removeItem(atPath: path)
            return (.nothing, nil)
        }
        let (hasher, hashed) = try FileContent.hashPrefix(of: path, length: length)
        guard hashed == length else { return (.nothing, nil) }
        return (.partial(length: length, prefixSHA256: Array(hasher.finalize())), FoundPartial(hasher: hasher, length: length))
    }
}

/// A partial file found at look-up: its length and the hash state after it, kept so a resume does not
/// hash the prefix twice.
private struct FoundPartial: @unchecked Sendable {
    // SHA256 is a plain value (no shared state); it only lacks a Sendable annotation.
    var hasher: SHA256
    var length: UInt64
}

/// A hash state carried into the blocking pool.
private struct HashState: @unchecked Sendable {
    var value: SHA256
}

/// A file being received: truncated to the agreed offset, appended to, hashed as it grows. Used by one
/// session at a time (each call awaited before the next), hence unchecked.
private final class PartialFile: @unchecked Sendable {
    private let handle: FileHandle
    private let path: String
    private var hasher: SHA256
    private var closed = false

    /// Opens (creating) `path`, keeps its first `offset` bytes, and continues `hasher` (the state after those
    /// bytes) or rehashes them.
    init(path: String, keeping offset: UInt64, hasher: SHA256?) throws {
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
        try handle.truncate(atOffset: offset)
        try handle.seekToEnd()
        if let hasher {
            self.hasher = hasher
        } else {
            self.hasher = try FileContent.hashPrefix(of: path, length: offset).0
        }
    }

    func append(_ bytes: ByteBuffer) throws {
        try bytes.withUnsafeReadableBytes { raw in
            let data = Data(raw)
            try inWords { try handle.write(contentsOf: data) }
            hasher.update(data: data)
        }
    }

    /// Makes the content durable and returns its SHA-256.
    func finish() throws -> [UInt8] {
        try inWords { try handle.synchronize() }
        close()
        return Array(hasher.finalize())
    }

    /// Runs a write; its failure (a full disk) becomes a ``NodeError`` in words, as events print it.
    private func inWords(_ body: () throws -> Void) throws {
        do { try body() } catch {
            throw NodeError.dataDirectoryUnusable(path: path, reason: SystemErrorText.describe(error))
        }
    }

    func close() {
        guard !closed else { return }
        closed = true
        try? handle.close()
    }
}
