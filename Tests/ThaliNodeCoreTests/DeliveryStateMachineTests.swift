import Foundation
import NIOCore
import Testing
@testable import ThaliNodeCore

@Suite("Delivery state machines")
struct DeliveryStateMachineTests {
    static let now: UInt64 = 1_750_000_000_000
    static func offer(kind: ItemKind = .file, size: UInt64 = 10, name: String = "a.bin",
                      expires: UInt64 = now + 60_000) -> ItemOffer {
        ItemOffer(id: UUID(), kind: kind, size: size, sha256: Array(repeating: 1, count: 32),
                  createdMilliseconds: now, expiresMilliseconds: expires, name: name)
    }

    static func receiver(_ limits: DeliveryLimits = DeliveryLimits()) throws -> DeliveryReceiverStateMachine {
        var machine = DeliveryReceiverStateMachine(limits: limits, now: { now })
        #expect(try machine.receive(.hello(version: 2)) == .send(.welcome(version: 2, maxFramePayloadBytes: UInt32(limits.maxFramePayloadBytes))))
        return machine
    }

    /// A sender past its hello and a version 2 receiver's welcome (a maximum of 1024).
    static func welcomedSender() throws -> DeliverySenderStateMachine {
        var machine = DeliverySenderStateMachine()
        #expect(try machine.start() == .hello(version: DeliveryFrame.protocolVersion))
        #expect(try machine.receive(.welcome(version: 2, maxFramePayloadBytes: 1024)) == .welcomed(maxFramePayloadBytes: 1024))
        #expect(!machine.receiverSpeaksProgress)
        return machine
    }

    /// A sender welcomed by a version 3 receiver (a maximum of 1024, a window of 8192).
    static func progressSender() throws -> DeliverySenderStateMachine {
        var machine = DeliverySenderStateMachine()
        _ = try machine.start()
        #expect(try machine.receive(.welcome(version: 3, maxFramePayloadBytes: 1024, progressWindowBytes: 8192))
                == .welcomed(maxFramePayloadBytes: 1024))
        #expect(machine.receiverSpeaksProgress && machine.progressWindowBytes == 8192 && machine.version == 3)
        return machine
    }

    @Test("a receiver announces its progress window: 16 MiB by default, configurable, never below what it may hold unreported")
    func progressWindow() throws {
        var receiver = DeliveryReceiverStateMachine(limits: DeliveryLimits(), now: { Self.now })
        #expect(try receiver.receive(.hello(version: 3))
                == .send(.welcome(version: 3, maxFramePayloadBytes: 65_536, progressWindowBytes: 16 << 20)))
        #expect(DeliveryLimits(progressWindowBytes: 32 << 20).progressWindowBytes == 32 << 20)
        // The floor: two blocks and a frame, twice, whatever was asked (also when a block grows later).
        #expect(DeliveryLimits(progressWindowBytes: 1).progressWindowBytes == 2 * (2 * (1 << 20) + 65_536))
        var large = DeliveryLimits()
        large.blockBytes = 8 << 20
        #expect(large.progressWindowBytes == 2 * (2 * (8 << 20) + 65_536))
    }

    @Test("versions: a receiver answers hello(2) with welcome and its maximum; hello(1) with nothing; a later version with its own")
    func versionNegotiation() throws {
        var limits = DeliveryLimits()
        limits.maxFramePayloadBytes = 1024
        var current = DeliveryReceiverStateMachine(limits: limits, now: { Self.now })
        #expect(try current.receive(.hello(version: 2)) == .send(.welcome(version: 2, maxFramePayloadBytes: 1024)))
        #expect(current.senderHearsErrors)

        var old = DeliveryReceiverStateMachine(limits: limits, now: { Self.now })
        #expect(try old.receive(.hello(version: 1)) == .none)
        #expect(old.state == .idle && old.version == 1 && !old.senderHearsErrors)

        var later = DeliveryReceiverStateMachine(limits: limits, now: { Self.now })
        let window = UInt32(limits.progressWindowBytes)
        #expect(try later.receive(.hello(version: 7)) == .send(.welcome(version: 5, maxFramePayloadBytes: 1024, progressWindowBytes: window,
                                                                         lingerMilliseconds: 30_000)))
        #expect(later.senderHearsProgress)

        var progress = DeliveryReceiverStateMachine(limits: limits, now: { Self.now })
        #expect(try progress.receive(.hello(version: 3)) == .send(.welcome(version: 3, maxFramePayloadBytes: 1024, progressWindowBytes: window)))
        #expect(!current.senderHearsProgress)

        var zero = DeliveryReceiverStateMachine(limits: limits, now: { Self.now })
        #expect(throws: DeliveryProtocolError.unsupportedVersion(0)) { try zero.receive(.hello(version: 0)) }

        // The sender waits for the welcome before offering, and takes the receiver's maximum from it.
        var sender = DeliverySenderStateMachine()
        _ = try sender.start()
        #expect(throws: DeliveryProtocolError.unexpectedFrame(frame: "offer", state: "awaiting the receiver's welcome")) {
            try sender.offer(Self.offer())
        }
        var welcomed = try Self.welcomedSender()
        #expect(welcomed.receiverMaxFramePayloadBytes == 1024 && welcomed.receiverHearsErrors)
        #expect(try welcomed.finish() == .done)

        var tiny = DeliverySenderStateMachine()
        _ = try tiny.start()
        #expect(throws: DeliveryProtocolError.self) { try tiny.receive(.welcome(version: 2, maxFramePayloadBytes: 100)) }
        var wrongVersion = DeliverySenderStateMachine()
        _ = try wrongVersion.start()
        #expect(throws: DeliveryProtocolError.unsupportedVersion(6)) {
            try wrongVersion.receive(.welcome(version: 6, maxFramePayloadBytes: 4096, progressWindowBytes: 1 << 20, lingerMilliseconds: 0))
        }
        var smallWindow = DeliverySenderStateMachine()
        _ = try smallWindow.start()
        #expect(throws: DeliveryProtocolError.self) { try smallWindow.receive(.welcome(version: 3, maxFramePayloadBytes: 4096, progressWindowBytes: 100)) }
    }

    @Test("error frames end the session on either side, with the reason and what was refused")
    func errorFrames() throws {
        let offer = Self.offer(name: "big.bin")
        var sender = try Self.welcomedSender()
        _ = try sender.offer(offer)
        _ = try sender.receive(.answer(id: offer.id, .nothing))
        let reason = "frame payload of 32768 bytes exceeds the limit of 1024"
        #expect(throws: DeliveryProtocolError.peerReported(code: .frameTooLarge, reason: reason, peer: nil, subject: "the file \"big.bin\"")) {
            try sender.receive(.error(code: .frameTooLarge, reason: reason))
        }
        #expect(sender.state == .failed)
        let named = DeliveryProtocolError.peerReported(code: .frameTooLarge, reason: reason, peer: nil, subject: "the file \"big.bin\"")
            .naming(peer: "bob")
        #expect(named.description == "bob refused the file \"big.bin\": frame payload of 32768 bytes exceeds the limit of 1024")

        var idle = try Self.welcomedSender()
        #expect(throws: DeliveryProtocolError.peerReported(code: .internalError, reason: "disk full", peer: nil, subject: nil)) {
            try idle.receive(.error(code: .internalError, reason: "disk full"))
        }

        var receiver = try Self.receiver()
        #expect(throws: DeliveryProtocolError.peerReported(code: .protocolViolation, reason: "x", peer: nil, subject: nil)) {
            try receiver.receive(.error(code: .protocolViolation, reason: "x"))
        }
        #expect(receiver.state == .failed)

        // What each failure reports: its code, and its description as the reason.
        #expect(DeliveryFrame.error(reporting: .frameTooLarge(length: 32768, limit: 1024))
                == .error(code: .frameTooLarge, reason: "frame payload of 32768 bytes exceeds the limit of 1024"))
        #expect(DeliveryFrame.error(reporting: .nameTooLong(length: 300, limit: 255))?.name == "error")
        #expect(DeliveryFrame.error(reporting: .connectionClosed(state: "receiving")) == nil)
        #expect(DeliveryFrame.error(reporting: named) == nil)
        let long = DeliveryProtocolError.malformedFrame(type: "offer", reason: String(repeating: "é", count: 2000))
        if case .error(_, let cut)? = DeliveryFrame.error(reporting: long) {
            #expect(cut.utf8.count <= DeliveryFrame.maximumErrorReasonBytes && cut.utf8.count > 900)
            var encoded = ByteBuffer()
            DeliveryFrame.error(reporting: long)?.encode(into: &encoded)
            #expect(encoded.readableBytes - DeliveryFrame.headerBytes <= DeliveryLimits.minimumFramePayloadBytes)
        } else {
            Issue.record("no error frame for a malformed frame")
        }
    }

    @Test("receiver: a full transfer goes offer → look-up → answer → start → data → verify → commit → ack")
    func receiverHappyPath() throws {
        var machine = try Self.receiver()
        let offer = Self.offer(size: 4)
        #expect(try machine.receive(.offer(offer)) == .lookUp(offer))
        #expect(try machine.lookUpCompleted(.nothing) == .send(.answer(id: offer.id, .nothing)))
        #expect(try machine.receive(.start(id: offer.id, offset: 0)) == .preparePartial(offer, offset: 0))
        let chunk = ByteBuffer(bytes: [1, 2, 3, 4])
        #expect(try machine.receive(.data(chunk)) == .append(chunk))
        #expect(try machine.receive(.end(id: offer.id)) == .verify(offer))
        #expect(try machine.contentVerified(digest: offer.sha256) == .commit(offer))
        #expect(try machine.committed() == .send(.ack(id: offer.id)))
        #expect(try machine.receive(.done) == .finish)
        try machine.streamEnded()
    }

    @Test("receiver: a partial file is proposed and may be resumed at exactly that offset, or restarted at 0")
    func receiverResume() throws {
        var machine = try Self.receiver()
        let offer = Self.offer(size: 10)
        _ = try machine.receive(.offer(offer))
        let digest = Array(repeating: UInt8(9), count: 32)
        #expect(try machine.lookUpCompleted(.partial(length: 6, prefixSHA256: digest))
                == .send(.answer(id: offer.id, .partial(offset: 6, prefixSHA256: digest))))
        #expect(throws: DeliveryProtocolError.invalidOffset(5)) { try machine.receive(.start(id: offer.id, offset: 5)) }

        var again = try Self.receiver()
        _ = try again.receive(.offer(offer))
        _ = try again.lookUpCompleted(.partial(length: 6, prefixSHA256: digest))
        #expect(try again.receive(.start(id: offer.id, offset: 0)) == .preparePartial(offer, offset: 0))
    }

    @Test("receiver: a partial longer than the item is not proposed")
    func receiverOversizedPartial() throws {
        var machine = try Self.receiver()
        let offer = Self.offer(size: 4)
        _ = try machine.receive(.offer(offer))
        #expect(try machine.lookUpCompleted(.partial(length: 9, prefixSHA256: [])) == .send(.answer(id: offer.id, .nothing)))
    }

    @Test("receiver: an item already in the inbox is answered complete without a transfer")
    func receiverComplete() throws {
        var machine = try Self.receiver()
        let offer = Self.offer()
        _ = try machine.receive(.offer(offer))
        #expect(try machine.lookUpCompleted(.complete) == .send(.answer(id: offer.id, .complete)))
        #expect(machine.state == .idle)
    }

    @Test("receiver: refusals for size, names, kind and expiry")
    func receiverRefusals() throws {
        let limits = DeliveryLimits(maxItemBytes: 100, maxTextBytes: 10)
        let cases: [(ItemOffer, ItemRefusal)] = [
            (Self.offer(size: 101), .tooLarge),
            (Self.offer(kind: .text, size: 11, name: ""), .tooLarge),
            (Self.offer(kind: .text, size: 1, name: "x"), .invalidName),
            (Self.offer(name: ""), .invalidName),
            (Self.offer(name: ".."), .invalidName),
            (Self.offer(name: "a/b"), .invalidName),
            (Self.offer(name: "a\u{0}b"), .invalidName),
            (Self.offer(expires: Self.now), .expired),
        ]
        for (offer, reason) in cases {
            var machine = try Self.receiver(limits)
            #expect(try machine.receive(.offer(offer)) == .send(.answer(id: offer.id, .refused(reason))))
            #expect(machine.state == .idle)
        }
    }

    @Test("receiver: a digest mismatch discards the partial and rejects the item")
    func receiverDigestMismatch() throws {
        var machine = try Self.receiver()
        let offer = Self.offer(size: 1)
        _ = try machine.receive(.offer(offer))
        _ = try machine.lookUpCompleted(.nothing)
        _ = try machine.receive(.start(id: offer.id, offset: 0))
        _ = try machine.receive(.data(ByteBuffer(bytes: [0])))
        _ = try machine.receive(.end(id: offer.id))
        #expect(try machine.contentVerified(digest: Array(repeating: 2, count: 32))
                == .discardPartial(offer, then: .reject(id: offer.id, .digestMismatch)))
        #expect(machine.state == .idle)
    }

    @Test("receiver: protocol violations are typed errors and end in the failed state")
    func receiverViolations() throws {
        var noHello = DeliveryReceiverStateMachine(limits: DeliveryLimits(), now: { Self.now })
        #expect(throws: DeliveryProtocolError.unexpectedFrame(frame: "done", state: "awaiting hello")) { try noHello.receive(.done) }
        #expect(noHello.state == .failed)

        var version = DeliveryReceiverStateMachine(limits: DeliveryLimits(), now: { Self.now })
        #expect(throws: DeliveryProtocolError.unsupportedVersion(0)) { try version.receive(.hello(version: 0)) }

        let offer = Self.offer(size: 3)
        var tooMuch = try Self.receiver()
        _ = try tooMuch.receive(.offer(offer))
        _ = try tooMuch.lookUpCompleted(.nothing)
        _ = try tooMuch.receive(.start(id: offer.id, offset: 0))
        #expect(throws: DeliveryProtocolError.sizeMismatch(expected: 3, received: 4)) {
            try tooMuch.receive(.data(ByteBuffer(bytes: [1, 2, 3, 4])))
        }

        var short = try Self.receiver()
        _ = try short.receive(.offer(offer))
        _ = try short.lookUpCompleted(.nothing)
        _ = try short.receive(.start(id: offer.id, offset: 0))
        _ = try short.receive(.data(ByteBuffer(bytes: [1])))
        #expect(throws: DeliveryProtocolError.sizeMismatch(expected: 3, received: 1)) { try short.receive(.end(id: offer.id)) }

        var other = try Self.receiver()
        _ = try other.receive(.offer(offer))
        _ = try other.lookUpCompleted(.nothing)
        let stranger = UUID()
        #expect(throws: DeliveryProtocolError.itemMismatch(expected: offer.id, received: stranger)) {
            try other.receive(.start(id: stranger, offset: 0))
        }

        var dataFirst = try Self.receiver()
        #expect(throws: DeliveryProtocolError.unexpectedFrame(frame: "data", state: "awaiting an offer")) {
            try dataFirst.receive(.data(ByteBuffer(bytes: [1])))
        }

        var closed = try Self.receiver()
        _ = try closed.receive(.offer(offer))
        #expect(throws: DeliveryProtocolError.connectionClosed(state: "looking up an item")) { try closed.streamEnded() }
    }

    @Test("sender: answers lead to delivery, refusal, streaming or a prefix check")
    func senderAnswers() throws {
        let offer = Self.offer(size: 10)
        func offered() throws -> DeliverySenderStateMachine {
            var machine = try Self.welcomedSender()
            #expect(try machine.offer(offer) == .offer(offer))
            return machine
        }
        var complete = try offered()
        #expect(try complete.receive(.answer(id: offer.id, .complete)) == .delivered(offer, alreadyStored: true))
        #expect(try complete.finish() == .done)

        var refused = try offered()
        #expect(try refused.receive(.answer(id: offer.id, .refused(.expired))) == .refused(offer, .expired))

        var fresh = try offered()
        #expect(try fresh.receive(.answer(id: offer.id, .nothing)) == .stream(offer, offset: 0))
        #expect(try fresh.contentSent() == .end(id: offer.id))
        #expect(try fresh.receive(.ack(id: offer.id)) == .delivered(offer, alreadyStored: false))

        let digest = Array(repeating: UInt8(3), count: 32)
        var resumed = try offered()
        #expect(try resumed.receive(.answer(id: offer.id, .partial(offset: 4, prefixSHA256: digest)))
                == .verifyPrefix(offer, offset: 4, digest: digest))
        #expect(try resumed.prefixVerified(matches: true) == .stream(offer, offset: 4))

        var restarted = try offered()
        _ = try restarted.receive(.answer(id: offer.id, .partial(offset: 4, prefixSHA256: digest)))
        #expect(try restarted.prefixVerified(matches: false) == .stream(offer, offset: 0))

        var beyond = try offered()
        #expect(try beyond.receive(.answer(id: offer.id, .partial(offset: 11, prefixSHA256: digest))) == .stream(offer, offset: 0))

        var rejected = try offered()
        _ = try rejected.receive(.answer(id: offer.id, .nothing))
        _ = try rejected.contentSent()
        #expect(try rejected.receive(.reject(id: offer.id, .digestMismatch)) == .rejected(offer, .digestMismatch))
        #expect(rejected.state == .ready)
    }

    @Test("sender: violations are typed errors")
    func senderViolations() throws {
        let offer = Self.offer()
        var machine = DeliverySenderStateMachine()
        #expect(throws: DeliveryProtocolError.unexpectedFrame(frame: "offer", state: "starting")) { try machine.offer(offer) }

        var wrongItem = try Self.welcomedSender()
        _ = try wrongItem.offer(offer)
        let stranger = UUID()
        #expect(throws: DeliveryProtocolError.itemMismatch(expected: offer.id, received: stranger)) {
            try wrongItem.receive(.answer(id: stranger, .complete))
        }

        var earlyAck = try Self.welcomedSender()
        _ = try earlyAck.offer(offer)
        #expect(throws: DeliveryProtocolError.unexpectedFrame(frame: "ack", state: "awaiting an answer")) {
            try earlyAck.receive(.ack(id: offer.id))
        }
        #expect(earlyAck.state == .failed)

        var closed = try Self.welcomedSender()
        #expect(throws: DeliveryProtocolError.connectionClosed(state: "ready to offer")) { try closed.streamEnded() }
    }

    @Test("version 3 receiver: items of a batch are kept until its end (or its limit), then committed together; nothing else may interrupt a batch")
    func receiverBatches() throws {
        var limits = DeliveryLimits()
        limits.maxBatchItems = 3
        var machine = DeliveryReceiverStateMachine(limits: limits, now: { Self.now })
        _ = try machine.receive(.hello(version: 3))
        let texts = (0..<4).map { _ in Self.offer(kind: .text, size: 2, name: "") }
        let expired = Self.offer(kind: .text, size: 2, name: "", expires: Self.now - 1)
        let content = ByteBuffer(string: "hi")
        #expect(try machine.receive(.item(texts[0], content: content, endsBatch: false)) == .batch(.text(texts[0], content: content), commit: false))
        #expect(try machine.receive(.item(expired, content: content, endsBatch: true)) == .batch(.refused(expired, .expired), commit: true))
        #expect(machine.itemsInBatch == 0 && machine.state == .idle)
        // The receiver's limit ends a batch the sender has not ended.
        for index in 1...3 {
            #expect(try machine.receive(.item(texts[index], content: content, endsBatch: false))
                    == .batch(.text(texts[index], content: content), commit: index == 3))
        }
        _ = try machine.receive(.item(texts[0], content: content, endsBatch: false))
        #expect(throws: DeliveryProtocolError.unexpectedFrame(frame: "done", state: "in a batch of items")) { try machine.receive(.done) }

        // A version 2 sender never sends items.
        var older = try Self.receiver()
        #expect(throws: DeliveryProtocolError.self) { try older.receive(.item(texts[0], content: content, endsBatch: true)) }
        #expect(older.progress(written: 1) == nil)
    }

    @Test("version 3 receiver: progress frames report what is written, only during a transfer")
    func receiverProgress() throws {
        var machine = DeliveryReceiverStateMachine(limits: DeliveryLimits(), now: { Self.now })
        _ = try machine.receive(.hello(version: 3))
        let offer = Self.offer(size: 10)
        #expect(machine.progress(written: 0) == nil)
        _ = try machine.receive(.offer(offer))
        _ = try machine.lookUpCompleted(.nothing)
        _ = try machine.receive(.start(id: offer.id, offset: 0))
        _ = try machine.receive(.data(ByteBuffer(bytes: Array(repeating: 1, count: 10))))
        #expect(machine.progress(written: 4) == .progress(id: offer.id, bytes: 4))
        _ = try machine.receive(.end(id: offer.id))
        #expect(machine.progress(written: 10) == .progress(id: offer.id, bytes: 10))
    }

    @Test("version 3 sender: a batch goes as item frames, the last marked; answers come in order")
    func senderBatches() throws {
        var sender = try Self.progressSender()
        let texts = (0..<4).map { _ in Self.offer(kind: .text, size: 2, name: "") }
        let content = ByteBuffer(string: "hi")
        let frames = try sender.offerBatch(texts.map { ($0, content) })
        #expect(frames == texts.indices.map { .item(texts[$0], content: content, endsBatch: $0 == 3) })
        #expect(try sender.receive(.ack(id: texts[0].id)) == .delivered(texts[0], alreadyStored: false))
        #expect(try sender.receive(.answer(id: texts[1].id, .complete)) == .delivered(texts[1], alreadyStored: true))
        #expect(try sender.receive(.answer(id: texts[2].id, .refused(.expired))) == .refused(texts[2], .expired))
        #expect(sender.state == .awaitingBatchAnswers([texts[3]]))
        #expect(try sender.receive(.reject(id: texts[3].id, .invalidText)) == .rejected(texts[3], .invalidText))
        #expect(sender.state == .ready)

        var outOfOrder = try Self.progressSender()
        _ = try outOfOrder.offerBatch(texts.map { ($0, content) })
        #expect(throws: DeliveryProtocolError.itemMismatch(expected: texts[0].id, received: texts[1].id)) {
            try outOfOrder.receive(.ack(id: texts[1].id))
        }
        var partial = try Self.progressSender()
        _ = try partial.offerBatch([(texts[0], content)])
        #expect(throws: DeliveryProtocolError.unexpectedFrame(frame: "answer", state: "awaiting the answers to a batch")) {
            try partial.receive(.answer(id: texts[0].id, .nothing))
        }
        // No batches for a version 2 receiver, and none of files or of content that is not the offer's size.
        var older = try Self.welcomedSender()
        #expect(throws: DeliveryProtocolError.self) { try older.offerBatch([(texts[0], content)]) }
        var file = try Self.progressSender()
        #expect(throws: DeliveryProtocolError.self) { try file.offerBatch([(Self.offer(size: 2), content)]) }
        var short = try Self.progressSender()
        #expect(throws: DeliveryProtocolError.self) { try short.offerBatch([(texts[0], ByteBuffer(string: "h"))]) }
    }

    @Test("version 3 sender: a batch may follow batches not answered yet; all answers come in the order the items went")
    func senderPipelinesBatches() throws {
        var sender = try Self.progressSender()
        let texts = (0..<5).map { _ in Self.offer(kind: .text, size: 2, name: "") }
        let content = ByteBuffer(string: "hi")
        let first = try sender.offerBatch(texts[0..<2].map { ($0, content) })
        let second = try sender.offerBatch(texts[2..<5].map { ($0, content) })
        // Each batch marks its own last item.
        #expect(first.last == .item(texts[1], content: content, endsBatch: true))
        #expect(second == texts[2..<5].indices.map { .item(texts[$0], content: content, endsBatch: $0 == 4) })
        #expect(sender.state == .awaitingBatchAnswers(texts))
        #expect(try sender.receive(.ack(id: texts[0].id)) == .delivered(texts[0], alreadyStored: false))
        // A third batch while answers are still owed goes behind them.
        let sixth = Self.offer(kind: .text, size: 2, name: "")
        _ = try sender.offerBatch([(sixth, content)])
        #expect(sender.state == .awaitingBatchAnswers(Array(texts[1...]) + [sixth]))
        #expect(throws: DeliveryProtocolError.itemMismatch(expected: texts[1].id, received: texts[2].id)) {
            try sender.receive(.ack(id: texts[2].id))
        }
        // Nothing but a batch may go while answers are owed: no offer of a file, no done.
        var owing = try Self.progressSender()
        _ = try owing.offerBatch([(texts[0], content)])
        #expect(throws: DeliveryProtocolError.self) { try owing.offer(Self.offer(size: 10)) }
        #expect(throws: DeliveryProtocolError.self) { try owing.finish() }
    }

    @Test("batches in flight are bounded so that their answers fit in a stream's window")
    func batchesInFlightAreBounded() {
        #expect(DeliveryLimits().batchesInFlight == 4)
        #expect(DeliveryLimits(maxBatchItems: 64, batchesInFlight: 1000).batchesInFlight == DeliveryLimits.maxUnansweredItems / 64)
        #expect(DeliveryLimits(maxBatchItems: 4096, batchesInFlight: 8).batchesInFlight == 1)
        #expect(DeliveryLimits(batchesInFlight: 0).batchesInFlight == 1)
        // An answer is at most an id, a code and a short reason: the worst case still fits the window.
        #expect(DeliveryLimits.maxUnansweredItems * 64 <= 256 * 1024)
    }

    @Test("version 3 sender: progress reports move forward within the item and the transfer; a version 2 receiver sends none")
    func senderProgress() throws {
        let offer = Self.offer(size: 100)
        var sender = try Self.progressSender()
        _ = try sender.offer(offer)
        _ = try sender.receive(.answer(id: offer.id, .nothing))
        #expect(try sender.receive(.progress(id: offer.id, bytes: 40)) == .progressed(offer, bytes: 40))
        #expect(sender.reportedBytes == 40)
        _ = try sender.contentSent()
        #expect(try sender.receive(.progress(id: offer.id, bytes: 100)) == .progressed(offer, bytes: 100))
        #expect(try sender.receive(.ack(id: offer.id)) == .delivered(offer, alreadyStored: false))

        for bad: DeliveryFrame in [.progress(id: offer.id, bytes: 101), .progress(id: offer.id, bytes: 0), .progress(id: UUID(), bytes: 1)] {
            var machine = try Self.progressSender()
            _ = try machine.offer(offer)
            _ = try machine.receive(.answer(id: offer.id, .nothing))
            #expect(throws: DeliveryProtocolError.self) { try machine.receive(bad) }
            #expect(machine.state == .failed)
        }
        var backwards = try Self.progressSender()
        _ = try backwards.offer(offer)
        _ = try backwards.receive(.answer(id: offer.id, .nothing))
        _ = try backwards.receive(.progress(id: offer.id, bytes: 50))
        #expect(throws: DeliveryProtocolError.self) { try backwards.receive(.progress(id: offer.id, bytes: 50)) }

        var older = try Self.welcomedSender()
        _ = try older.offer(offer)
        _ = try older.receive(.answer(id: offer.id, .nothing))
        #expect(throws: DeliveryProtocolError.unexpectedFrame(frame: "progress", state: "streaming")) {
            try older.receive(.progress(id: offer.id, bytes: 1))
        }
    }

    // MARK: Version 4: a temporary refusal

    /// A receiver past `hello(version)` (welcomed) and an offered file of `size` bytes being looked up.
    static func lookingUp(version: UInt8, size: UInt64 = 50 << 20) throws -> (DeliveryReceiverStateMachine, ItemOffer) {
        var machine = DeliveryReceiverStateMachine(limits: DeliveryLimits(), now: { now })
        _ = try machine.receive(.hello(version: version))
        let offer = offer(size: size, name: "big.iso")
        #expect(try machine.receive(.offer(offer)) == .lookUp(offer))
        return (machine, offer)
    }

    @Test("version 5: hello(5) gets welcome(5) with the receiver's linger, within half its idle timeout; a sender reads it")
    func version5Linger() throws {
        var limits = DeliveryLimits(idleTimeout: .seconds(10), lingerInterval: .seconds(30))
        limits.maxFramePayloadBytes = 1024
        let window = UInt32(limits.progressWindowBytes)
        var receiver = DeliveryReceiverStateMachine(limits: limits, now: { Self.now })
        #expect(try receiver.receive(.hello(version: 5)) == .send(.welcome(version: 5, maxFramePayloadBytes: 1024, progressWindowBytes: window,
                                                                            lingerMilliseconds: 5_000)))
        var older = DeliveryReceiverStateMachine(limits: limits, now: { Self.now })
        #expect(try older.receive(.hello(version: 4)) == .send(.welcome(version: 4, maxFramePayloadBytes: 1024, progressWindowBytes: window)))
        var sender = DeliverySenderStateMachine()
        _ = try sender.start()
        _ = try sender.receive(.welcome(version: 5, maxFramePayloadBytes: 1024, progressWindowBytes: 8192, lingerMilliseconds: 2_500))
        #expect(sender.version == 5 && sender.receiverLinger == .milliseconds(2_500))
        var toOlder = DeliverySenderStateMachine()
        _ = try toOlder.start()
        _ = try toOlder.receive(.welcome(version: 4, maxFramePayloadBytes: 1024, progressWindowBytes: 8192))
        #expect(toOlder.version == 4 && toOlder.receiverLinger == nil)
        #expect(DeliveryLimits(idleTimeout: .seconds(60), lingerInterval: .zero).effectiveLinger == .zero)
    }

    @Test("version 4: hello(4) gets welcome(4) with version 3's fields; hello(3) still gets welcome(3)")
    func version4Welcome() throws {
        var limits = DeliveryLimits()
        limits.maxFramePayloadBytes = 1024
        let window = UInt32(limits.progressWindowBytes)
        var current = DeliveryReceiverStateMachine(limits: limits, now: { Self.now })
        #expect(try current.receive(.hello(version: 4)) == .send(.welcome(version: 4, maxFramePayloadBytes: 1024, progressWindowBytes: window)))
        #expect(current.senderHearsTemporaryRefusals && current.senderHearsProgress)
        var older = DeliveryReceiverStateMachine(limits: limits, now: { Self.now })
        #expect(try older.receive(.hello(version: 3)) == .send(.welcome(version: 3, maxFramePayloadBytes: 1024, progressWindowBytes: window)))
        #expect(!older.senderHearsTemporaryRefusals)
        // A sender speaks what it is welcomed with.
        var sender = DeliverySenderStateMachine()
        #expect(try sender.start() == .hello(version: DeliveryFrame.protocolVersion))
        #expect(try sender.receive(.welcome(version: 4, maxFramePayloadBytes: 1024, progressWindowBytes: 8192)) == .welcomed(maxFramePayloadBytes: 1024))
        #expect(sender.version == 4 && sender.receiverSpeaksProgress)
    }

    @Test("version 4 receiver: a file it cannot hold now is refused for now (noSpace) and the session goes on")
    func noSpaceRefusalToVersion4() throws {
        var (machine, offer) = try Self.lookingUp(version: 4)
        #expect(try machine.lookUpCompleted(.noSpace(needed: 82 << 20, free: 24 << 20)) == .send(.answer(id: offer.id, .refused(.noSpace))))
        #expect(machine.state == .idle)
        // The next item of the session is taken as usual.
        let text = Self.offer(kind: .text, size: 19, name: "")
        #expect(try machine.receive(.offer(text)) == .lookUp(text))
        #expect(try machine.lookUpCompleted(.nothing) == .send(.answer(id: text.id, .nothing)))
    }

    @Test("an older sender never hears noSpace: version 3 and 2 get an error frame in words, version 1 only the end of the session")
    func noSpaceToOlderSenders() throws {
        for version: UInt8 in [3, 2, 1] {
            var (machine, offer) = try Self.lookingUp(version: version)
            let expected = DeliveryProtocolError.noSpace(name: "big.iso", size: offer.size, needed: 82 << 20, free: 24 << 20)
            #expect(throws: expected) { try machine.lookUpCompleted(.noSpace(needed: 82 << 20, free: 24 << 20)) }
            #expect(machine.state == .failed)
            #expect(machine.senderHearsErrors == (version >= 2))
        }
        let frame = try #require(DeliveryFrame.error(reporting: .noSpace(name: "big.iso", size: 50 << 20, needed: 82 << 20, free: 24 << 20)))
        #expect(frame == .error(code: .limitExceeded,
                                reason: "not enough space for \"big.iso\" (50.0 MiB): 24.0 MiB free, 82.0 MiB needed; offer it again later"))
    }

    @Test("version 4 sender: noSpace defers the item (pending, offered later) and the session moves on; permanent refusals stay refusals")
    func senderDefersOnNoSpace() throws {
        var sender = DeliverySenderStateMachine()
        _ = try sender.start()
        _ = try sender.receive(.welcome(version: 4, maxFramePayloadBytes: 1024, progressWindowBytes: 8192))
        let file = Self.offer(size: 50 << 20, name: "big.iso")
        _ = try sender.offer(file)
        #expect(try sender.receive(.answer(id: file.id, .refused(.noSpace))) == .deferred(file, .noSpace))
        #expect(sender.state == .ready)
        // The next item goes on in the same session.
        let next = Self.offer(size: 10, name: "b.bin")
        #expect(try sender.offer(next) == .offer(next))
        #expect(try sender.receive(.answer(id: next.id, .refused(.tooLarge))) == .refused(next, .tooLarge))
        // In a batch of texts too.
        let text = Self.offer(kind: .text, size: 2, name: "")
        _ = try sender.offerBatch([(text, ByteBuffer(string: "hi"))])
        #expect(try sender.receive(.answer(id: text.id, .refused(.noSpace))) == .deferred(text, .noSpace))
        #expect(ItemRefusal.noSpace.isTemporary && !ItemRefusal.tooLarge.isTemporary)
    }

    @Test("a version 3 receiver cannot refuse for now: noSpace from it is a protocol violation")
    func noSpaceFromVersion3IsAViolation() throws {
        var sender = try Self.progressSender()
        let file = Self.offer(size: 50 << 20, name: "big.iso")
        _ = try sender.offer(file)
        #expect(throws: DeliveryProtocolError.malformedFrame(type: "answer", reason: "refusal 4 from a version 3 receiver")) {
            try sender.receive(.answer(id: file.id, .refused(.noSpace)))
        }
        #expect(sender.state == .failed)
    }
}
