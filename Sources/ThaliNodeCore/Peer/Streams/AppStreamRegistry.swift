import Foundation

/// What the peer knows about app streams, as a value with transitions: the marked sessions up now with
/// each contact (where ``ThaliPeer/openStream(to:protocol:timeout:)`` opens streams), the opens waiting
/// for one, the app's handler of each protocol, and whether the app uses streams at all. The peer keeps
/// one inside its locked state and acts on what each transition returns (wakes, finishes); nothing
/// here does I/O.
///
/// Generic over the session, the waiter's wake and the handler so that it is tested with plain values.
struct AppStreamRegistry<Session, Wake, Handler> {
    /// A marked session with a contact, in the order they came up.
    struct Entry {
        let id: ObjectIdentifier
        let session: Session
    }

    /// Marked sessions up now, by contact public key, oldest first.
    private(set) var sessions: [String: [Entry]] = [:]
    /// Opens waiting for a session, with their contact's key.
    private var waiters: [UUID: (contactKey: String, wake: Wake)] = [:]
    /// The app's handler of each protocol.
    private(set) var handlers: [String: Handler] = [:]
    /// Whether the app uses streams: every contact is advertised to and sessions stay open.
    private(set) var streamsWanted = false

    // MARK: Sessions

    /// A marked session with the contact of `contactKey` came up (again: it moves to the newest). Returns
    /// the wakes of the opens waiting for one with that contact.
    mutating func sessionUp(_ id: ObjectIdentifier, _ session: Session, contactKey: String) -> [Wake] {
        sessions[contactKey, default: []].removeAll { $0.id == id }
        sessions[contactKey, default: []].append(Entry(id: id, session: session))
        return waiters.values.filter { $0.contactKey == contactKey }.map(\.wake)
    }

    /// Takes a session out of the ones streams are opened on: it closed, answered GoAway, or is closing
    /// after its delivery. Idempotent.
    mutating func forgetSession(_ id: ObjectIdentifier, contactKey: String) {
        sessions[contactKey]?.removeAll { $0.id == id }
        if sessions[contactKey]?.isEmpty == true { sessions.removeValue(forKey: contactKey) }
    }

    /// The session a new stream to the contact goes over: the newest, as an older one is the likelier to
    /// be on its way out.
    func session(for contactKey: String) -> Entry? { sessions[contactKey]?.last }

    /// After a delivery over a marked session ends: whether the session stays open (`keep`: the node
    /// relays, or the app uses streams); otherwise it leaves the ones streams are opened on in this same
    /// step, so that no stream is opened on it as it closes.
    mutating func keepsAfterDelivery(_ id: ObjectIdentifier, contactKey: String, marked: Bool, relaying: Bool) -> Bool {
        if marked && (relaying || streamsWanted) { return true }
        forgetSession(id, contactKey: contactKey)
        return false
    }

    // MARK: Waiting opens

    mutating func addWaiter(_ id: UUID, contactKey: String, wake: Wake) {
        waiters[id] = (contactKey, wake)
    }

    mutating func removeWaiter(_ id: UUID) {
        waiters.removeValue(forKey: id)
    }

    var waiterCount: Int { waiters.count }

    // MARK: Handlers

    /// Why a handler cannot be added.
    enum HandlerRefusal: Equatable {
        case alreadyHandled
    }

    /// The app handles `name` with `handler`, unless another handler has it.
    mutating func addHandler(_ handler: Handler, for name: String) -> HandlerRefusal? {
        guard handlers[name] == nil else { return .alreadyHandled }
        handlers[name] = handler
        return nil
    }

    mutating func removeHandler(for name: String) {
        handlers.removeValue(forKey: name)
    }

    /// Every handler, taken out (the peer stops and finishes them).
    mutating func takeHandlers() -> [Handler] {
        defer { handlers.removeAll() }
        return Array(handlers.values)
    }

    // MARK: Use

    /// The app uses streams. Returns whether this is the first time (the advertisement must then widen
    /// to every contact).
    mutating func wantStreams() -> Bool {
        defer { streamsWanted = true }
        return !streamsWanted
    }
}

extension AppStreamRegistry: Sendable where Session: Sendable, Wake: Sendable, Handler: Sendable {}
extension AppStreamRegistry.Entry: Sendable where Session: Sendable {}
