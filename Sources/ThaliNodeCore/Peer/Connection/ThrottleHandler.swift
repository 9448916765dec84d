import NIOCore

/// Paces outbound bytes to `bytesPerSecond` by holding each write until its slot (a testing and
/// demonstration aid, see ``PeerConfiguration/sendThrottleBytesPerSecond``). Writes keep their order,
/// and an orderly close waits for the writes held before it.
///
/// Once the channel is inactive (the session ended, the peer reset the stream) nothing held can be sent
/// any more: the held writes fail and a waiting close goes through at once. Held until their slots
/// instead, they kept a dead stream's sender (and its one-session-per-contact claim) alive for as long
/// as the queued bytes would have taken, refusing the contact's reconnects meanwhile.
///
/// What is held is bounded by what the sender may have outstanding: the delivery protocol's progress
/// window (``DeliveryLimits``).
final class ThrottleHandler: ChannelDuplexHandler {
    typealias InboundIn = NIOAny
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private struct HeldWrite {
        var data: NIOAny
        var promise: EventLoopPromise<Void>?
        var slot: NIODeadline
    }

    private let bytesPerSecond: Int
    private var nextSlot = NIODeadline.uptimeNanoseconds(0)
    private var held = CircularBuffer<HeldWrite>()
    private var heldClose: (mode: CloseMode, promises: [EventLoopPromise<Void>])?
    private var timer: Scheduled<Void>?

    init(bytesPerSecond: Int) { self.bytesPerSecond = max(1, bytesPerSecond) }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let bytes = unwrapOutboundIn(data).readableBytes
        let now = context.eventLoop.now
        if nextSlot < now { nextSlot = now }
        let slot = nextSlot
        nextSlot = nextSlot + .nanoseconds(Int64(bytes) * 1_000_000_000 / Int64(bytesPerSecond))
        if held.isEmpty && slot <= now {
            context.writeAndFlush(data, promise: promise)
            return
        }
        held.append(HeldWrite(data: data, promise: promise, slot: slot))
        scheduleRelease(context: context)
    }

    func flush(context: ChannelHandlerContext) {
        context.flush()
    }

    func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        guard !held.isEmpty, context.channel.isActive else {
            return context.close(mode: mode, promise: promise)
        }
        // Several closes while writes are held: the first one's mode goes down once they are out.
        if heldClose == nil { heldClose = (mode, []) }
        if let promise { heldClose?.promises.append(promise) }
    }

    func channelInactive(context: ChannelHandlerContext) {
        dropHeld(context: context)
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        dropHeld(context: context)
    }

    /// Sends every held write whose slot has come, then waits for the next one (or closes, if a close
    /// waits and nothing is held any more).
    private func release(context: ChannelHandlerContext) {
        timer = nil
        let now = context.eventLoop.now
        var wrote = false
        while let first = held.first, first.slot <= now {
            held.removeFirst()
            context.write(first.data, promise: first.promise)
            wrote = true
        }
        if wrote { context.flush() }
        if held.isEmpty {
            closeIfWaiting(context: context)
        } else {
            scheduleRelease(context: context)
        }
    }

    private func scheduleRelease(context: ChannelHandlerContext) {
        guard timer == nil, let first = held.first else { return }
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        timer = context.eventLoop.assumeIsolated().scheduleTask(deadline: first.slot) {
            bound.value.0.release(context: bound.value.1)
        }
    }

    /// The channel can no longer send: held writes fail, a waiting close goes through.
    private func dropHeld(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
        while let write = held.popFirst() { write.promise?.fail(ChannelError.ioOnClosedChannel) }
        closeIfWaiting(context: context)
    }

    private func closeIfWaiting(context: ChannelHandlerContext) {
        guard let close = heldClose else { return }
        heldClose = nil
        let promise = close.promises.isEmpty ? nil : context.eventLoop.makePromise(of: Void.self)
        context.close(mode: close.mode, promise: promise)
        for waiting in close.promises { promise?.futureResult.cascade(to: waiting) }
    }
}
