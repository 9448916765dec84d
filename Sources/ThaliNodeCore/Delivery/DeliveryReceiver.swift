import Crypto
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
#if canImport(Glibc)
import Glibc
#endif

/// Receives items from one contact over one delivery stream: the session driver of
/// ``DeliveryReceiverStateMachine``, doing the store and file I/O it asks for.
///
/// Content goes to a partial file under `partial/` (kept across sessions for resuming): hashed as it
/// arrives, written in blocks on the blocking pool while the next frames arrive (a version 3 sender hears
/// `progress` after each block; the disk starts writing every `writebackBytes`), made durable once at the end and
/// verified (size and SHA-256), then committed to the inbox
/// in one durable transaction; only then is the item acknowledged. Texts that come whole in a batch of
/// `item` frames are committed together, in one transaction, before any of them is acknowledged. An
/// item the inbox already holds is acknowledged without a transfer.
package struct DeliveryReceiver: Sendable {
    /// What one session achieved.
    package struct Summary: Sendable, Hashable {
        /// Items committed to the inbox in this session.
        package var received: [InboxItem] = []
        /// Items offered again that the inbox already held.
        package var duplicates: [UUID] = []
        /// Items refused before any transfer.
        package var refused: [UUID] = []
        /// Items whose content failed verification and was discarded.
        package var discarded: [UUID] = []
        /// Content bytes received.
        package var bytesReceived: UInt64 = 0
    }

    /// The store whose inbox receives.
    package let store: NodeStore
    /// The authenticated peer: the contact the items come from.
    package let peer: Contact
    /// Bounds for frames and offers.
    package let limits: DeliveryLimits
    private let now: @Sendable () -> Date
    private let events: DeliveryEventHandler?
    private let logger: Logger
    private let blockingPool: NIOThreadPool

    /// Creates a receiver into `store`'s inbox from `authenticatedPeer`, the contact whose identity the
    /// transport below proved (never a name taken from the stream itself). Database and file work runs on
    /// `blockingPool`, never on the event loop or the concurrency pool.
    package init(store: NodeStore, authenticatedPeer: Contact, limits: DeliveryLimits? = nil,
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
    package func run(on channel: DeliveryChannel.AsyncFrames) async throws -> Summary {
        try await store.withSessionClaim(
            NodeStore.SessionRole.receiving, with: peer, onRefusal: { try? await channel.channel.close() }
        ) {
            try await runClaimed(on: channel)
        }
    }

    /// The session itself, once ``run(on:)`` holds the claim.
    private func runClaimed(on channel: DeliveryChannel.AsyncFrames) async throws -> Summary {
        let clock = now, store = self.store, peer = self.peer
        let cutoff = now().addingTimeInterval(-limits.partialRetention.timeInterval)
        let stale = try await blocking { store.sweepStalePartials(from: peer, before: cutoff) }
        if stale > 0 { logger.info("deleted abandoned partial files", metadata: ["count": "\(stale)"]) }
        let eventLoop = channel.channel.eventLoop
        return try await channel.executeThenClose { inbound, outbound in
            var machine = DeliveryReceiverStateMachine(limits: limits, now: { UInt64(max(0, clock().milliseconds)) })
            do {
                return try await session(inbound, outbound, &machine, eventLoop)
            } catch let error as DeliveryProtocolError {
                // A version 2 sender hears why the session ends: a frame over our maximum, a name too
                // long, a frame out of place. It would otherwise see only the stream end.
                if machine.senderHearsErrors, let report = DeliveryFrame.error(reporting: error) {
                    await DeliveryChannel.sendLast(report, on: channel.channel)
                }
                throw error.naming(peer: peer.name)
            } catch let error as NodeError {
                // Our own failure (a write to a full disk): the sender hears it in words and keeps the
                // item pending; the partial file stays for a resume.
                if machine.senderHearsErrors, let report = DeliveryFrame.error(reporting: error) {
                    await DeliveryChannel.sendLast(report, on: channel.channel)
                }
                throw error
            }
        }
    }

    /// The frames of one session, after the claim and the sweep.
    private func session(_ inbound: NIOAsyncChannelInboundStream<DeliveryFrame>,
                         _ outbound: NIOAsyncChannelOutboundWriter<DeliveryFrame>,
                         _ machine: inout DeliveryReceiverStateMachine, _ eventLoop: any EventLoop) async throws -> Summary {
        var summary = Summary()
        var writer: BlockWriter?
        do {
            summary = try await frames(inbound, outbound, &machine, &writer, eventLoop)
        } catch {
            // What arrived is kept for a resume: the block in flight finishes and the one filling is
            // written (not made durable; a resume checks the prefix's digest) before the file closes.
            await writer?.drain()
            writer?.file.close()
            throw error
        }
        return summary
    }

    private func frames(_ inbound: NIOAsyncChannelInboundStream<DeliveryFrame>,
                        _ outbound: NIOAsyncChannelOutboundWriter<DeliveryFrame>,
                        _ machine: inout DeliveryReceiverStateMachine, _ writer: inout BlockWriter?,
                        _ eventLoop: any EventLoop) async throws -> Summary {
        let store = self.store, peer = self.peer, now = self.now
        var summary = Summary()
        var found: FoundPartial?
        var batch: [DeliveryReceiverStateMachine.BatchEntry] = []
        /// Tells the sender (version 3) and the events how much of the item is written.
        func report(_ written: [UInt64]) async throws {
            guard let offer = machine.transferring else { return }
            for bytes in written {
                if let frame = machine.progress(written: bytes) { try await outbound.write(frame) }
                events?(.progress(id: offer.id, bytes: bytes, total: offer.size))
            }
        }
        var offered: ItemOffer?
        var space: FreeSpace?
        for try await frame in inbound {
            if case .offer(let offer) = frame { (offered, space) = (offer, nil) }
            var action = try machine.receive(frame)
            while true {
                switch action {
                case .none:
                    break
                case .send(let reply):
                    if case .answer(let id, .refused(let reason)) = reply {
                        summary.refused.append(id)
                        if let offer = offered, offer.id == id { refused(offer, reason, space: space) }
                    }
                    try await outbound.write(reply)
                case .lookUp(let offer):
                    let (result, state, free) = try await blocking { try lookUp(offer) }
                    (found, space) = (state, free)
                    if result == .complete {
                        summary.duplicates.append(offer.id)
                        events?(.duplicate(id: offer.id))
                    }
                    // An older sender has no temporary refusal: its session ends, and this node says why.
                    if case .noSpace = result, !machine.senderHearsTemporaryRefusals { refused(offer, .noSpace, space: free) }
                    action = try machine.lookUpCompleted(result)
                    continue
                case .preparePartial(let offer, let offset):
                    let resumed = found.flatMap { $0.length == offset && offset > 0 ? HashState(value: $0.hasher) : nil }
                    let path = store.partialPath(for: offer.id, from: peer)
                    let (file, hashed) = try await blocking { () -> (PartialFile, HashState) in
                        let file = try PartialFile(path: path, keeping: offset,
                                                   directWriteBytes: limits.directWrites ? limits.blockBytes + limits.maxFramePayloadBytes : 0)
                        return (file, try resumed ?? HashState(value: FileContent.hashPrefix(of: path, length: offset).0))
                    }
                    writer = BlockWriter(file: file, hasher: hashed.value, written: offset, limits: limits,
                                         pool: blockingPool, eventLoop: eventLoop)
                    found = nil
                    if offset > 0 { logger.info("resuming", metadata: ["item": "\(offer.id)", "offset": "\(offset)"]) }
                    events?(.transferStarted(id: offer.id, offset: offset, total: offer.size))
                case .append(let bytes):
                    summary.bytesReceived += UInt64(bytes.readableBytes)
                    try await report(try await writer?.append(bytes) ?? [])
                case .verify:
                    try await report(try await writer?.flush() ?? [])
                    let (file, digest) = (writer?.file, writer?.digest() ?? [])
                    writer = nil
                    try await blocking { try file?.finish() }
                    action = try machine.contentVerified(digest: digest)
                    continue
                case .commit(let offer):
                    let received = now()
                    switch try await blocking({ try store.commitReceived(offer, from: peer, now: received) }) {
                    case .stored(let item):
                        summary.received.append(item)
                        logger.debug("received", metadata: ["item": "\(offer.id)", "kind": "\(offer.kind.rawValue)"])
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
                case .batch(let entry, let commit):
                    batch.append(entry)
                    if commit {
                        try await commitBatch(batch, outbound, &summary)
                        batch = []
                    }
                case .finish:
                    return summary
                }
                break
            }
        }
        try machine.streamEnded()
        return summary
    }

    /// Verifies the texts of a batch, commits the intact ones in one durable transaction, then answers
    /// every entry in order: each `ack` follows the commit of its text.
    private func commitBatch(_ entries: [DeliveryReceiverStateMachine.BatchEntry],
                             _ outbound: NIOAsyncChannelOutboundWriter<DeliveryFrame>, _ summary: inout Summary) async throws {
        let store = self.store, peer = self.peer, received = now()
        let outcomes = try await blocking { () -> [BatchOutcome] in
            var outcomes: [BatchOutcome] = []
            var texts: [(offer: ItemOffer, text: String)] = []
            for entry in entries {
                switch entry {
                case .refused(let offer, let reason):
                    outcomes.append(.refused(offer, reason))
                case .text(let offer, let content):
                    let digest = content.withUnsafeReadableBytes { Array(SHA256.hash(data: $0)) }
                    if digest != offer.sha256 {
                        outcomes.append(.discarded(offer, .digestMismatch))
                    } else if let text = String(validating: content.readableBytesView, as: UTF8.self) {
                        outcomes.append(.pending(offer))
                        texts.append((offer, text))
                    } else {
                        outcomes.append(.discarded(offer, .invalidText))
                    }
                }
            }
            var results = try store.commitReceivedTexts(texts, from: peer, now: received)[...]
            return outcomes.map { outcome in
                guard case .pending(let offer) = outcome, let result = results.popFirst() else { return outcome }
                if case .stored(let item) = result { return .stored(item) }
                return .duplicate(offer)
            }
        }
        var replies: [DeliveryFrame] = []
        for outcome in outcomes {
            switch outcome {
            case .stored(let item):
                summary.received.append(item)
                events?(.received(item))
                replies.append(.ack(id: item.itemID))
            case .duplicate(let offer):
                summary.duplicates.append(offer.id)
                events?(.duplicate(id: offer.id))
                replies.append(.answer(id: offer.id, .complete))
            case .refused(let offer, let reason):
                summary.refused.append(offer.id)
                refused(offer, reason, space: nil)
                replies.append(.answer(id: offer.id, .refused(reason)))
            case .discarded(let offer, let failure):
                summary.discarded.append(offer.id)
                logger.warning("discarded damaged content", metadata: ["item": "\(offer.id)", "reason": "\(failure)"])
                events?(.discarded(id: offer.id, failure))
                replies.append(.reject(id: offer.id, failure))
            case .pending(let offer):
                throw NodeError.storeUnavailable(path: store.home.databasePath, reason: "no commit result for item \(offer.id)")
            }
        }
        logger.debug("received a batch", metadata: ["items": "\(entries.count)"])
        try await outbound.write(contentsOf: replies)
    }

    /// Runs blocking database or file work on the blocking pool.
    private func blocking<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await blockingPool.runIfActive(body)
    }

    /// What is stored of `offer`: in the inbox, a usable partial file (with its hash state), or nothing;
    /// for a file not yet in the inbox, whether the partial files' file system can hold what is still to
    /// come plus ``DeliveryLimits/minimumFreeBytes`` (else `noSpace`, with the figures).
    private func lookUp(_ offer: ItemOffer) throws -> (DeliveryReceiverStateMachine.LookUpResult, FoundPartial?, FreeSpace?) {
        if try store.inboxContains(offer.id, from: peer) { return (.complete, nil, nil) }
        let (result, partial) = try lookUpPartial(offer)
        guard offer.kind == .file else { return (result, partial, nil) }
        let directory = store.home.partialDirectory
        guard let free = FreeSpace.available(at: directory) else { return (result, partial, nil) }
        let held: UInt64 = if case .partial(let length, _) = result { length } else { 0 }
        let toCome = offer.size - min(held, offer.size)
        let (needed, overflow) = toCome.addingReportingOverflow(limits.minimumFreeBytes)
        let space = FreeSpace(directory: directory, free: free, toCome: toCome, reserve: limits.minimumFreeBytes)
        guard overflow || free < needed else { return (result, partial, nil) }
        return (.noSpace(needed: overflow ? .max : needed, free: free), nil, space)
    }

    /// A usable partial file of `offer` (with its hash state), or nothing.
    private func lookUpPartial(_ offer: ItemOffer) throws -> (DeliveryReceiverStateMachine.LookUpResult, FoundPartial?) {
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

    /// Reports a refusal of `offer` by this node, in words with the limit and the size (and logs it).
    private func refused(_ offer: ItemOffer, _ reason: ItemRefusal, space: FreeSpace?) {
        let words = Self.explanation(of: reason, for: offer, limits: limits, space: space, now: now())
        logger.notice("refused an offer", metadata: ["item": "\(offer.id)", "reason": "\(words)"])
        events?(.refusedOffer(offer, reason, reason: words))
    }

    /// Why this node refuses `offer` for `reason`, in words: the limit and the size, or the free space.
    static func explanation(of reason: ItemRefusal, for offer: ItemOffer, limits: DeliveryLimits, space: FreeSpace?, now: Date) -> String {
        switch reason {
        case .tooLarge:
            let (limit, key) = offer.kind == .text ? (limits.maxTextBytes, "maxTextBytes") : (limits.maxItemBytes, "maxItemBytes")
            return "larger than this node's limit of \(ByteCount.format(limit)) (\(key))"
        case .invalidName:
            return offer.kind == .text ? "a text carries no name, and this one has one"
                : "its name is not a single safe file name (empty, \".\", \"..\", a slash or backslash, or control characters)"
        case .expired:
            let expires = Date(milliseconds: Int64(clamping: offer.expiresMilliseconds))
            return "it expired at \(ISO8601DateFormatter().string(from: expires)) by this node's clock (now \(ISO8601DateFormatter().string(from: now)))"
        case .noSpace:
            guard let space else { return "not enough space on this node's disk; offer it again later" }
            return "not enough space: \(ByteCount.format(space.free)) free in \(space.directory), "
                + "\(ByteCount.format(space.toCome &+ space.reserve)) needed (\(ByteCount.format(space.toCome)) to come and "
                + "\(ByteCount.format(space.reserve)) kept free, minimumFreeBytes); it waits until there is room"
        }
    }
}

/// The free space of the partial files' file system against what an offered file needs, as a refusal
/// reports it.
struct FreeSpace: Sendable, Hashable {
    /// The directory whose file system was measured (`partial/`).
    var directory: String
    /// Bytes available to this user there (`statvfs`: `f_bavail × f_frsize`).
    var free: UInt64
    /// The file's bytes still to come (its size less a usable partial prefix).
    var toCome: UInt64
    /// ``DeliveryLimits/minimumFreeBytes``.
    var reserve: UInt64

    /// The bytes available to this user on the file system holding `path`; nil when it cannot be read.
    static func available(at path: String) -> UInt64? {
        var info = statvfs()
        guard statvfs(path, &info) == 0 else { return nil }
        let (bytes, overflow) = UInt64(info.f_bavail).multipliedReportingOverflow(by: UInt64(info.f_frsize))
        return overflow ? .max : bytes
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

/// What became of one text of a batch.
private enum BatchOutcome: Sendable {
    case pending(ItemOffer)
    case stored(InboxItem)
    case duplicate(ItemOffer)
    case refused(ItemOffer, ItemRefusal)
    case discarded(ItemOffer, TransferFailure)
}

/// Hashes received content as it arrives and collects it into blocks, each written on the blocking pool
/// while the next frames arrive, at most one block in flight: the hash (the costliest step) runs beside
/// the pool's file write instead of after it. A block is written once it holds
/// ``DeliveryLimits/blockBytes``, or when nothing is being written and ``DeliveryLimits/writeInterval``
/// passed since the last write began (a slow link still sees its content written and reported).
///
/// Every ``DeliveryLimits/writebackBytes`` written, it asks the kernel to start writing them to the disk,
/// as a job of its own on the pool: that request can block while the device's queue is full, and inside
/// the block's write it held the next block back (the transfer then waited on the disk at every block
/// instead of beside it).
private struct BlockWriter {
    let file: PartialFile
    /// The SHA-256 state after every byte of the item received so far (a resumed prefix included).
    private var hasher: SHA256
    /// Bytes of the item in the file once the block in flight is written.
    private var written: UInt64
    private let blockBytes: Int
    /// What a block may hold: it is written once it holds `blockBytes`, and the piece that filled it
    /// (at most a frame's payload) may go beyond.
    private let blockCapacity: Int
    private let interval: TimeAmount
    private let pool: NIOThreadPool
    private let eventLoop: any EventLoop
    private var block = ByteBuffer()
    /// A block the pool wrote, for the next block to fill again: reusing its memory spares allocating
    /// (and faulting in) a fresh megabyte for each block.
    private let recycledBlock = BufferHandoff()
    private var inFlight: PoolJob<UInt64>?
    private var nextWrite = NIODeadline.now()
    /// Where the writeback not yet asked for begins: the file before it was either there already (a
    /// resumed prefix) or has its writeback started.
    private var writebackFrom: UInt64
    private let writebackBytes: UInt64
    private var writeback: PoolJob<Void>?

    init(file: PartialFile, hasher: SHA256, written: UInt64, limits: DeliveryLimits, pool: NIOThreadPool,
         eventLoop: any EventLoop) {
        self.file = file
        self.hasher = hasher
        self.written = written
        self.writebackFrom = written
        self.blockBytes = limits.blockBytes
        self.blockCapacity = limits.blockBytes + limits.maxFramePayloadBytes
        self.writebackBytes = UInt64(limits.writebackBytes)
        self.interval = TimeAmount(limits.writeInterval)
        self.pool = pool
        self.eventLoop = eventLoop
    }

    /// Adds `bytes` and starts a write when one is due (waiting for the previous one only when a full
    /// block is waiting behind it). Returns the item's bytes in the file after each write that completed.
    mutating func append(_ bytes: ByteBuffer) async throws -> [UInt64] {
        bytes.withUnsafeReadableBytes { hasher.update(bufferPointer: $0) }
        if block.capacity == 0 {
            block = recycledBlock.take() ?? ByteBuffer()
            block.clear(minimumCapacity: max(blockCapacity, bytes.readableBytes))
        }
        var bytes = bytes
        block.writeBuffer(&bytes)
        var done: [UInt64] = []
        if let write = inFlight, block.readableBytes >= blockBytes || write.isFinished {
            done.append(try await completed(write))
        }
        if inFlight == nil && (block.readableBytes >= blockBytes || NIODeadline.now() >= nextWrite) { start() }
        return done
    }

    /// Writes everything still held and waits for the writeback asked for; returns the item's bytes in
    /// the file after each write that completed.
    mutating func flush() async throws -> [UInt64] {
        var done: [UInt64] = []
        if let previous = inFlight { done.append(try await completed(previous)) }
        if block.readableBytes > 0 {
            start()
            if let last = inFlight { done.append(try await completed(last)) }
        }
        if let writeback { try await writeback.future.get() }
        writeback = nil
        return done
    }

    /// The SHA-256 of everything appended (and of the resumed prefix).
    func digest() -> [UInt8] { Array(hasher.finalize()) }

    /// After a failure: waits for the block in flight and writes the one filling, ignoring errors (the
    /// session is failing anyway; what gets written only spares a resume some bytes). The file may close
    /// after it: no job of this writer uses it any more.
    mutating func drain() async {
        _ = try? await flush()
        _ = try? await writeback?.future.get()
        writeback = nil
    }

    /// Waits for the block write `job`, then asks for the writeback of what is written when
    /// ``DeliveryLimits/writebackBytes`` gathered and no request runs; not while the file is written
    /// with direct I/O (its content is on the disk already; read here, with no write running).
    private mutating func completed(_ job: PoolJob<UInt64>) async throws -> UInt64 {
        let after = try await job.future.get()
        inFlight = nil
        if !file.writesDirectly, after - writebackFrom >= writebackBytes, writeback?.isFinished ?? true {
            let (file, offset, length) = (self.file, writebackFrom, after - writebackFrom)
            writeback = PoolJob(pool, eventLoop) { file.startWriteback(offset: offset, length: length) }
            writebackFrom = after
        }
        return after
    }

    private mutating func start() {
        let (file, filled, recycled) = (self.file, BufferHandoff(block), recycledBlock)
        written += UInt64(block.readableBytes)
        let after = written
        block = ByteBuffer()
        inFlight = PoolJob(pool, eventLoop) {
            guard let data = filled.take() else { return after }
            try file.append(data)
            recycled.put(data)
            return after
        }
        nextWrite = .now() + interval
    }
}

/// A job on the blocking pool and whether it finished, which a writer checks without waiting.
private struct PoolJob<Value: Sendable> {
    let future: EventLoopFuture<Value>
    private let finished: NIOLockedValueBox<Bool>

    init(_ pool: NIOThreadPool, _ eventLoop: any EventLoop, _ body: @escaping @Sendable () throws -> Value) {
        let finished = NIOLockedValueBox(false)
        self.finished = finished
        self.future = pool.runIfActive(eventLoop: eventLoop) {
            defer { finished.withLockedValue { $0 = true } }
            return try body()
        }
    }

    var isFinished: Bool { finished.withLockedValue { $0 } }
}
