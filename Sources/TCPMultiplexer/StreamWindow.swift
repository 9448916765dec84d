import NIOCore
import ThaliMutants

/// One yamux stream's flow-control windows, apart from any I/O (in the manner of swift-nio-ssh's
/// `ChildChannelWindowManager` and swift-nio-http2's `InboundWindowManager`).
///
/// The receiver keeps `granted = receiveWindow + buffered` (what the peer may send plus what it sent and
/// the reader has not taken yet) and a `target`. Once the reader has taken at least half the target,
/// it grants `target - granted` in one window update. If that happens within four round trips of the
/// previous update the window is what limits the stream, so the target doubles, up to a cap and a
/// budget the session hands in (its memory bound).
struct StreamWindow: Sendable, Hashable {
    /// Bytes this side may still send before the peer grants more.
    private(set) var sendWindow: Int
    /// Bytes the peer may still send before this side grants more.
    private(set) var receiveWindow: Int
    /// The window this side aims to keep granted; grows by auto-tuning.
    private(set) var receiveWindowTarget: Int
    /// Bytes received and not yet taken by the reader.
    private(set) var buffered = 0
    /// When the last window update was granted (or the stream began).
    private(set) var lastUpdate: NIODeadline

    /// Windows of `initialSize` both ways (yamux fixes it at 256 KiB), starting at `now`.
    init(initialSize: Int = YamuxHeader.initialWindowSize, now: NIODeadline) {
        sendWindow = initialSize
        receiveWindow = initialSize
        receiveWindowTarget = initialSize
        lastUpdate = now
    }

    // MARK: Sending

    /// Takes up to `wanted` bytes of the send window and returns how many may be sent now.
    mutating func reserveSend(upTo wanted: Int) -> Int {
        if Mutant.yamuxSendsPastWindow.isActive { sendWindow = max(sendWindow, wanted + 1) }
        let allowed = max(0, min(wanted, sendWindow))
        sendWindow -= allowed
        return allowed
    }

    /// The peer granted `delta` more bytes. A window beyond 2³²−1 is a protocol error.
    mutating func peerGranted(_ delta: UInt32, streamID: UInt64) throws(MultiplexerError) {
        guard sendWindow + Int(delta) <= Int(UInt32.max) else { throw .sendWindowOverflow(streamID: streamID) }
        sendWindow += Int(delta)
    }

    // MARK: Receiving

    /// Checks that a data frame of `length` bytes the peer announced fits the window it was granted.
    func checkFrame(length: Int, streamID: UInt64) throws(MultiplexerError) {
        guard length <= receiveWindow || Mutant.yamuxIgnoresReceiveWindow.isActive else {
            throw .receiveWindowExceeded(streamID: streamID, window: receiveWindow, length: length)
        }
    }

    /// The peer's data frame of `length` bytes (checked with ``checkFrame(length:streamID:)``) uses up window.
    mutating func receiveFrame(length: Int) {
        receiveWindow -= length
    }

    /// Payload bytes of an announced frame arrived and wait for the reader.
    mutating func buffer(_ bytes: Int) {
        buffered += bytes
    }

    /// The reader took `bytes`.
    mutating func consumed(_ bytes: Int) {
        buffered -= bytes
    }

    /// A window update due to the peer.
    struct Grant: Sendable, Hashable {
        /// The window update to send.
        var delta: UInt32
        /// How many bytes auto-tuning added to the target (0 if it did not grow).
        var growth: Int
    }

    /// The window update to send now, or `nil` while less than half the target is outstanding. The
    /// target may grow (doubling, at most to `maxWindow`) by at most `growthBudget` bytes, and only when
    /// the previous update was less than four round trips ago.
    mutating func grant(now: NIODeadline, roundTripTime: TimeAmount?, maxWindow: Int, growthBudget: Int) -> Grant? {
        let granted = receiveWindow + buffered
        guard receiveWindowTarget - granted >= receiveWindowTarget / 2 else { return nil }
        var growth = 0
        if let roundTripTime, now - lastUpdate < roundTripTime * 4, receiveWindowTarget < maxWindow {
            let grown = min(receiveWindowTarget * 2, maxWindow, Int(UInt32.max))
            if grown - receiveWindowTarget <= growthBudget {
                growth = grown - receiveWindowTarget
                receiveWindowTarget = grown
            }
        }
        lastUpdate = now
        let delta = receiveWindowTarget - granted
        receiveWindow += delta
        return Grant(delta: UInt32(delta), growth: growth)
    }
}
