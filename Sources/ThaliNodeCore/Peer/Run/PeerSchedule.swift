/// The peer's timers as deadlines, with no clock inside: what is armed for when, and what is due at a
/// given instant. The peer's lifetime sleeps until ``nextDeadline`` (one sleeper, not a task per timer)
/// and then hands the instant it woke at to ``takeDue(at:)``; tests hand it any instant they like.
///
/// Generic over the instant so that tests run it on a virtual clock; the peer uses `ContinuousClock`.
struct PeerSchedule<Instant: InstantProtocol & Sendable>: Sendable where Instant.Duration == Duration {
    /// What a deadline is for.
    enum Timer: Hashable, Sendable, CustomStringConvertible {
        /// Serve the next announcement (more contacts than one announcement holds).
        case rotateAnnouncement
        /// Read the store's change stamp; announce anew when the outbox changed or time asks for it.
        case checkStore
        /// A contact's link ends its backoff and tries its routes again (keyed by the contact's public key).
        case linkBackoff(contactKey: String)
        /// The single port, closed for an overload, opens again.
        case reopenPort
        /// An announcement held back by ``PeerConfiguration/minimumAnnouncementInterval`` is due.
        case pacedAnnouncement

        var description: String {
            switch self {
            case .rotateAnnouncement: "rotate-announcement"
            case .checkStore: "check-store"
            case .linkBackoff(let key): "link-backoff(\(key.prefix(16)))"
            case .reopenPort: "reopen-port"
            case .pacedAnnouncement: "paced-announcement"
            }
        }
    }

    private struct Entry: Sendable {
        var deadline: Instant
        /// Arming order: timers due at the same instant fire in the order they were armed.
        var sequence: UInt64
    }

    private var entries: [Timer: Entry] = [:]
    private var armed: UInt64 = 0

    /// No timer armed.
    init() {}

    /// Arms `timer` for `deadline`, replacing its earlier deadline if it was armed.
    mutating func arm(_ timer: Timer, at deadline: Instant) {
        armed &+= 1
        entries[timer] = Entry(deadline: deadline, sequence: armed)
    }

    /// Disarms `timer`; returns whether it was armed.
    @discardableResult
    mutating func disarm(_ timer: Timer) -> Bool {
        entries.removeValue(forKey: timer) != nil
    }

    /// Whether `timer` is armed.
    func isArmed(_ timer: Timer) -> Bool { entries[timer] != nil }

    /// When `timer` is due, if it is armed.
    func deadline(of timer: Timer) -> Instant? { entries[timer]?.deadline }

    /// The earliest deadline armed: when the lifetime must wake next (nil: nothing armed).
    var nextDeadline: Instant? { entries.values.map(\.deadline).min() }

    /// Disarms and returns every timer due at `now` (deadline at or before it), earliest first.
    mutating func takeDue(at now: Instant) -> [Timer] {
        let due = entries.filter { $0.value.deadline <= now }
            .sorted { ($0.value.deadline, $0.value.sequence) < ($1.value.deadline, $1.value.sequence) }
        for (timer, _) in due { entries[timer] = nil }
        return due.map(\.key)
    }

    /// Disarms every timer (the peer stops).
    mutating func disarmAll() { entries.removeAll() }
}
