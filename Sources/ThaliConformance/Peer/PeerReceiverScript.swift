import Crypto
import Foundation
import NIOCore
import ThaliNodeCore

/// The receiver side of the delivery protocol as a script that grades the sender frame by frame. It
/// answers `nothing` to every offer (or `tooLarge` above the bound), acknowledges intact items and, in
/// version 3, reports progress only when the sender stops, so that a sender streaming past the window
/// it was given is seen doing so.
struct ReceiverScript {
    /// What the script does after a frame: the frames to answer with, and whether the session is over.
    struct Step {
        var replies: [DeliveryFrame] = []
        var finished = false
        /// Version 3, an item's content is unreported: report it once the sender stops (``quiet()``).
        var awaitsProgress = false
    }

    let queuedIDs: [UUID]
    let maxItemBytes: UInt64
    let skew: UInt64
    /// The version our welcome offers a sender of version 3 or later: its own (at most
    /// ``DeliveryFrame/protocolVersion``), or 2 to see it fall back.
    let welcomeVersion: UInt8
    private var sawHello = false
    /// The version both speak after our welcome (nil before it, 1 for a version 1 sender).
    private(set) var version: UInt8?
    /// The frame maximum our welcome announced (nil: a version 1 sender, no welcome), and the largest
    /// data frame seen.
    private var announced: Int?
    private var largestData = 0
    private var frameMaximumFailed = false
    /// What our welcome announces: the smallest maximum a receiver may announce, so a sender that keeps
    /// within it keeps within any.
    static let announcedFrameMaximum = DeliveryLimits.minimumFramePayloadBytes
    /// The progress window our version 3 welcome announces: small, so that an item of a few KiB has to
    /// wait for our reports, and yet 4 times the frame maximum, so that the half of it a sender may send
    /// at once is more than one frame and the frame-maximum case still bites.
    static let announcedWindow = 8 * DeliveryLimits.minimumFramePayloadBytes
    /// The most `item` frames we keep before answering them without the flag (a receiver's own
    /// `maxBatchItems`; ours is the node's default).
    static let maxBatchItems = DeliveryLimits().maxBatchItems
    private var offers: [ItemOffer] = []
    private var current: (offer: ItemOffer, hasher: SHA256, received: UInt64)?
    /// Content of the current item received beyond our last `progress`, the most of it seen at once,
    /// and how often the sender stopped and waited for a report.
    private var unreported = 0
    private var mostUnreported = 0
    private var stalls = 0
    /// Whether the window case has its verdict (a failure as it happens, a pass at the first item larger
    /// than the window).
    private var windowGraded = false
    private var transferred = 0
    /// The batch of `item` frames being received: each offer and whether its content is intact.
    private var batch: [(offer: ItemOffer, intact: Bool)] = []
    private(set) var itemFrames = 0
    private var batchGraded = false
    /// A text small enough for an `item` frame that came by `offer` in version 3.
    private var fittingTextOffered: ItemOffer?
    private(set) var finished = false
    private let started = NIODeadline.now()

    init(queuedIDs: [UUID], maxItemBytes: UInt64, skew: UInt64, welcomeVersion: UInt8 = DeliveryFrame.protocolVersion) {
        self.queuedIDs = queuedIDs
        self.maxItemBytes = maxItemBytes
        self.skew = skew
        self.welcomeVersion = welcomeVersion
    }

    typealias Cases = PeerConformance.Cases

    /// The ids of the items it offered, by `offer` or in `item` frames.
    var offeredIDs: [UUID] { offers.map(\.id) }

    private var speaksProgress: Bool { (version ?? 0) >= DeliveryFrame.progressVersion }

    /// Handles one frame.
    mutating func handle(_ frame: DeliveryFrame, _ run: ConformanceRun) -> Step {
        if !sawHello { return hello(frame, run) }
        if !batch.isEmpty {
            guard case .item = frame else {
                return fail(Cases.itemBatch, expected: "only item frames until the flagged one", actual: "\(frame.name) inside a batch", run)
            }
        }
        switch frame {
        case .offer(let offer):
            guard current == nil else { return fail(Cases.transfer, expected: "start, data or end", actual: "offer", run) }
            offers.append(offer)
            let problems = Self.problems(of: offer, skew: skew)
            if offers.count == 1 || !problems.isEmpty {
                run.grade(Cases.offer, holds: problems.isEmpty, expected: "a well-formed offer with created < expires in Unix ms",
                          actual: problems.isEmpty ? "\(offer.kind) of \(offer.size) bytes" : problems.joined(separator: "; "))
            }
            if speaksProgress, offer.kind == .text, fittingTextOffered == nil,
               DeliveryFrame.headerBytes + 1 + ItemOffer.fixedBytes + Int(clamping: offer.size) <= announced ?? 0 {
                fittingTextOffered = offer
            }
            if offer.size > maxItemBytes { return Step(replies: [.answer(id: offer.id, .refused(.tooLarge))]) }
            current = (offer, SHA256(), 0)
            unreported = 0
            return Step(replies: [.answer(id: offer.id, .nothing)])
        case .start(let id, let offset):
            guard let current, current.offer.id == id, offset == 0 else {
                return fail(Cases.transfer, expected: "start(\(self.current?.offer.id.uuidString ?? "?"), 0)", actual: "start(\(id), \(offset))", run)
            }
            return Step()
        case .data(let buffer):
            return data(buffer, run)
        case .end(let id):
            return end(id, run)
        case .item(let offer, let content, let endsBatch):
            return item(offer, content, endsBatch: endsBatch, run)
        case .done:
            return done(run)
        default:
            return fail(Cases.transfer, expected: "a sender frame", actual: frame.name, run)
        }
    }

    /// The sender has sent nothing for the quiet period: the progress report it may be waiting for.
    mutating func quiet() -> DeliveryFrame? {
        guard speaksProgress, let item = current, unreported > 0 else { return nil }
        stalls += 1
        unreported = 0
        return .progress(id: item.offer.id, bytes: item.received)
    }

    private mutating func hello(_ frame: DeliveryFrame, _ run: ConformanceRun) -> Step {
        sawHello = true
        run.record(Cases.openStream, .pass, expected: Cases.openStream.title, actual: "stream accepted, first frame \(frame.name)", started: started)
        guard case .hello(let version) = frame else {
            return fail(Cases.hello, expected: "hello", actual: frame.name, run)
        }
        let expected = "hello(\(DeliveryFrame.progressVersion) or later)"
        switch version {
        case DeliveryFrame.progressVersion...:
            run.record(Cases.hello, .pass, expected: expected, actual: "hello(\(version))")
            return welcome(min(version, welcomeVersion))
        case probeDeliveryVersion2:
            // An older sender, still served: its version 3 rules do not apply.
            run.record(Cases.hello, .warn, expected: expected, actual: "hello(2): a version 2 sender")
            olderSender(version, run)
            return welcome(probeDeliveryVersion2)
        case DeliveryFrame.oldestAcceptedVersion:
            // Still accepted by receivers, but it cannot learn our frame maximum or hear our errors.
            run.record(Cases.hello, .warn, expected: expected, actual: "hello(1): a version 1 sender")
            run.record(Cases.frameMaximum, .notApplicable, expected: Cases.frameMaximum.title, actual: "a version 1 sender gets no welcome")
            olderSender(version, run)
            self.version = version
            return Step()
        default:
            run.record(Cases.hello, .fail, expected: expected, actual: "hello(\(version))")
            finished = true
            return Step(finished: true)
        }
    }

    /// A sender older than version 3: the version 3 cases do not apply to it.
    private mutating func olderSender(_ version: UInt8, _ run: ConformanceRun) {
        windowGraded = true
        batchGraded = true
        for testCase in [Cases.window, Cases.itemBatch] {
            run.record(testCase, .notApplicable, expected: testCase.title, actual: "a version \(version) sender")
        }
    }

    private mutating func welcome(_ version: UInt8) -> Step {
        self.version = version
        announced = Self.announcedFrameMaximum
        let window = version >= DeliveryFrame.progressVersion ? UInt32(Self.announcedWindow) : nil
        // Version 5: we do not wait for more items once everything is answered (linger 0), so a
        // sender that honours it sends `done` at once and each case grades one session.
        let linger: UInt32? = version >= DeliveryFrame.lingerVersion ? 0 : nil
        return Step(replies: [.welcome(version: version, maxFramePayloadBytes: UInt32(Self.announcedFrameMaximum),
                                       progressWindowBytes: window, lingerMilliseconds: linger)])
    }

    /// What is wrong with an offer's fields (created before expires, Unix milliseconds, a text unnamed).
    static func problems(of offer: ItemOffer, skew: UInt64) -> [String] {
        let now = DeliveryClock.nowMilliseconds
        var problems: [String] = []
        if offer.expiresMilliseconds <= offer.createdMilliseconds { problems.append("expires not after created") }
        if offer.createdMilliseconds > now + skew { problems.append("created \(offer.createdMilliseconds - now) ms in the future") }
        // Before 2001-09-09 (1e12 ms): a count of seconds, or another epoch, not Unix milliseconds.
        if offer.createdMilliseconds < 1_000_000_000_000 { problems.append("created \(offer.createdMilliseconds) is not Unix milliseconds") }
        if offer.kind == .text && !offer.name.isEmpty { problems.append("a text with a name") }
        return problems
    }

    private mutating func data(_ buffer: ByteBuffer, _ run: ConformanceRun) -> Step {
        guard var item = current else { return fail(Cases.transfer, expected: "data after start", actual: "data", run) }
        item.received += UInt64(buffer.readableBytes)
        guard item.received <= item.offer.size else {
            return fail(Cases.transfer, expected: "\(item.offer.size) bytes", actual: "more than \(item.offer.size) bytes", run)
        }
        buffer.withUnsafeReadableBytes { item.hasher.update(bufferPointer: $0) }
        current = item
        largestData = max(largestData, buffer.readableBytes)
        if let announced, buffer.readableBytes > announced, !frameMaximumFailed {
            frameMaximumFailed = true
            run.record(Cases.frameMaximum, .fail, expected: "data frames of at most \(announced) bytes",
                       actual: "a data frame of \(buffer.readableBytes) bytes")
        }
        guard speaksProgress else { return Step() }
        unreported += buffer.readableBytes
        mostUnreported = max(mostUnreported, unreported)
        if unreported > Self.announcedWindow, !windowGraded {
            windowGraded = true
            run.record(Cases.window, .fail, expected: "at most \(Self.announcedWindow) bytes beyond our last progress",
                       actual: "\(unreported) bytes beyond it (\(item.received) of \(item.offer.size) sent, \(stalls) report(s) so far)")
        }
        return Step(awaitsProgress: true)
    }

    private mutating func end(_ id: UUID, _ run: ConformanceRun) -> Step {
        guard let item = current, item.offer.id == id else { return fail(Cases.transfer, expected: "end of the current item", actual: "end(\(id))", run) }
        current = nil
        let digest = Array(item.hasher.finalize())
        let intact = item.received == item.offer.size && digest == item.offer.sha256
        transferred += 1
        if transferred == 1, let announced, !frameMaximumFailed {
            run.record(Cases.frameMaximum, .pass, expected: "data frames of at most \(announced) bytes",
                       actual: "largest data frame \(largestData) bytes, item of \(item.offer.size)")
        }
        if transferred == 1 || !intact {
            run.grade(Cases.transfer, holds: intact, expected: "\(item.offer.size) bytes with the offered SHA-256",
                      actual: "\(item.received) bytes, digest \(digest == item.offer.sha256 ? "matches" : "differs")")
        }
        var replies: [DeliveryFrame] = []
        if speaksProgress {
            gradeWindow(item.offer, run)
            // A version 3 receiver reports what it wrote before it acknowledges (everything, at the end).
            if unreported > 0 { replies.append(.progress(id: id, bytes: item.received)) }
            unreported = 0
        }
        replies.append(intact ? .ack(id: id) : .reject(id: id, .digestMismatch))
        return Step(replies: replies)
    }

    /// Grades the window at the end of the first item larger than it (a smaller one cannot overrun it).
    private mutating func gradeWindow(_ offer: ItemOffer, _ run: ConformanceRun) {
        guard !windowGraded, offer.size > UInt64(Self.announcedWindow) else { return }
        windowGraded = true
        run.record(Cases.window, .pass, expected: "at most \(Self.announcedWindow) bytes beyond our last progress",
                   actual: "at most \(mostUnreported) bytes beyond it; it waited for \(stalls) report(s) in \(offer.size) bytes")
    }

    private mutating func item(_ offer: ItemOffer, _ content: ByteBuffer, endsBatch: Bool, _ run: ConformanceRun) -> Step {
        guard speaksProgress else {
            return fail(Cases.itemBatch, expected: "no item frames in version \(version ?? 0)", actual: "an item frame", run)
        }
        guard current == nil else { return fail(Cases.transfer, expected: "start, data or end", actual: "item", run) }
        itemFrames += 1
        offers.append(offer)
        var problems = Self.problems(of: offer, skew: skew)
        if offer.kind != .text { problems.append("kind \(offer.kind), not text") }
        let digest = content.withUnsafeReadableBytes { Array(SHA256.hash(data: $0)) }
        if UInt64(content.readableBytes) != offer.size { problems.append("\(content.readableBytes) content bytes for size \(offer.size)") }
        let intact = problems.isEmpty && digest == offer.sha256
        if problems.isEmpty && !intact { problems.append("content misses its SHA-256") }
        batch.append((offer, intact))
        if !problems.isEmpty {
            batchGraded = true
            return fail(Cases.itemBatch, expected: "intact texts as item frames", actual: problems.joined(separator: "; "), run)
        }
        guard endsBatch || batch.count >= Self.maxBatchItems else { return Step() }
        if !batchGraded {
            batchGraded = true
            run.record(Cases.itemBatch, .pass, expected: Cases.itemBatch.title,
                       actual: "a batch of \(batch.count) item(s), the last \(endsBatch ? "flagged" : "at our maximum of \(Self.maxBatchItems)")")
        }
        let replies: [DeliveryFrame] = batch.map { $0.intact ? .ack(id: $0.offer.id) : .reject(id: $0.offer.id, .digestMismatch) }
        batch = []
        return Step(replies: replies)
    }

    private mutating func done(_ run: ConformanceRun) -> Step {
        guard current == nil else { return fail(Cases.done, expected: "end before done", actual: "done mid-item", run) }
        var problems: [String] = []
        let missing = queuedIDs.filter { !offeredIDs.contains($0) }
        if !missing.isEmpty { problems.append("\(missing.count) item(s) queued through the adapter were not offered") }
        if offers.isEmpty { problems.append("nothing was offered") }
        run.grade(Cases.done, holds: problems.isEmpty, expected: "done after every queued item",
                  actual: problems.isEmpty ? "done after \(offers.count) item(s)" : problems.joined(separator: "; "))
        if speaksProgress && !batchGraded {
            batchGraded = true
            if let text = fittingTextOffered {
                run.record(Cases.itemBatch, .fail, expected: "a text that fits our frame maximum sent whole, as an item frame",
                           actual: "a text of \(text.size) bytes came by offer")
            } else {
                run.record(Cases.itemBatch, .inconclusive, expected: Cases.itemBatch.title, actual: "no text small enough for an item frame was queued")
            }
        }
        if speaksProgress && !windowGraded {
            run.record(Cases.window, .inconclusive, expected: Cases.window.title,
                       actual: "no item larger than the \(Self.announcedWindow)-byte window was sent")
        }
        finished = true
        return Step(finished: true)
    }

    /// The phases of a sender's stream in the order they happen; the other receiver cases are rules
    /// checked along the way.
    static let phases = [Cases.openStream, Cases.hello, Cases.offer, Cases.transfer, Cases.done]

    /// The stream ended (or failed) before `done`: the phase under way fails with `reason` (before any
    /// frame: the stream was not served; mid-item: the transfer; else `done` never came), and every case
    /// not graded yet is INCONCLUSIVE, naming it.
    mutating func ended(by reason: String, _ run: ConformanceRun) {
        guard !finished else { return }
        finished = true
        let phase = current != nil ? Cases.transfer : Self.phases.first { run.verdict(of: $0) == nil }
        guard let phase else { return }
        let before: String = switch phase {
        case _ where current != nil: "mid-item"
        case Cases.openStream: "before its first frame"
        case Cases.hello: "before hello"
        case Cases.offer: "before an offer"
        default: "before done"
        }
        run.record(phase, .fail, expected: phase.title, actual: "\(reason) \(before)")
        run.recordDependents(Cases.receiverRole, on: phase)
    }

    /// A rule broke at `testCase`: it fails, the stream is over, and every case not graded yet is
    /// INCONCLUSIVE, naming it.
    private mutating func fail(_ testCase: ConformanceCase, expected: String, actual: String, _ run: ConformanceRun) -> Step {
        run.record(testCase, .fail, expected: expected, actual: actual)
        run.recordDependents(Cases.receiverRole, on: testCase)
        finished = true
        return Step(finished: true)
    }
}

/// Version 2 of the delivery protocol, which the suite still speaks with an older peer and offers a
/// newer one on purpose, to see it fall back (a version 3 receiver welcomes a `hello(2)` with 2; a version
/// 3 sender welcomed with 2 speaks 2).
let probeDeliveryVersion2: UInt8 = 2
