import NIOConcurrencyHelpers
import NIOCore

/// A buffer passed between a delivery session and the blocking pool so that whoever takes it holds it
/// alone. A block buffer is reused only when nothing else references its memory (`ByteBuffer.clear`
/// allocates otherwise); a buffer captured by a job's closure stays referenced by the closure, so it
/// goes through a handoff instead, which gives its one reference to the first `take()`.
final class BufferHandoff: Sendable {
    private let slot: NIOLockedValueBox<ByteBuffer?>

    /// A handoff holding `buffer` (or nothing).
    init(_ buffer: ByteBuffer? = nil) {
        slot = NIOLockedValueBox(buffer)
    }

    /// The buffer held, leaving the handoff empty; nil if it is empty.
    func take() -> ByteBuffer? {
        slot.withLockedValue { held in
            defer { held = nil }
            return held
        }
    }

    /// Holds `buffer` (replacing what it held).
    func put(_ buffer: ByteBuffer) {
        slot.withLockedValue { $0 = buffer }
    }
}
