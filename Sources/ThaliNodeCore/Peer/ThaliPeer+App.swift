import Foundation
import NIOPosix
import ServiceLifecycle

/// The peer as an app holds it: a swift-service-lifecycle `Service`, a stream of events, and async
/// methods to queue items and read the inbox. They run the store's blocking work on a thread pool, so an
/// app may call them from any task.
extension ThaliPeer: Service {
    /// Starts the peer, keeps it running until graceful shutdown (`ServiceGroup`'s signals, or
    /// `triggerGracefulShutdown()`) or cancellation, then stops it: byebye, connections closed, tasks ended.
    /// Throws what ``start()`` throws; a peer that failed to start is stopped before the error returns
    /// (one that was started or stopped already is left as it is).
    public func run() async throws {
        do {
            try await start()
        } catch let error as StartError where error == .alreadyStarted || error == .stopped {
            throw error
        } catch {
            await stop()
            throw error
        }
        // Returns on graceful shutdown; throws CancellationError when the task is cancelled. Both end the peer.
        try? await gracefulShutdown()
        await stop()
    }
}

extension ThaliPeer {
    /// This node's public key as its contacts add it (compressed SEC1, lowercase hex).
    public var publicKey: String { identity.publicKey.hexString(compressed: true) }

    /// The default number of unread events an ``events(bufferingNewest:)`` stream keeps.
    public static let defaultEventBuffer = 1024

    /// A stream of everything the peer does from now on (``PeerEvent``); it ends after
    /// ``PeerEvent/stopped``. Subscribe before ``start()`` to see ``PeerEvent/started(location:)``. A
    /// subscriber that reads too slowly loses its oldest unread events beyond `limit`, never slows the peer.
    /// Several subscribers may follow one peer.
    public func events(bufferingNewest limit: Int = ThaliPeer.defaultEventBuffer) -> AsyncStream<PeerEvent> {
        broadcaster.subscribe(bufferingNewest: limit)
    }

    /// Adds a contact (validated as ``NodeStore/addContact(name:publicKey:ownKey:now:)`` does) and
    /// teaches the running peer its key at once.
    @discardableResult
    public func addContact(name: String, publicKey: String) async throws -> Contact {
        let contact = try await blocking { [store, identity] in
            try store.addContact(name: name, publicKey: publicKey, ownKey: identity.publicKey)
        }
        try await refreshAddressBook()
        return contact
    }

    /// Tells the peer that its store changed outside it, as when another process queued or removed an
    /// item (`thali-node send` beside a running `run` nudges it through ``NodeEventFeed``): the peer reads
    /// the store's change stamp now rather than at its next outbox poll
    /// (``PeerConfiguration/outboxPollInterval``). Cheap, and nothing happens when the store did not
    /// change. A read already under way is left to finish, and another follows it at once.
    public func storeChanged() {
        let now = ContinuousClock.now
        let moved = state.withLockedValue { state -> Bool in
            guard !state.stopped else { return false }
            guard let due = state.schedule.deadline(of: .checkStore) else {
                // Not armed: a check runs now (it re-arms when it ends).
                state.storeChangedDuringCheck = true
                return false
            }
            guard due > now else { return false }
            state.schedule.arm(.checkStore, at: now)
            return true
        }
        if moved { lifetime.wake(at: now) }
    }

    /// Queues `text` for the contact named `contact`, to be dropped if not delivered within `expiresIn`,
    /// and, when the peer runs, asks for its announcement at once: returns once the item is stored, while
    /// the announcement (an ECDH per advertised contact) is made on the peer's own tasks.
    @discardableResult
    public func send(text: String, to contact: String, expiresIn: Duration = .seconds(86_400)) async throws -> OutboxItem {
        let item = try await blocking { [store] in
            try store.enqueueText(text, to: contact, expiresAt: Date().addingTimeInterval(expiresIn.timeInterval))
        }
        wakeDeliverySenders(for: item)
        announceIfRunning()
        return item
    }

    /// Queues a copy of the file at `path` (a regular file, or with `name` an inherited pipe) for the contact named `contact`, delivered under
    /// `name` (default: the file's own name; see ``NodeStore/enqueueFile(at:to:name:expiresAt:id:now:progress:)``),
    /// and asks for its announcement at once when the peer runs (made after this returns, as for a text).
    @discardableResult
    public func send(fileAt path: String, to contact: String, name: String? = nil,
                     expiresIn: Duration = .seconds(86_400)) async throws -> OutboxItem {
        let item = try await blocking { [store] in
            try store.enqueueFile(at: path, to: contact, name: name, expiresAt: Date().addingTimeInterval(expiresIn.timeInterval))
        }
        wakeDeliverySenders(for: item)
        announceIfRunning()
        return item
    }

    /// What the node received, oldest first.
    public func inbox() async throws -> [InboxItem] {
        try await blocking { [store] in try store.inbox() }
    }

    /// What waits for delivery, oldest first.
    public func outbox() async throws -> [OutboxItem] {
        try await blocking { [store] in try store.outbox() }
    }

    /// Asks for a new announcement without waiting for it. With 300 contacts an announcement takes about
    /// 100 ms of ECDH: a caller of `send` waited that long, and sends at once each made their own. Now one
    /// refresh runs at a time on the peer's lifetime, and the sends during it share the one after it.
    func announceIfRunning() {
        guard !bindings.isEmpty, !isStopped else { return }
        let startsOne = state.withLockedValue { state -> Bool in
            guard !state.advertisementRefreshRunning else {
                state.advertisementRefreshWanted = true
                return false
            }
            state.advertisementRefreshRunning = true
            return true
        }
        guard startsOne else { return }
        let started = lifetime.run { [self] in
            repeat {
                do {
                    try await refreshAdvertisement()
                } catch is CancellationError {
                    // The peer is stopping.
                } catch {
                    logger.error("announcing a new item failed", metadata: ["error": "\(error)"])
                }
            } while state.withLockedValue { state -> Bool in
                if state.advertisementRefreshWanted, !state.stopped {
                    state.advertisementRefreshWanted = false
                    return true
                }
                (state.advertisementRefreshRunning, state.advertisementRefreshWanted) = (false, false)
                return false
            }
        }
        if !started { state.withLockedValue { $0.advertisementRefreshRunning = false } }
    }

    func blocking<Result: Sendable>(_ body: @escaping @Sendable () throws -> Result) async throws -> Result {
        try await NIOThreadPool.singleton.runIfActive(body)
    }
}

extension Duration {
    /// Seconds as a `TimeInterval`.
    var timeInterval: TimeInterval {
        Double(components.seconds) + Double(components.attoseconds) / 1e18
    }

    /// Whole milliseconds (rounded down), exactly: the unit of config.json's `…Ms` keys.
    var wholeMilliseconds: Int64 {
        components.seconds * 1000 + components.attoseconds / 1_000_000_000_000_000
    }
}
