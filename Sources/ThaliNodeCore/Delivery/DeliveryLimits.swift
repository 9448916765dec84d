import NIOCore

/// The bounds the delivery protocol enforces on its peer. Every buffer the protocol keeps is bounded by one
/// of these values; a peer that exceeds one gets a typed error (or a refusal of the item), never a crash
/// or an unbounded allocation.
public struct DeliveryLimits: Sendable, Hashable {
    /// The largest frame payload accepted or sent, in bytes (the 5-byte frame header comes on top).
    /// The decoder rejects a larger length as soon as it reads the header, before buffering the payload.
    /// Default 64 KiB: large enough for efficient data chunks, small enough to bound each read. Values
    /// below ``minimumFramePayloadBytes`` are raised to it (an offer must fit in one frame). A receiver
    /// announces it to a version 2 sender in its `welcome` frame.
    public var maxFramePayloadBytes: Int

    /// The size of the data chunks the sender streams; must be at most `maxFramePayloadBytes`, and is
    /// lowered to the receiver's announced maximum in a session. Default 32 KiB.
    public var chunkBytes: Int

    /// The longest file name (UTF-8 bytes) accepted in an offer. Default 255 (a common file-system limit).
    public var maxNameBytes: Int

    /// The largest item (file) the receiver accepts and the sender queues, in bytes. Larger offers are
    /// refused with ``ItemRefusal/tooLarge``. Default 1 GiB.
    public var maxItemBytes: UInt64

    /// The largest text item, in UTF-8 bytes. Default 64 KiB.
    public var maxTextBytes: UInt64

    /// The size of the blocks content moves in off the event loop: a sender reads its file this much at a
    /// time (sending it as several data frames), a receiver writes and hashes this much at a time while
    /// the next frames arrive, and reports `progress` after each block (version 3). Default 1 MiB:
    /// large enough that a hop to the blocking pool costs little per byte, small enough to bound what
    /// each side holds in memory.
    public var blockBytes: Int

    /// The longest a receiver holds content that arrived before it starts writing it when a block fills
    /// slowly (a slow link): the write, and the `progress` after it, come at least this often while
    /// content arrives. Default 100 ms.
    public var writeInterval: TimeAmount

    /// The most text items a receiver keeps waiting for one group commit (version 3 `item` frames): at
    /// this many it commits and answers them even before the sender marks the end of its batch, and a
    /// sender puts at most this many in a batch. Bounds the receiver's memory (each item is one frame)
    /// and the items an interruption leaves unanswered. Default 64.
    public var maxBatchItems: Int

    /// How long a delivery session may go without reading or writing anything before it is closed, so a
    /// silent or stalled peer cannot hold a session (and its partial file) open forever. Default 60 s.
    public var idleTimeout: TimeAmount

    /// How long a partial file (an interrupted transfer) is kept for resuming. A receiving session first
    /// deletes its contact's partial files untouched for longer, so transfers a sender abandoned (the
    /// item expired or was removed) do not hold disk space forever. Default 7 days.
    public var partialRetention: TimeAmount

    /// Creates limits; every argument defaults to the documented value.
    public init(
        maxFramePayloadBytes: Int = 64 * 1024,
        chunkBytes: Int = 32 * 1024,
        maxNameBytes: Int = 255,
        maxItemBytes: UInt64 = 1 << 30,
        maxTextBytes: UInt64 = 64 * 1024,
        blockBytes: Int = 1 << 20,
        writeInterval: TimeAmount = .milliseconds(100),
        maxBatchItems: Int = 64,
        idleTimeout: TimeAmount = .seconds(60),
        partialRetention: TimeAmount = .hours(24 * 7)
    ) {
        let maxNameBytes = min(max(maxNameBytes, 1), Int(UInt16.max))
        let frame = max(maxFramePayloadBytes, DeliveryLimits.minimumFramePayloadBytes, ItemOffer.fixedBytes + maxNameBytes)
        self.maxFramePayloadBytes = frame
        self.chunkBytes = min(max(chunkBytes, 1), frame)
        self.maxNameBytes = maxNameBytes
        self.maxItemBytes = maxItemBytes
        self.maxTextBytes = maxTextBytes
        self.blockBytes = min(max(blockBytes, 1), 1 << 28)
        self.writeInterval = writeInterval
        self.maxBatchItems = max(maxBatchItems, 1)
        self.idleTimeout = idleTimeout
        self.partialRetention = partialRetention
    }

    /// The progress window a receiver announces in its version 3 `welcome`: twice the most it can hold
    /// unreported while no data arrives (a block being written, one filling, one frame over), so a sender
    /// that sends at most half the window at once never waits for a `progress` that cannot come.
    public var progressWindowBytes: Int { 2 * (2 * blockBytes + maxFramePayloadBytes) }

    /// The smallest accepted `maxFramePayloadBytes`: room for an offer with a 255-byte name. Every
    /// receiver accepts frames this large, and a `welcome` announcing less is a protocol error.
    public static let minimumFramePayloadBytes = 1024

    /// The default limits.
    public static let `default` = DeliveryLimits()
}
