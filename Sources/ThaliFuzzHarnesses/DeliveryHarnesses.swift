import Crypto
import Foundation
import NIOCore
import ThaliNodeCore

/// Delivery frames as a receiver and a sender read them: the codec (whole, and split at random points
/// through the node's decoder, which passes data payloads on in pieces), then both state machines fed
/// what that decoder passed on.
///
/// Invariants: decoding does not depend on where the stream was split (the pieces of each data frame
/// join into the frame decoded whole; none is empty); a decoded frame re-encodes to exactly the bytes it
/// came from and never exceeds the payload limit; once a state machine has failed or finished it accepts
/// no further frame.
enum DeliveryFramesHarness {
    static let name = "delivery-frames"
    static let limits: DeliveryLimits = {
        var limits = DeliveryLimits()
        limits.maxFramePayloadBytes = 4096
        return limits
    }()
    static let now: UInt64 = 1_763_700_000_000

    static let harness = FuzzHarness(name: name, summary: "delivery frames through the codec and both state machines", seeds: seeds) {
        (input: inout FuzzInput) throws(FuzzInvariantViolation) in
        let cuts = takeCuts(&input)
        let bytes = input.rest()
        let whole = decodeAll([bytes[...]])
        let split = try decodeStreaming(splitPieces(bytes, cuts: cuts))
        try check(whole.frames == split.frames && whole.failed == split.failed, name,
                  "decoding depends on the split: \(whole.frames.count) frames vs \(split.frames.count)")
        for (frame, encoded) in zip(whole.frames, whole.encodings) {
            var buffer = ByteBuffer()
            frame.encode(into: &buffer)
            try check(Array(buffer.readableBytesView) == encoded, name, "\(frame.name) does not re-encode to its bytes")
            try check(encoded.count - DeliveryFrame.headerBytes <= limits.maxFramePayloadBytes, name, "payload over the limit")
        }

        var receiver = DeliveryReceiverStateMachine(limits: limits, now: { now })
        var sender = DeliverySenderStateMachine()
        _ = try? sender.start()
        var receiverClosed = false, senderClosed = false
        for frame in split.passedOn {
            // The receiver, answering every request for local I/O as a store with nothing in it would.
            if receiverClosed {
                // Ended (failed or finished): every further frame is refused.
                try check((try? receiver.receive(frame)) == nil, name, "receiver accepted \(frame.name) after it ended")
            } else { do {
                var action = try receiver.receive(frame)
                while true {
                    switch action {
                    case .lookUp: action = try receiver.lookUpCompleted(.nothing)
                    case .verify(let offer): action = try receiver.contentVerified(digest: offer.sha256)
                    case .commit: action = try receiver.committed()
                    case .finish: receiverClosed = true; action = .none
                    default: break
                    }
                    if case .none = action { break }
                    if case .send = action { break }
                    if case .append = action { break }
                    if case .preparePartial = action { break }
                    if case .discardPartial = action { break }
                    if case .batch = action { break }
                }
            } catch let violation as FuzzInvariantViolation {
                throw violation
            } catch {
                try check(receiver.state == .failed, name, "receiver threw \(error) but is \(receiver.stateName)")
                receiverClosed = true
            } }
            // The sender, which offered one item.
            if case .ready = sender.state, case .offer(let offer) = frame { _ = try? sender.offer(offer) }
            if senderClosed {
                try check((try? sender.receive(frame)) == nil, name, "sender accepted \(frame.name) after it ended")
                continue
            }
            do {
                switch try sender.receive(frame) {
                case .verifyPrefix: _ = try sender.prefixVerified(matches: false)
                case .stream: _ = try sender.contentSent()
                default: break
                }
            } catch let violation as FuzzInvariantViolation {
                throw violation
            } catch {
                try check(sender.state == .failed, name, "sender threw \(error) but is \(sender.stateName)")
                senderClosed = true
            }
        }
    }

    struct Decoded {
        var frames: [DeliveryFrame] = []
        var encodings: [[UInt8]] = []
        var failed = false
        /// What a node's decoder passed on (data frames in pieces); `frames` has each data frame whole.
        var passedOn: [DeliveryFrame] = []
    }

    /// Decodes the pieces as the node's channel does (``DeliveryFrameDecoder`` passing data payloads on as
    /// they arrive), joining each data frame's pieces back into the frame for comparison.
    static func decodeStreaming(_ pieces: [ArraySlice<UInt8>]) throws(FuzzInvariantViolation) -> Decoded {
        var decoded = Decoded()
        var decoder = DeliveryFrameDecoder(limits: limits)
        var buffer = ByteBuffer()
        var dataFrame: ByteBuffer?
        for piece in pieces {
            buffer.writeBytes(piece)
            while true {
                let pendingBefore = decoder.pendingDataBytes
                let frame: DeliveryFrame?
                do { frame = try decoder.next(from: &buffer) } catch {
                    decoded.failed = true
                    return decoded
                }
                guard let frame else { break }
                decoded.passedOn.append(frame)
                guard case .data(var content) = frame else {
                    try check(pendingBefore == 0, name, "\(frame.name) passed on inside a data frame")
                    decoded.frames.append(frame)
                    continue
                }
                try check(content.readableBytes > 0, name, "an empty data piece")
                if dataFrame == nil { dataFrame = ByteBuffer() }
                dataFrame?.writeBuffer(&content)
                if decoder.pendingDataBytes == 0, let whole = dataFrame {
                    decoded.frames.append(.data(whole))
                    dataFrame = nil
                }
            }
        }
        return decoded
    }

    /// Decodes the pieces as a stream arrives: appended to one buffer, frames taken whenever complete.
    static func decodeAll(_ pieces: [ArraySlice<UInt8>]) -> Decoded {
        var decoded = Decoded()
        var buffer = ByteBuffer()
        for piece in pieces {
            buffer.writeBytes(piece)
            while true {
                let before = buffer  // shares storage; reads below the reader index are not allowed
                do {
                    guard let frame = try DeliveryFrame.decode(from: &buffer, limits: limits) else { break }
                    decoded.frames.append(frame)
                    decoded.encodings.append(before.getBytes(at: before.readerIndex, length: buffer.readerIndex - before.readerIndex) ?? [])
                } catch {
                    decoded.failed = true
                    return decoded
                }
            }
        }
        return decoded
    }

    static func seeds() -> [[UInt8]] {
        let offer = ItemOffer(id: UUID(uuid: (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16)), kind: .file, size: 5,
                              sha256: Array(SHA256.hash(data: Array("hello".utf8))), createdMilliseconds: now,
                              expiresMilliseconds: now + 86_400_000, name: "hello.txt")
        let frames: [DeliveryFrame] = [
            .hello(version: DeliveryFrame.protocolVersion), .offer(offer), .start(id: offer.id, offset: 0),
            .data(ByteBuffer(string: "hel")), .data(ByteBuffer(string: "lo")), .end(id: offer.id), .done,
        ]
        let answers: [DeliveryFrame] = [
            .welcome(version: 2, maxFramePayloadBytes: 1024), .answer(id: offer.id, .nothing), .answer(id: offer.id, .partial(offset: 3, prefixSHA256: Array(SHA256.hash(data: Array("hel".utf8))))),
            .ack(id: offer.id), .reject(id: offer.id, .digestMismatch), .answer(id: offer.id, .refused(.tooLarge)),
        ]
        func encode(_ frames: [DeliveryFrame]) -> [UInt8] {
            var buffer = ByteBuffer()
            for frame in frames { frame.encode(into: &buffer) }
            return Array(buffer.readableBytesView)
        }
        let version1: [DeliveryFrame] = [.hello(version: 1), .offer(offer), .error(code: .frameTooLarge, reason: "frame payload of 32768 bytes exceeds the limit of 1024")]
        // Version 3: texts whole in a batch, progress reports, the welcome with its window.
        func text(_ index: UInt8, _ content: String) -> ItemOffer {
            ItemOffer(id: UUID(uuid: (index, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16)), kind: .text,
                      size: UInt64(content.utf8.count), sha256: Array(SHA256.hash(data: Array(content.utf8))),
                      createdMilliseconds: now, expiresMilliseconds: now + 86_400_000, name: "")
        }
        let version3: [DeliveryFrame] = [
            .hello(version: 3), .item(text(7, "hi"), content: ByteBuffer(string: "hi"), endsBatch: false),
            .item(text(8, "ho"), content: ByteBuffer(string: "ho"), endsBatch: true), .offer(offer),
            .start(id: offer.id, offset: 0), .data(ByteBuffer(string: "hello")), .end(id: offer.id), .done,
        ]
        let answers3: [DeliveryFrame] = [
            .welcome(version: 3, maxFramePayloadBytes: 1024, progressWindowBytes: 4096), .answer(id: offer.id, .nothing),
            .progress(id: offer.id, bytes: 3), .progress(id: offer.id, bytes: 5), .ack(id: offer.id),
        ]
        // Version 5: the welcome adds the receiver's linger.
        let answers5: [DeliveryFrame] = [
            .welcome(version: 5, maxFramePayloadBytes: 1024, progressWindowBytes: 4096, lingerMilliseconds: 30_000),
            .answer(id: offer.id, .nothing), .ack(id: offer.id),
        ]
        return [[0] + encode(frames), [2, 3, 0, 40, 0] + encode(frames), [0] + encode(answers), [1, 9, 0] + encode(version1),
                [0] + encode(version3), [0] + encode(answers3), [0] + encode(answers5)]
    }
}

/// The delivery protocol end to end: a sender and a receiver state machine, each driven as the node
/// drives them (an in-memory outbox, inbox and partial files), exchanging real encoded frames. The input
/// chooses the items, where sessions are cut, how bytes are chunked, and which partial files get damaged
/// between sessions.
///
/// Invariants: after a final session that nothing cuts, every item is in the inbox exactly once with
/// exactly the sender's content, was committed once, and has left the outbox; no session ever
/// commits content that differs from the sender's; the sender's chunks (larger than the receiver's frame
/// maximum) come down to the maximum its welcome announced.
enum DeliveryPairHarness {
    static let name = "delivery-pair"
    /// The receiver's limits: the smallest frame maximum there is.
    static let limits: DeliveryLimits = {
        var limits = DeliveryLimits()
        limits.chunkBytes = 256
        limits.maxFramePayloadBytes = DeliveryLimits.minimumFramePayloadBytes
        return limits
    }()
    /// The sender's own chunk size, above the receiver's maximum: the receiver's welcome must bring it down
    /// (a data frame over the receiver's maximum fails the session, an invariant violation here).
    static let senderChunkBytes = 2 * DeliveryLimits.minimumFramePayloadBytes
    static let now = DeliveryFramesHarness.now

    struct Item {
        let offer: ItemOffer
        let content: [UInt8]
    }

    struct ReceiverStore {
        var inbox: [UUID: [UInt8]] = [:]
        var partial: [UUID: [UInt8]] = [:]
        var commits: [UUID: Int] = [:]
    }

    static let harness = FuzzHarness(name: name, summary: "a sender and a receiver over encoded frames, with cut sessions", seeds: seeds) {
        (input: inout FuzzInput) throws(FuzzInvariantViolation) in
        var items: [Item] = []
        for index in 0..<(1 + input.int(below: 4)) {
            let kindByte = input.byte()
            let size = Int(input.uint16()) % 2048
            let seed = input.byte()
            let content = (0..<size).map { UInt8(0x20 + (($0 &* 7 &+ Int(seed) &+ index) % 90)) }  // printable: valid text
            let id = UUID(uuid: (UInt8(index), seed, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1))
            let kind: ItemKind = kindByte & 1 == 0 ? .text : .file
            items.append(Item(offer: ItemOffer(id: id, kind: kind, size: UInt64(size), sha256: Array(SHA256.hash(data: content)),
                                               createdMilliseconds: now, expiresMilliseconds: now + 3_600_000,
                                               name: kind == .text ? "" : "item-\(index).bin"), content: content))
        }
        var outbox = items.map(\.offer.id)
        var store = ReceiverStore()
        let sessions = 1 + input.int(below: 4)
        for session in 0..<sessions {
            let last = session == sessions - 1
            // Damage a partial file between sessions (storage, not the wire: TLS protects the wire).
            if input.byte() < 64, let id = store.partial.keys.sorted(by: { $0.uuidString < $1.uuidString }).first,
               var bytes = store.partial[id], !bytes.isEmpty
            {
                bytes[input.int(below: bytes.count)] ^= 0x5A
                store.partial[id] = bytes
            }
            let cut = last ? Int.max : Int(input.uint16()) * 4
            let chunk = 1 + Int(input.byte()) * 8  // awkward splits are delivery-frames' job; keep sessions cheap
            try runSession(items: items, outbox: &outbox, store: &store, cutAfter: cut, chunk: chunk)
        }
        try check(outbox.isEmpty, name, "\(outbox.count) items still in the outbox after an uncut session")
        for item in items {
            try check(store.inbox[item.offer.id] == item.content, name, "item \(item.offer.id) missing or different in the inbox")
            try check(store.commits[item.offer.id] == 1, name, "item committed \(store.commits[item.offer.id] ?? 0) times")
        }
    }

    /// One session: the sender offers every outbox item in turn. Bytes cross in `chunk`-sized pieces, and
    /// the connection ends after `cutAfter` bytes in total.
    static func runSession(items: [Item], outbox: inout [UUID], store: inout ReceiverStore, cutAfter: Int, chunk: Int)
        throws(FuzzInvariantViolation)
    {
        var sender = DeliverySenderStateMachine()
        var receiver = DeliveryReceiverStateMachine(limits: limits, now: { now })
        var toReceiver = ByteBuffer(), toSender = ByteBuffer()  // written, not yet moved
        var inboundToReceiver = ByteBuffer(), inboundToSender = ByteBuffer()  // moved, not yet decoded
        // As the node's channels decode: data payloads passed on in pieces as they arrive.
        var receiverDecoder = DeliveryFrameDecoder(limits: limits), senderDecoder = DeliveryFrameDecoder(limits: limits)
        var moved = 0
        var pending = outbox
        var batch: [DeliveryReceiverStateMachine.BatchEntry] = []  // received items of a batch, not yet committed
        let content = Dictionary(uniqueKeysWithValues: items.map { ($0.offer.id, $0.content) })

        func send(_ frame: DeliveryFrame, to buffer: inout ByteBuffer) { frame.encode(into: &buffer) }
        /// The sender's next move once it is ready: offer the next item, or finish.
        /// A text that fits in one of the receiver's frames goes whole, in a batch with the texts after it
        /// (version 3), as the node sends them.
        func whole(_ id: UUID) -> (offer: ItemOffer, content: ByteBuffer)? {
            guard sender.receiverSpeaksProgress, let item = items.first(where: { $0.offer.id == id }), item.offer.kind == .text,
                  DeliveryFrame.itemHeaderBytes(item.offer) + item.content.count <= sender.receiverMaxFramePayloadBytes ?? 0
            else { return nil }
            return (item.offer, ByteBuffer(bytes: item.content))
        }
        func offerNext() throws {
            if let id = pending.first, let text = whole(id) {
                var texts = [text]
                pending.removeFirst()
                while texts.count < 3, let next = pending.first, let text = whole(next) {  // small batches: more boundaries
                    pending.removeFirst()
                    texts.append(text)
                }
                for frame in try sender.offerBatch(texts) { send(frame, to: &toReceiver) }
            } else if let id = pending.first, let item = items.first(where: { $0.offer.id == id }) {
                pending.removeFirst()
                send(try sender.offer(item.offer), to: &toReceiver)
            } else {
                send(try sender.finish(), to: &toReceiver)
            }
        }
        func stream(_ offer: ItemOffer, from offset: UInt64) throws {
            send(.start(id: offer.id, offset: offset), to: &toReceiver)
            let bytes = content[offer.id] ?? []
            var position = Int(offset)
            while position < bytes.count {
                let end = min(bytes.count, position + min(senderChunkBytes, sender.receiverMaxFramePayloadBytes ?? senderChunkBytes))
                send(.data(ByteBuffer(bytes: bytes[position..<end])), to: &toReceiver)
                position = end
            }
            send(try sender.contentSent(), to: &toReceiver)
        }
        func senderHandles(_ frame: DeliveryFrame) throws {
            var action = try sender.receive(frame)
            while true {
                switch action {
                case .verifyPrefix(let offer, let offset, let digest):
                    let ours = Array(SHA256.hash(data: (content[offer.id] ?? []).prefix(Int(offset))))
                    action = try sender.prefixVerified(matches: ours == digest)
                    continue
                case .stream(let offer, let offset):
                    try stream(offer, from: offset)
                case .delivered(let offer, _), .refused(let offer, _):
                    outbox.removeAll { $0 == offer.id }
                case .rejected, .welcomed, .deferred:
                    // Rejected and deferred items stay pending, for a later session.
                    break
                case .progressed(let offer, let bytes):
                    // What the sender reports never runs ahead of what it sent.
                    let sent = UInt64(content[offer.id]?.count ?? 0)
                    if bytes > sent { throw FuzzInvariantViolation(harness: name, detail: "progress \(bytes) beyond \(sent)") }
                }
                if case .ready = sender.state { try offerNext() }
                return
            }
        }
        func receiverHandles(_ frame: DeliveryFrame) throws -> Bool {
            var action = try receiver.receive(frame)
            while true {
                switch action {
                case .none: return true
                case .send(let frame): send(frame, to: &toSender); return true
                case .lookUp(let offer):
                    if store.inbox[offer.id] != nil { action = try receiver.lookUpCompleted(.complete) }
                    else if let partial = store.partial[offer.id] {
                        action = try receiver.lookUpCompleted(.partial(length: UInt64(partial.count), prefixSHA256: Array(SHA256.hash(data: partial))))
                    } else { action = try receiver.lookUpCompleted(.nothing) }
                case .preparePartial(let offer, let offset):
                    store.partial[offer.id] = Array((store.partial[offer.id] ?? []).prefix(Int(offset)))
                    return true
                case .append(let bytes):
                    if case .receiving(let offer, _) = receiver.state {
                        store.partial[offer.id, default: []] += bytes.readableBytesView
                        // As the node does after each block it wrote (here: each piece).
                        if let progress = receiver.progress(written: UInt64(store.partial[offer.id]?.count ?? 0)) { send(progress, to: &toSender) }
                    }
                    return true
                case .batch(let entry, let commit):
                    batch.append(entry)
                    guard commit else { return true }
                    for entry in batch {
                        switch entry {
                        case .refused(let offer, let reason):
                            send(.answer(id: offer.id, .refused(reason)), to: &toSender)
                        case .text(let offer, let bytes):
                            let text = Array(bytes.readableBytesView)
                            if Array(SHA256.hash(data: text)) != offer.sha256 {
                                send(.reject(id: offer.id, .digestMismatch), to: &toSender)
                            } else if store.inbox[offer.id] != nil {
                                send(.answer(id: offer.id, .complete), to: &toSender)
                            } else {
                                store.inbox[offer.id] = text
                                store.commits[offer.id, default: 0] += 1
                                send(.ack(id: offer.id), to: &toSender)
                            }
                        }
                    }
                    batch = []
                    return true
                case .verify(let offer):
                    action = try receiver.contentVerified(digest: Array(SHA256.hash(data: store.partial[offer.id] ?? [])))
                case .commit(let offer):
                    let bytes = store.partial.removeValue(forKey: offer.id) ?? []
                    if offer.kind == .text, String(validating: bytes, as: UTF8.self) == nil {
                        action = try receiver.commitRefusedInvalidText()
                    } else {
                        store.inbox[offer.id] = bytes
                        store.commits[offer.id, default: 0] += 1
                        action = try receiver.committed()
                    }
                case .discardPartial(let offer, let frame):
                    store.partial[offer.id] = nil
                    send(frame, to: &toSender)
                    return true
                case .finish: return false
                }
            }
        }

        do {
            send(try sender.start(), to: &toReceiver)  // the first offer follows the receiver's welcome
            var open = true
            while open, moved < cutAfter, toReceiver.readableBytes + toSender.readableBytes > 0 {
                // Move up to one chunk each way, then let each side read every complete frame it has.
                func transfer(_ source: inout ByteBuffer, to target: inout ByteBuffer) {
                    let count = min(chunk, source.readableBytes, cutAfter - moved)
                    guard count > 0, let piece = source.readSlice(length: count) else { return }
                    moved += count
                    target.writeImmutableBuffer(piece)
                }
                transfer(&toReceiver, to: &inboundToReceiver)
                transfer(&toSender, to: &inboundToSender)
                while open, let frame = try receiverDecoder.next(from: &inboundToReceiver) {
                    open = try receiverHandles(frame)
                }
                while let frame = try senderDecoder.next(from: &inboundToSender) {
                    try senderHandles(frame)
                }
            }
        } catch {
            throw FuzzInvariantViolation(harness: name, detail: "an honest session failed: \(error)")
        }
        for (id, bytes) in store.inbox {
            try check(bytes == content[id], name, "committed content differs from the sender's for \(id)")
        }
        if cutAfter == .max {
            try check(receiver.state == .finished, name, "an uncut session ended with the receiver \(receiver.stateName)")
        }
    }

    static func seeds() -> [[UInt8]] {
        [
            [1, 0, 0x10, 0x00, 7, 0, 0xFF],  // one text item, one session
            [2, 1, 0x00, 0x04, 9, 0, 0x00, 0x02, 0x40, 0xFF, 0, 0xFF],  // two items, a cut session, then a full one
            [0, 1, 0x00, 0x06, 3, 2, 0x00, 0x01, 0x80, 0x00, 0x00, 0x03, 0x20],  // a cut, a damaged partial, a resume
        ]
    }
}
