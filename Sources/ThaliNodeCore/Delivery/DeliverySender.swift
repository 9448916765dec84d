import Crypto
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import ThaliMutants

/// Delivers the pending items for one contact over one delivery stream: the session driver of
/// ``DeliverySenderStateMachine``, doing the store and file I/O it asks for.
///
/// The peer is the contact that the layer below (beacons + PSK-TLS) authenticated; only that contact's
/// items are offered. A file is read in blocks off the event loop (the next block while the previous one
/// is sent); with a version 3 receiver, progress is what the receiver reported writing, and texts go in
/// batches of `item` frames without a round trip each. An item is removed from the outbox only after the receiver acknowledges it (or
/// reports it already stored); anything else leaves it pending for the next session. With a version 5
/// receiver the session lingers once everything is answered: items queued meanwhile (``newItems``
/// signalled) are offered on it at once, and `done` comes only after the linger passed with nothing new.
package struct DeliverySender: Sendable {
    /// What one session achieved.
    package struct Summary: Sendable, Hashable {
        /// Items the receiver acknowledged in this session.
        package var delivered: [UUID] = []
        /// Items the receiver already had (acknowledged in an earlier session whose ack was lost).
        package var alreadyStored: [UUID] = []
        /// Items the receiver refused for good.
        package var refused: [UUID] = []
        /// Items the receiver could not hold now (version 4, ``ItemRefusal/noSpace``): still pending,
        /// offered again after a wait.
        package var deferred: [UUID] = []
        /// Items whose content the receiver rejected as damaged; still pending, sent again later.
        package var rejected: [UUID] = []
        /// Content bytes sent (resumed prefixes not counted).
        package var bytesSent: UInt64 = 0
    }

    /// The store whose outbox is delivered.
    package let store: NodeStore
    /// The authenticated peer: the contact the items are for.
    package let peer: Contact
    /// Bounds for frames and chunks.
    package let limits: DeliveryLimits
    private let now: @Sendable () -> Date
    private let events: DeliveryEventHandler?
    private let logger: Logger
    private let blockingPool: NIOThreadPool
    /// Signalled when items may have been queued for ``peer``: a lingering session looks again.
    private let newItems: LinkWakeSignal?
    /// Asked each time the session would linger: false ends it with `done` at once (the node's port
    /// is busy, and a lingering session holds one of its connections).
    private let mayLinger: @Sendable () -> Bool
    /// Called once, when the session first lingers: from then until it ends, items queued for ``peer``
    /// go on it.
    private let onLinger: (@Sendable () -> Void)?

    /// Creates a sender of `store`'s items for `authenticatedPeer`, the contact whose identity the
    /// transport below proved (never a name taken from the stream itself). Database and file work runs on
    /// `blockingPool`, never on the event loop or the concurrency pool. Without `newItems` the session
    /// never lingers (nothing would tell it of a new item).
    package init(store: NodeStore, authenticatedPeer: Contact, limits: DeliveryLimits? = nil,
                now: @escaping @Sendable () -> Date = { Date() }, events: DeliveryEventHandler? = nil,
                logger: Logger = Logger(label: "thali.delivery.sender"), blockingPool: NIOThreadPool = .singleton,
                newItems: LinkWakeSignal? = nil, mayLinger: @escaping @Sendable () -> Bool = { true },
                onLinger: (@Sendable () -> Void)? = nil) {
        self.onLinger = onLinger
        self.blockingPool = blockingPool
        self.newItems = newItems
        self.mayLinger = mayLinger
        self.store = store
        self.peer = authenticatedPeer
        self.limits = limits ?? store.limits
        self.now = now
        self.events = events
        var logger = logger
        logger[metadataKey: "peer"] = "\(authenticatedPeer.name)"
        self.logger = logger
    }

    /// Runs one session on `channel` (configured by ``DeliveryChannel``) and closes it. Throws on a
    /// protocol violation, a lost connection or a timeout; what was acknowledged before stays delivered.
    ///
    /// One session per direction and contact runs at a time: a second one throws
    /// ``NodeError/sessionInProgress(contact:role:)`` and closes its channel.
    package func run(on channel: DeliveryChannel.AsyncFrames) async throws -> Summary {
        try await store.withSessionClaim(
            NodeStore.SessionRole.sending, with: peer, onRefusal: { try? await channel.channel.close() }
        ) {
            try await runClaimed(on: channel)
        }
    }

    /// The session itself, once ``run(on:)`` holds the claim. The copies of the files delivered, set
    /// aside as each was acknowledged, are deleted once the stream is closed: deleting a large file can
    /// take long (0.2 s for 256 MiB on a file system that trims what it frees), and neither the receiver
    /// nor the next item needs to wait for it.
    private func runClaimed(on channel: DeliveryChannel.AsyncFrames) async throws -> Summary {
        let store = self.store
        let setAside = NIOLockedValueBox<[String]>([])
        let removeSetAside = {
            let copies = setAside.withLockedValue { $0 }
            if !copies.isEmpty { _ = try? await blocking { store.removeSetAsideCopies(copies) } }
        }
        do {
            let summary = try await exchange(on: channel, settingAsideCopiesIn: setAside)
            await removeSetAside()
            return summary
        } catch {
            await removeSetAside()
            throw error
        }
    }

    /// The frames of the session, from `hello` until the stream closes. Paths of the delivered files'
    /// copies, set aside at each `ack`, are added to `setAside`.
    private func exchange(on channel: DeliveryChannel.AsyncFrames,
                          settingAsideCopiesIn setAside: NIOLockedValueBox<[String]>) async throws -> Summary {
        let stream = channel.channel
        // A lingering session wakes when its stream closes (the receiver or its node went away).
        if let newItems { stream.closeFuture.whenComplete { _ in newItems.signal() } }
        return try await channel.executeThenClose { inbound, outbound in
            var machine = DeliverySenderStateMachine()
            do {
                return try await session(inbound.makeAsyncIterator(), outbound, &machine, setAside, stream)
            } catch let error as DeliveryProtocolError {
                // A receiver that welcomed us hears why the session ends (it cannot see our side's reason).
                if machine.receiverHearsErrors, !Mutant.deliveryEndsWithoutError.isActive, let report = DeliveryFrame.error(reporting: error) {
                    await DeliveryChannel.sendLast(report, on: channel.channel)
                }
                throw error.naming(peer: peer.name)
            }
        }
    }

    /// The frames of one session, after the claim.
    private func session(_ frames: NIOAsyncChannelInboundStream<DeliveryFrame>.AsyncIterator,
                         _ outbound: NIOAsyncChannelOutboundWriter<DeliveryFrame>,
                         _ machine: inout DeliverySenderStateMachine, _ setAside: NIOLockedValueBox<[String]>,
                         _ channel: any Channel) async throws -> Summary {
        let store = self.store, peer = self.peer, now = self.now, eventLoop = channel.eventLoop
        var frames = frames
        var summary = Summary()
        var handled = Set<UUID>()
        var chunkBytes = limits.chunkBytes
        try await outbound.write(machine.start())
        // The receiver's welcome: its frame maximum bounds our chunks [NODE-1.18]. (A version 1 sender,
        // which only a mutant plays, waits for none.)
        if machine.state == .awaitingWelcome, case .welcomed(let maximum) = try machine.receive(try await next(&frames, &machine)) {
            if !Mutant.deliveryIgnoresFrameMaximum.isActive { chunkBytes = max(1, min(chunkBytes, maximum)) }
        }
        _ = try await blocking { try store.sweepExpired(now: now()) }
        // Items are fetched a batch at a time; an empty batch is refetched once, so items queued during
        // the session go out too. `handled` keeps an item from being offered twice in one session.
        var batch: [OutboxItem] = []
        // The item counts of the batches written and not yet answered, oldest first.
        var unanswered: [Int] = []
        // Version 5: when the current linger ends (set when the session first runs out of items).
        var lingerEnds: ContinuousClock.Instant?
        var lingered = false
        while true {
            if batch.isEmpty {
                batch = try await blocking { [handled] in
                    try store.pendingItems(for: peer, now: now()).filter { !handled.contains($0.id) }
                }
                if batch.isEmpty {
                    // Only a session that carried something lingers: one that found nothing ends at once.
                    guard !handled.isEmpty, let linger = lingerTime(machine) else { break }
                    // Everything offered is answered before the wait, so the receiver's is idle too.
                    while !unanswered.isEmpty { try await settleBatch(of: unanswered.removeFirst(), &frames, &machine, &summary) }
                    let ends = lingerEnds ?? ContinuousClock.now + linger
                    lingerEnds = ends
                    let left = ends - ContinuousClock.now
                    guard left > .zero, channel.isActive, mayLinger(), let newItems else { break }
                    if !lingered {
                        lingered = true
                        onLinger?()
                    }
                    await newItems.wait(upTo: left)
                    // The receiver (or its node) closed the stream while we waited: a normal end.
                    guard channel.isActive, !Task.isCancelled else { return summary }
                    continue
                }
                // Something to offer: the next time the session runs out, it lingers afresh.
                lingerEnds = nil
            }
            let item = batch.removeFirst()
            handled.insert(item.id)
            // Expired while waiting in this batch: the next sweep drops it; never offer it.
            guard item.expiresAtMs > now().millisecondsSinceEpoch else { continue }
            // Texts that fit in one frame go whole, as many together as a batch holds (version 3).
            if let first = whole(item, &machine) {
                var texts = [first]
                while texts.count < limits.maxBatchItems, let next = batch.first,
                      next.expiresAtMs > now().millisecondsSinceEpoch, let text = whole(next, &machine) {
                    batch.removeFirst()
                    handled.insert(next.id)
                    texts.append(text)
                }
                // Written now, answered later: the next batch goes out while the receiver commits this one.
                try await writeBatch(texts, outbound, &machine, &summary)
                unanswered.append(texts.count)
                if unanswered.count >= limits.batchesInFlight {
                    try await settleBatch(of: unanswered.removeFirst(), &frames, &machine, &summary)
                }
                continue
            }
            // Anything but a text waits for the answers of every batch before it.
            while !unanswered.isEmpty { try await settleBatch(of: unanswered.removeFirst(), &frames, &machine, &summary) }
            guard let content = ItemContent(item) else {
                logger.error("content of queued item is missing", metadata: ["item": "\(item.id)"])
                try await blocking { try store.recordProblem(item.id, "the node's copy of the file is missing or changed size") }
                continue
            }
            events?(.offered(item.offer))
            try await outbound.write(machine.offer(item.offer))
            var action = try machine.receive(try await next(&frames, &machine))
            while true {
                switch action {
                case .verifyPrefix(_, let offset, let digest):
                    let matches = try await blocking { try content.prefixDigest(length: offset) } == digest || Mutant.deliveryResumesUnchecked.isActive
                    if !matches { logger.info("receiver's partial copy differs; restarting", metadata: ["item": "\(item.id)"]) }
                    action = try machine.prefixVerified(matches: matches)
                    continue
                case .stream(let offer, let offset):
                    if offset != UInt64(max(0, item.acknowledgedBytes)) {
                        try await blocking { try store.recordAcknowledgedBytes(offer.id, offset) }
                    }
                    events?(.transferStarted(id: offer.id, offset: offset, total: offer.size))
                    try await outbound.write(.start(id: offer.id, offset: offset))
                    try await stream(content, offer, from: offset, chunkBytes: chunkBytes, &frames, outbound, &machine, &summary, eventLoop)
                    try await outbound.write(machine.contentSent())
                    action = try machine.receive(try await next(&frames, &machine))
                    continue
                case .progressed(let offer, let bytes):
                    events?(.progress(id: offer.id, bytes: bytes, total: offer.size))
                    action = try machine.receive(try await next(&frames, &machine))
                    continue
                case .delivered(let offer, let alreadyStored):
                    // Its copy is deleted after the session (``runClaimed(on:)``), not before the next item.
                    if !alreadyStored || !Mutant.deliveryKeepsCompleted.isActive {
                        let copies = try await blocking { try store.markDeliveredSettingAsideCopies([offer.id]) }
                        setAside.withLockedValue { $0 += copies }
                    }
                    if alreadyStored { summary.alreadyStored.append(offer.id) } else { summary.delivered.append(offer.id) }
                    logger.debug("delivered", metadata: ["item": "\(offer.id)", "alreadyStored": "\(alreadyStored)"])
                    // A version 2 receiver reports nothing before its ack, which covers every byte.
                    if !alreadyStored && !machine.receiverSpeaksProgress && offer.size > 0 {
                        events?(.progress(id: offer.id, bytes: offer.size, total: offer.size))
                    }
                    events?(.delivered(id: offer.id, alreadyStored: alreadyStored))
                case .refused(let offer, let reason):
                    try await settle(.refused(offer, reason), &summary)
                case .deferred(let offer, let reason):
                    try await settle(.deferred(offer, reason), &summary)
                    // Not offered before its retry time (the outbox holds it back until then), but then
                    // again in this session if it still runs: a session that lingers may outlast the wait.
                    handled.remove(offer.id)
                case .rejected(let offer, let failure):
                    try await settle(.rejected(offer, failure), &summary)
                case .welcomed:
                    throw DeliveryProtocolError.unexpectedFrame(frame: "welcome", state: machine.stateName)
                }
                break
            }
        }
        while !unanswered.isEmpty { try await settleBatch(of: unanswered.removeFirst(), &frames, &machine, &summary) }
        try await outbound.write(machine.finish())
        // The receiver closes after `done`; waiting for that lets `done` arrive before our close. How the
        // stream ends (a clean EOF, or a reset as some multiplexers close) no longer matters: every item
        // was settled by its own acknowledgement.
        let after: DeliveryFrame?
        do { after = try await frames.next() } catch { after = nil }
        if let after { throw DeliveryProtocolError.unexpectedFrame(frame: after.name, state: machine.stateName) }
        return summary
    }

    /// How long the session may stay open once everything is answered: the shorter of the receiver's
    /// linger (from its version 5 `welcome`) and our own; nil when it may not (an older receiver, no
    /// way to hear of new items, or either side's linger is zero).
    private func lingerTime(_ machine: DeliverySenderStateMachine) -> Duration? {
        guard newItems != nil, let theirs = machine.receiverLinger else { return nil }
        let linger = min(theirs, limits.effectiveLinger)
        return linger > .zero ? linger : nil
    }

    /// `item` as an `item` frame's offer and content, if the receiver takes batches (version 3) and it is
    /// a text that fits in one of its frames.
    private func whole(_ item: OutboxItem, _ machine: inout DeliverySenderStateMachine) -> (offer: ItemOffer, content: ByteBuffer)? {
        guard machine.receiverSpeaksProgress, item.kind == .text, let text = item.text,
              let maximum = machine.receiverMaxFramePayloadBytes,
              UInt64(text.utf8.count) == item.offer.size,
              DeliveryFrame.itemHeaderBytes(item.offer) + text.utf8.count <= maximum
        else { return nil }
        return (item.offer, ByteBuffer(string: text))
    }

    /// Writes `texts` as one batch of `item` frames; their answers are read by ``settleBatch(of:_:_:_:)``.
    private func writeBatch(_ texts: [(offer: ItemOffer, content: ByteBuffer)],
                            _ outbound: NIOAsyncChannelOutboundWriter<DeliveryFrame>,
                            _ machine: inout DeliverySenderStateMachine, _ summary: inout Summary) async throws {
        for text in texts { events?(.offered(text.offer)) }
        try await outbound.write(contentsOf: machine.offerBatch(texts))
        summary.bytesSent += texts.reduce(0) { $0 + UInt64($1.content.readableBytes) }
    }

    /// Reads the answers to the oldest unanswered batch, `count` items, in order and settles them: the
    /// delivered ones leave the outbox in one transaction.
    private func settleBatch(of count: Int,
                             _ frames: inout NIOAsyncChannelInboundStream<DeliveryFrame>.AsyncIterator,
                             _ machine: inout DeliverySenderStateMachine, _ summary: inout Summary) async throws {
        var delivered: [(id: UUID, alreadyStored: Bool)] = []
        var others: [DeliverySenderStateMachine.Action] = []
        for _ in 0..<count {
            let action = try machine.receive(try await next(&frames, &machine))
            switch action {
            case .delivered(let offer, let alreadyStored): delivered.append((offer.id, alreadyStored))
            default: others.append(action)
            }
        }
        let store = self.store, ids = delivered.map(\.id)
        try await blocking { try store.markDelivered(ids) }
        for (id, alreadyStored) in delivered {
            if alreadyStored { summary.alreadyStored.append(id) } else { summary.delivered.append(id) }
            events?(.delivered(id: id, alreadyStored: alreadyStored))
        }
        logger.debug("delivered a batch", metadata: ["items": "\(delivered.count)", "of": "\(count)"])
        for action in others { try await settle(action, &summary) }
    }

    /// Records a refused or rejected item.
    private func settle(_ action: DeliverySenderStateMachine.Action, _ summary: inout Summary) async throws {
        let store = self.store
        switch action {
        case .refused(let offer, let reason):
            let words = "\(peer.name) refused it: \(reason.explanation(receiver: peer.name))"
            if !Mutant.deliveryForgetsRefusal.isActive { try await blocking { try store.markRefused(offer.id, reason: words) } }
            summary.refused.append(offer.id)
            logger.warning("refused by the receiver", metadata: ["item": "\(offer.id)", "reason": "\(words)"])
            events?(.refused(offer, reason))
        case .deferred(let offer, let reason):
            // Pending still, but not offered (nor advertised for) before its retry time; the next items
            // of this session go on.
            let (name, backoff, at) = (peer.name, limits.noSpaceBackoff, now())
            let wait = try await blocking {
                try store.deferItem(offer.id, backoff: backoff, now: at) { wait in
                    "\(name) cannot hold it now: \(reason.explanation(receiver: name)); offered again in \(ByteWords.duration(wait))"
                }
            }
            summary.deferred.append(offer.id)
            logger.notice("the receiver cannot hold it now; offered again later",
                          metadata: ["item": "\(offer.id)", "retryIn": "\(ByteWords.duration(wait))"])
            events?(.deferred(offer, reason, retryIn: wait))
        case .rejected(let offer, let failure):
            try await blocking { try store.recordProblem(offer.id, "rejected by the receiver as damaged (\(failure.explanation)); will be sent again") }
            summary.rejected.append(offer.id)
            logger.warning("rejected by the receiver as damaged; will be sent again", metadata: ["item": "\(offer.id)", "reason": "\(failure)"])
            events?(.rejected(id: offer.id, failure))
        default:
            throw DeliveryProtocolError.unexpectedFrame(frame: "answer", state: "settling an item")
        }
    }

    /// Streams `content` from `offset` in data frames of `chunkBytes`: blocks are read on the blocking pool
    /// (up to ``DeliveryLimits/readAheadBlocks`` ahead of the one being sent) and written as several
    /// frames at once. With a version 3 receiver, content sent beyond its last `progress` stays within
    /// its window: when the next block would exceed it, the sender reads progress reports (and reports
    /// them) until it fits.
    private func stream(_ content: ItemContent, _ offer: ItemOffer, from offset: UInt64, chunkBytes: Int,
                        _ frames: inout NIOAsyncChannelInboundStream<DeliveryFrame>.AsyncIterator,
                        _ outbound: NIOAsyncChannelOutboundWriter<DeliveryFrame>,
                        _ machine: inout DeliverySenderStateMachine, _ summary: inout Summary,
                        _ eventLoop: any EventLoop) async throws {
        let reader = try await blocking { try content.reader() }
        defer { reader.close() }
        let window = Mutant.deliveryIgnoresProgressWindow.isActive ? nil : machine.progressWindowBytes.map(UInt64.init)
        // At most half the window at once: the receiver reports before it holds half of it unreported.
        let blockBytes = UInt64(min(limits.blockBytes, machine.progressWindowBytes.map { $0 / 2 } ?? .max))
        let chunkBytes = min(chunkBytes, Int(blockBytes))
        // Each read names its offset, so reads ahead may run at once on the pool's threads.
        let ahead = max(limits.readAheadBlocks, 1)
        var reads = CircularBuffer<EventLoopFuture<ByteBuffer>>(initialCapacity: ahead + 1)
        var readEnd = offset
        // Blocks already sent, read into again: once the transport let go of a block's frames, a read
        // reuses its memory instead of allocating (and faulting in) a fresh block; one still held is
        // left alone (the read allocates).
        var spares: [ByteBuffer] = []
        func readAhead(blocks: Int) {
            while reads.count < blocks && readEnd < offer.size {
                let (start, count) = (readEnd, Int(min(blockBytes, offer.size - readEnd)))
                let spare = BufferHandoff(spares.popLast())
                reads.append(blockingPool.runIfActive(eventLoop: eventLoop) {
                    var block = spare.take() ?? ByteBuffer()
                    try reader.read(count, at: start, into: &block)
                    return block
                })
                readEnd += UInt64(count)
            }
        }
        var position = offset
        readAhead(blocks: ahead + 1)
        // On any failure, the blocks being read finish before the reader closes.
        do { while let current = reads.popFirst() {
            var block = try await current.get()
            let after = position + UInt64(block.readableBytes)
            while let window, after - min(after, machine.reportedBytes) > window {
                guard case .progressed(_, let bytes) = try machine.receive(try await next(&frames, &machine)) else {
                    throw DeliveryProtocolError.unexpectedFrame(frame: "answer", state: machine.stateName)
                }
                // Written cannot exceed sent: a receiver that says so is not believed.
                guard bytes <= position else {
                    throw DeliveryProtocolError.malformedFrame(type: "progress", reason: "\(bytes) bytes written of \(position) sent")
                }
                events?(.progress(id: offer.id, bytes: bytes, total: offer.size))
            }
            readAhead(blocks: ahead)
            var chunks: [DeliveryFrame] = []
            while let chunk = block.readSlice(length: min(chunkBytes, block.readableBytes)), chunk.readableBytes > 0 {
                chunks.append(.data(chunk))
            }
            try await outbound.write(contentsOf: chunks)
            if spares.count <= ahead { spares.append(block) }
            summary.bytesSent += after - position
            position = after
        } } catch {
            for read in reads { _ = try? await read.get() }
            throw error
        }
    }

    /// Runs blocking database or file work on the blocking pool.
    private func blocking<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await blockingPool.runIfActive(body)
    }

    private func next(_ frames: inout NIOAsyncChannelInboundStream<DeliveryFrame>.AsyncIterator,
                      _ machine: inout DeliverySenderStateMachine) async throws -> DeliveryFrame {
        guard let frame = try await frames.next() else {
            try machine.streamEnded()
            throw DeliveryProtocolError.connectionClosed(state: machine.stateName)
        }
        return frame
    }
}

/// The content of an outbox item: the text's bytes or the node's copy of the file.
private enum ItemContent: Sendable {
    case bytes([UInt8])
    case file(path: String, size: UInt64)

    init?(_ item: OutboxItem) {
        switch item.kind {
        case .text:
            guard let text = item.text else { return nil }
            self = .bytes(Array(text.utf8))
        case .file:
            guard let path = item.filePath, FileContent.size(of: path) == UInt64(item.size) else { return nil }
            self = .file(path: path, size: UInt64(item.size))
        }
    }

    func prefixDigest(length: UInt64) throws -> [UInt8] {
        switch self {
        case .bytes(let bytes):
            return Array(SHA256.hash(data: bytes.prefix(Int(min(length, UInt64(bytes.count))))))
        case .file(let path, _):
            return Array(try FileContent.hashPrefix(of: path, length: length).0.finalize())
        }
    }

    /// A reader of the content.
    func reader() throws -> ContentReader {
        switch self {
        case .bytes(let bytes):
            return ContentReader(bytes: bytes)
        case .file(let path, _):
            guard let handle = FileHandle(forReadingAtPath: path) else {
                throw NodeError.unreadableFile(path: path, reason: "cannot open")
            }
            return ContentReader(handle: handle, path: path)
        }
    }
}

/// Reads an item's content, each read at its own offset (`pread`), so reads may run at once; closed
/// once no read is running, hence unchecked.
private final class ContentReader: @unchecked Sendable {
    private let handle: FileHandle?
    private let path: String
    private let bytes: [UInt8]

    init(bytes: [UInt8]) {
        self.handle = nil
        self.path = ""
        self.bytes = bytes
    }

    init(handle: FileHandle, path: String) {
        self.handle = handle
        self.path = path
        self.bytes = []
    }

    /// Replaces `buffer`'s content with the `count` bytes at `offset` (reusing its memory where
    /// nothing else holds it); throws if the content ends first.
    func read(_ count: Int, at offset: UInt64, into buffer: inout ByteBuffer) throws {
        if let handle {
            guard try FileContent.read(count, at: offset, from: handle.fileDescriptor, into: &buffer) else {
                throw NodeError.unreadableFile(path: path, reason: "shorter than its recorded size")
            }
            return
        }
        let start = Int(min(offset, UInt64(bytes.count)))
        buffer.clear()
        buffer.writeBytes(bytes[start..<min(start + count, bytes.count)])
    }

    func close() { try? handle?.close() }
}
