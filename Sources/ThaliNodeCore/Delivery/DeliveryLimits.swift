import NIOCore
import ThaliSupport

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
    /// time (sending it as several data frames), a receiver writes this much at a time (hashing content
    /// as it arrives) while the next frames arrive, and reports `progress` after each block (version 3).
    /// Default 1 MiB:
    /// large enough that a hop to the blocking pool costs little per byte, small enough to bound what
    /// each side holds in memory.
    public var blockBytes: Int

    /// How much a receiver writes to its partial file before it asks the kernel to start writing that
    /// part to the disk (Linux `sync_file_range`, not waiting for the disk): the disk works while the
    /// rest arrives, and the one fsync before the `ack` finds little left. The request runs on the
    /// blocking pool beside the block writes, never before the next one, at most one at a time (one due
    /// while another runs covers both ranges), because it can block while the device's queue is full:
    /// started for every block inside the block's write, it held the next write back at each MiB. A
    /// small value asks often; a large one leaves more for the final fsync. Only for writes through the
    /// page cache: a file written with ``directWrites`` is on the disk already. Clamped to 64 KiB...1 GiB.
    /// Default 8 MiB.
    public var writebackBytes: Int

    /// Whether a receiver writes file content to the disk with direct I/O (`O_DIRECT`, from aligned
    /// memory it reuses) where the file system allows it, instead of through the page cache: a large
    /// file then takes no fresh page of memory per 4 KiB, which on a virtual machine that returns freed
    /// memory to its host cost more CPU than the rest of the delivery. What does not fill a 4 KiB unit,
    /// and a file system that refuses direct I/O, go through the page cache. Durability is the same
    /// either way (the file is synced before its `ack`). Default true.
    public var directWrites: Bool

    /// How many blocks a sender reads ahead of the one it is sending (at least 1): file reads on the
    /// blocking pool overlap the sending, and a read that waits behind other work on the pool (the
    /// receiver's writes, in a node that both sends and receives) does not stall the stream. A sender
    /// holds at most `readAheadBlocks + 1` blocks. Default 2.
    public var readAheadBlocks: Int

    /// How many frames (a data frame counting once per piece a read brought) a delivery channel holds
    /// between the connection and its session: at this many it stops reading the connection, and it
    /// reads again once the session took three quarters of them. With NIO's default (10, reading again
    /// at 2) a receiver streaming a file stopped and restarted its reads every few hundred KiB, each time
    /// a wake-up of both sides' threads (spec/node.md has the measurements). Since it stops reading at
    /// this many, it holds what about this many reads brought (64 KiB each on a socket; a multiplexer
    /// stream's window bounds it too). Clamped to 2...4096. Default 32.
    public var inboundFrames: Int

    /// The progress window a receiver announces in its version 3 `welcome`: the most content a sender
    /// may have sent beyond the receiver's last `progress`. A sender that reaches it waits for a report,
    /// so a window near what the receiver holds unreported (a block being written, one filling) makes
    /// the sender wait for nearly every block, each wait a round trip through both sides' threads; the
    /// bytes in flight are bounded anyway by the transport (socket buffers, stream windows) and by the
    /// receiver's inbound buffer, and progress stays what the receiver wrote. Raised to
    /// ``minimumProgressWindowBytes`` at least (also after `blockBytes` or `maxFramePayloadBytes` change),
    /// at most `UInt32.max`. Default 16 MiB.
    public var progressWindowBytes: Int {
        get { min(max(requestedProgressWindowBytes, minimumProgressWindowBytes), Int(UInt32.max)) }
        set { requestedProgressWindowBytes = newValue }
    }
    private var requestedProgressWindowBytes: Int

    /// The longest a receiver holds content that arrived before it starts writing it when a block fills
    /// slowly (a slow link): the write, and the `progress` after it, come at least this often while
    /// content arrives. Default 100 ms.
    public var writeInterval: Duration

    /// The most text items a receiver keeps waiting for one group commit (version 3 `item` frames): at
    /// this many it commits and answers them even before the sender marks the end of its batch, and a
    /// sender puts at most this many in a batch. Bounds the receiver's memory (each item is one frame)
    /// and the items an interruption leaves unanswered. Default 64.
    public var maxBatchItems: Int

    /// The most batches of texts a sender has written and not yet had answered: it writes the next batch
    /// while the receiver commits and answers the one before, so that texts are not capped at one batch
    /// per round trip on a slow link (64 texts per 120 ms). Bounds what an interruption leaves unanswered
    /// (`batchesInFlight × maxBatchItems` items, offered again next session) and the answers the
    /// receiver's side may queue. 1 waits for each batch's answers, as before. Default 4; at most
    /// ``maxUnansweredItems`` / ``maxBatchItems`` (and at least 1).
    public var batchesInFlight: Int

    /// How long a delivery session may go without reading or writing anything before it is closed, so a
    /// silent or stalled peer cannot hold a session (and its partial file) open forever. Default 60 s.
    public var idleTimeout: Duration

    /// Version 5: how long a session stays open once every item offered on it is answered, so that an
    /// item queued meanwhile for the same contact is offered on it at once instead of through a new
    /// announcement, fetch, match and connection (6-9 round trips). Both sides bound it: the receiver
    /// states its own in `welcome`, and the sender waits the shorter of the two. Each side keeps it
    /// within half its ``idleTimeout`` (``effectiveLinger``), so that the wait never looks idle. Zero:
    /// end with `done` at once, as before version 5. Default 30 s.
    public var lingerInterval: Duration

    /// How long a partial file (an interrupted transfer) is kept for resuming. A receiving session first
    /// deletes its contact's partial files untouched for longer, so transfers a sender abandoned (the
    /// item expired or was removed) do not hold disk space forever. Default 7 days.
    public var partialRetention: Duration

    /// The space a receiver keeps free on the file system of its partial files, in bytes: it takes an
    /// offered file only if the bytes still to come (its size less a usable partial prefix) plus this
    /// many are free now (`statvfs`: blocks available to this user × fragment size), so a file never fills
    /// the disk that also holds the store. Otherwise it refuses the file with ``ItemRefusal/noSpace`` (a
    /// temporary refusal; a sender older than version 4 instead gets `error(limitExceeded)`). Default
    /// 32 MiB.
    public var minimumFreeBytes: UInt64

    /// How long a sender waits after a receiver's first ``ItemRefusal/noSpace`` before it offers that
    /// item again; each further refusal of the same item doubles the wait, up to ``noSpaceRetryCap``,
    /// spread by ±25 % (ThaliSupport's `Backoff`). The item stays pending; until then it is not offered
    /// and does not keep its contact advertised. Default 30 s.
    public var noSpaceRetryBase: Duration

    /// The longest wait between two offers of an item its receiver cannot hold (before jitter). At least
    /// ``noSpaceRetryBase``. Default 30 min.
    public var noSpaceRetryCap: Duration

    /// The waits between offers of an item the receiver refused for space: from ``noSpaceRetryBase``,
    /// doubling, up to ``noSpaceRetryCap``, ±25 %.
    public var noSpaceBackoff: Backoff {
        Backoff(base: noSpaceRetryBase, factor: 2, cap: max(noSpaceRetryCap, noSpaceRetryBase), jitter: 0.25)
    }

    /// Creates limits; every argument defaults to the documented value.
    public init(
        maxFramePayloadBytes: Int = 64 * 1024,
        chunkBytes: Int = 32 * 1024,
        maxNameBytes: Int = 255,
        maxItemBytes: UInt64 = 1 << 30,
        maxTextBytes: UInt64 = 64 * 1024,
        blockBytes: Int = 1 << 20,
        writebackBytes: Int = 8 << 20,
        readAheadBlocks: Int = 2,
        inboundFrames: Int = 32,
        directWrites: Bool = true,
        progressWindowBytes: Int = 16 << 20,
        writeInterval: Duration = .milliseconds(100),
        maxBatchItems: Int = 64,
        batchesInFlight: Int = 4,
        idleTimeout: Duration = .seconds(60),
        lingerInterval: Duration = .seconds(30),
        partialRetention: Duration = .seconds(7 * 24 * 3600),
        minimumFreeBytes: UInt64 = 32 << 20,
        noSpaceRetryBase: Duration = .seconds(30),
        noSpaceRetryCap: Duration = .seconds(30 * 60)
    ) {
        let maxNameBytes = min(max(maxNameBytes, 1), Int(UInt16.max))
        let frame = max(maxFramePayloadBytes, DeliveryLimits.minimumFramePayloadBytes, ItemOffer.fixedBytes + maxNameBytes)
        self.maxFramePayloadBytes = frame
        self.chunkBytes = min(max(chunkBytes, 1), frame)
        self.maxNameBytes = maxNameBytes
        self.maxItemBytes = maxItemBytes
        self.maxTextBytes = maxTextBytes
        self.blockBytes = min(max(blockBytes, 1), 1 << 28)
        self.readAheadBlocks = min(max(readAheadBlocks, 1), 64)
        self.inboundFrames = min(max(inboundFrames, 2), 4096)
        self.directWrites = directWrites
        self.writebackBytes = min(max(writebackBytes, 64 << 10), 1 << 30)
        self.requestedProgressWindowBytes = progressWindowBytes
        self.writeInterval = writeInterval
        self.maxBatchItems = max(maxBatchItems, 1)
        self.batchesInFlight = min(max(batchesInFlight, 1), max(1, DeliveryLimits.maxUnansweredItems / self.maxBatchItems))
        self.idleTimeout = idleTimeout
        self.lingerInterval = max(lingerInterval, .zero)
        self.partialRetention = partialRetention
        self.minimumFreeBytes = minimumFreeBytes
        self.noSpaceRetryBase = max(noSpaceRetryBase, .milliseconds(1))
        self.noSpaceRetryCap = max(noSpaceRetryCap, self.noSpaceRetryBase)
    }

    /// The linger this side keeps: ``lingerInterval``, at most half of ``idleTimeout``, in whole
    /// milliseconds (what a version 5 `welcome` carries).
    public var effectiveLinger: Duration {
        .milliseconds(min(lingerInterval, idleTimeout / 2, .milliseconds(Int64(UInt32.max))).wholeMilliseconds)
    }

    /// The smallest progress window a receiver announces: twice the most it can hold unreported while no
    /// data arrives (a block being written, one filling, one frame over), so a sender that sends at most
    /// half the window at once never waits for a `progress` that cannot come.
    public var minimumProgressWindowBytes: Int { 2 * (2 * blockBytes + maxFramePayloadBytes) }

    /// The smallest accepted `maxFramePayloadBytes`: room for an offer with a 255-byte name. Every
    /// receiver accepts frames this large, and a `welcome` announcing less is a protocol error.
    public static let minimumFramePayloadBytes = 1024

    /// The most texts a sender has written and not yet had answered, across its batches in flight. While
    /// it writes, their answers wait in its stream; this many answers (about 40 bytes each with the
    /// frame's length) fit in a yamux stream's initial window (256 KiB), so the receiver can always write
    /// them and go on reading: the two sides cannot both wait for the other's window.
    public static let maxUnansweredItems = 4096

    /// The default limits.
    public static let `default` = DeliveryLimits()
}
