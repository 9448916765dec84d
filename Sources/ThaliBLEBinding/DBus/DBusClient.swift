import CDBus
import Foundation
import NIOConcurrencyHelpers

/// An incoming method call to an object this client exports.
public struct DBusMethodCall: Sendable {
    /// The unique bus name of the caller.
    public var sender: String
    /// The object path called.
    public var path: String
    /// The interface named in the call (may be empty).
    public var interface: String
    /// The method.
    public var member: String
    /// The arguments (file descriptors in them now belong to the handler).
    public var arguments: [DBusValue]
}

/// The answer to a `DBusMethodCall`.
public enum DBusMethodReply: Sendable {
    /// Return these values.
    case values([DBusValue])
    /// Return a D-Bus error.
    case error(name: String, message: String)
}

/// A signal received from the bus.
public struct DBusSignal: Sendable {
    /// The unique bus name of the sender.
    public var sender: String
    /// The emitting object.
    public var path: String
    /// The signal's interface.
    public var interface: String
    /// The signal's name.
    public var member: String
    /// The signal's values.
    public var arguments: [DBusValue]
}

/// A private connection to a D-Bus bus (libdbus), driven by its own thread.
///
/// The thread is the only one that touches the libdbus connection: it sends queued messages, reads,
/// matches replies to calls by serial (so every call has its own deadline and can never hang), answers
/// calls to exported objects, and hands signals to subscribers. Handlers run on that thread and must be
/// quick. The connection is closed on `close()` or when the last reference goes.
public final class DBusClient: Sendable {
    private let loop: DBusConnectionLoop

    /// The bus address connected to.
    public var address: String { loop.address }
    /// The unique name the bus gave this connection (`:1.42`).
    public var uniqueName: String { loop.uniqueName }
    /// The time every call waits for its reply unless told otherwise.
    public var defaultTimeout: Duration { loop.defaultTimeout }

    /// Connects to the bus at `address` (for example `unix:path=/tmp/bus`) and registers on it.
    /// - Parameters:
    ///   - address: the D-Bus address of the bus.
    ///   - defaultTimeout: the longest any call waits for its reply (also bounds the
    ///     registration itself).
    public init(address: String, defaultTimeout: Duration = .seconds(5)) throws(DBusClientError) {
        loop = try DBusConnectionLoop(address: address, defaultTimeout: defaultTimeout)
    }

    deinit { loop.close() }

    /// Whether the connection is still up.
    public var isConnected: Bool { loop.isConnected }

    /// Closes the connection: pending calls fail with `.disconnected`.
    public func close() { loop.close() }

    /// Registers `handler` to run when the connection drops (not on `close()`).
    public func onDisconnect(_ handler: @escaping @Sendable () -> Void) { loop.onDisconnect(handler) }

    /// Calls a method and returns the reply's values.
    /// - Throws: `DBusClientError.remote` for an error reply, `.timedOut` after `timeout` (default:
    ///   `defaultTimeout`), `.disconnected` when the bus goes away.
    public func call(destination: String, path: String, interface: String, member: String,
                     arguments: [DBusValue] = [], timeout: Duration? = nil) async throws -> [DBusValue]
    {
        try await loop.call(destination: destination, path: path, interface: interface, member: member,
                            arguments: arguments, timeout: timeout)
    }

    /// Emits a signal from `path`.
    public func emitSignal(path: String, interface: String, member: String, arguments: [DBusValue]) throws {
        try loop.emitSignal(path: path, interface: interface, member: member, arguments: arguments)
    }

    /// Exports an object: calls to `path` (any interface) go to `handler`, on the connection's thread.
    public func export(path: String, handler: @escaping @Sendable (DBusMethodCall) -> DBusMethodReply) throws {
        try loop.export(path: path, handler: handler)
    }

    /// Stops exporting `path`.
    public func unexport(path: String) { loop.unexport(path: path) }

    /// Subscribes to signals: adds `matchRule` on the bus, then runs `handler` (on the connection's
    /// thread) for every signal of `interface` (and `member`, if given). Returns an id for `unsubscribe`.
    @discardableResult
    public func subscribe(matchRule: String, interface: String, member: String? = nil,
                          handler: @escaping @Sendable (DBusSignal) -> Void) async throws -> Int
    {
        try await loop.subscribe(matchRule: matchRule, interface: interface, member: member, handler: handler)
    }

    /// Removes a subscription's handler.
    public func unsubscribe(_ id: Int) { loop.unsubscribe(id) }
}

/// The connection and its thread. The thread keeps this object alive while it runs; `DBusClient` stops
/// it when the client goes away, and the libdbus connection is released when both are done.
final class DBusConnectionLoop: @unchecked Sendable {
    private struct PendingCall {
        var continuation: CheckedContinuation<[DBusValue], any Error>
        var deadline: ContinuousClock.Instant
        var method: String
        var timeout: Duration
    }

    private struct Subscription {
        var id: Int
        var interface: String
        var member: String?
        var handler: @Sendable (DBusSignal) -> Void
    }

    private struct Shared {
        var jobs: [(OpaquePointer) -> Void] = []
        var running = true
        var exports: [String: @Sendable (DBusMethodCall) -> DBusMethodReply] = [:]
        var subscriptions: [Subscription] = []
        var nextSubscription = 0
        var disconnectHandlers: [@Sendable () -> Void] = []
        var loopThread: pthread_t?
    }

    /// The bus address connected to.
    let address: String
    /// The unique name the bus gave this connection (`:1.42`).
    let uniqueName: String
    /// The time every call waits for its reply unless told otherwise.
    let defaultTimeout: Duration

    private let connection: OpaquePointer
    private let shared = NIOLockedValueBox(Shared())
    // Touched only by the loop thread:
    private var pending: [UInt32: PendingCall] = [:]
    private let finished = ConditionLock(value: false)

    /// Poll interval of the loop thread: how long a queued message may wait before it is written.
    static let pollMilliseconds: Int32 = 10

    /// Connects to the bus at `address` (for example `unix:path=/tmp/bus`) and registers on it.
    /// - Parameter defaultTimeout: the longest any call waits for its reply.
    init(address: String, defaultTimeout: Duration = .seconds(5)) throws(DBusClientError) {
        dbus_threads_init_default()
        var error = CDBus.DBusError()
        dbus_error_init(&error)
        defer { dbus_error_free(&error) }
        guard let connection = dbus_connection_open_private(address, &error) else {
            throw .connectionFailed(address: address, reason: Self.describe(&error))
        }
        dbus_connection_set_exit_on_disconnect(connection, 0)
        // Hello, with a deadline (dbus_bus_register would wait for libdbus's default 25 s).
        guard let hello = dbus_message_new_method_call("org.freedesktop.DBus", "/org/freedesktop/DBus",
                                                       "org.freedesktop.DBus", "Hello")
        else {
            dbus_connection_close(connection)
            dbus_connection_unref(connection)
            throw .outOfMemory
        }
        let milliseconds = Int32(clamping: defaultTimeout.components.seconds * 1000
            + defaultTimeout.components.attoseconds / 1_000_000_000_000_000)
        let reply = dbus_connection_send_with_reply_and_block(connection, hello, milliseconds, &error)
        dbus_message_unref(hello)
        guard let reply else {
            let reason = Self.describe(&error)
            dbus_connection_close(connection)
            dbus_connection_unref(connection)
            throw .connectionFailed(address: address, reason: reason)
        }
        let replyRef = DBusMessageRef(owning: reply)
        guard let name = try? replyRef.arguments().first?.string else {
            dbus_connection_close(connection)
            dbus_connection_unref(connection)
            throw .connectionFailed(address: address, reason: "Hello returned no name")
        }
        self.address = address
        self.connection = connection
        self.uniqueName = name
        self.defaultTimeout = defaultTimeout
        let thread = Thread { [self] in self.runLoop() }
        thread.name = "thali-dbus"
        thread.start()
    }

    deinit {
        dbus_connection_close(connection)
        dbus_connection_unref(connection)
    }

    private static func describe(_ error: inout CDBus.DBusError) -> String {
        guard dbus_error_is_set(&error) != 0 else { return "unknown error" }
        let name = error.name.map { String(cString: $0) } ?? ""
        let message = error.message.map { String(cString: $0) } ?? ""
        return "\(name): \(message)"
    }

    /// Whether the connection is still up.
    var isConnected: Bool { shared.withLockedValue { $0.running } }

    /// Closes the connection: pending calls fail with `.disconnected`. Waits for the loop thread to end.
    func close() {
        shared.withLockedValue { $0.running = false }
        // From a handler on the loop thread itself: the loop ends after the handler returns.
        if let thread = shared.withLockedValue({ $0.loopThread }), pthread_equal(thread, pthread_self()) != 0 { return }
        finished.lock(whenValue: true)
        finished.unlock()
    }

    /// Registers `handler` to run when the connection drops (not on `close()`).
    func onDisconnect(_ handler: @escaping @Sendable () -> Void) {
        shared.withLockedValue { $0.disconnectHandlers.append(handler) }
    }

    // MARK: Calls

    /// Calls a method and returns the reply's values.
    /// - Throws: `DBusClientError.remote` for an error reply, `.timedOut` after `timeout`,
    ///   `.disconnected` when the bus goes away.
    func call(destination: String, path: String, interface: String, member: String,
                     arguments: [DBusValue] = [], timeout: Duration? = nil) async throws -> [DBusValue]
    {
        let message = try DBusMessageRef.methodCall(destination: destination, path: path, interface: interface, member: member)
        try message.append(arguments)
        let timeout = timeout ?? defaultTimeout
        let method = "\(interface).\(member)"
        let box = UncheckedBox(message)
        return try await withCheckedThrowingContinuation { continuation in
            enqueue(orFail: continuation) { [self] connection in
                var serial: UInt32 = 0
                guard dbus_connection_send(connection, box.value.pointer, &serial) != 0 else {
                    continuation.resume(throwing: DBusClientError.outOfMemory)
                    return
                }
                pending[serial] = PendingCall(continuation: continuation, deadline: .now + timeout,
                                              method: method, timeout: timeout)
            }
        }
    }

    /// Emits a signal from `path`.
    func emitSignal(path: String, interface: String, member: String, arguments: [DBusValue]) throws {
        guard let raw = dbus_message_new_signal(path, interface, member) else { throw DBusClientError.outOfMemory }
        let message = DBusMessageRef(owning: raw)
        try message.append(arguments)
        let box = UncheckedBox(message)
        shared.withLockedValue { state in
            guard state.running else { return }
            state.jobs.append { connection in _ = dbus_connection_send(connection, box.value.pointer, nil) }
        }
    }

    // MARK: Objects and signals

    /// Exports an object: calls to `path` (any interface) go to `handler`, on the loop thread.
    func export(path: String, handler: @escaping @Sendable (DBusMethodCall) -> DBusMethodReply) throws {
        guard DBusNames.isValidObjectPath(path) else { throw DBusClientError.invalidArgument("object path \(path)") }
        shared.withLockedValue { $0.exports[path] = handler }
    }

    /// Stops exporting `path`.
    func unexport(path: String) {
        _ = shared.withLockedValue { $0.exports.removeValue(forKey: path) }
    }

    /// Subscribes to signals: adds `matchRule` on the bus, then runs `handler` for every signal of
    /// `interface` (and `member`, if given). Returns an id for `unsubscribe`.
    @discardableResult
    func subscribe(matchRule: String, interface: String, member: String? = nil,
                          handler: @escaping @Sendable (DBusSignal) -> Void) async throws -> Int
    {
        let id = shared.withLockedValue { state in
            defer { state.nextSubscription += 1 }
            state.subscriptions.append(Subscription(id: state.nextSubscription, interface: interface, member: member,
                                                    handler: handler))
            return state.nextSubscription
        }
        do {
            _ = try await call(destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus",
                               interface: "org.freedesktop.DBus", member: "AddMatch", arguments: [.string(matchRule)])
        } catch {
            unsubscribe(id)
            throw error
        }
        return id
    }

    /// Removes a subscription's handler.
    func unsubscribe(_ id: Int) {
        shared.withLockedValue { $0.subscriptions.removeAll { $0.id == id } }
    }

    // MARK: The loop

    private func enqueue(orFail continuation: CheckedContinuation<[DBusValue], any Error>,
                         _ job: @escaping (OpaquePointer) -> Void)
    {
        let accepted = shared.withLockedValue { state -> Bool in
            guard state.running else { return false }
            state.jobs.append(job)
            return true
        }
        if !accepted { continuation.resume(throwing: DBusClientError.disconnected) }
    }

    private func runLoop() {
        finished.lock()
        shared.withLockedValue { $0.loopThread = pthread_self() }
        var dropped = false
        while true {
            let (jobs, running) = shared.withLockedValue { state in
                defer { state.jobs.removeAll() }
                return (state.jobs, state.running)
            }
            // Every job taken is run, even when close() came after it was queued: a call's job holds its
            // continuation, and its call is failed below with the rest of the pending ones.
            for job in jobs { job(connection) }
            guard running else { break }
            if dbus_connection_read_write(connection, Self.pollMilliseconds) == 0 {
                dropped = true
                break
            }
            while let raw = dbus_connection_pop_message(connection) {
                dispatch(DBusMessageRef(owning: raw))
            }
            if !dbus_connection_get_is_connected(connection).boolValue {
                dropped = true
                break
            }
            expireCalls()
        }
        let (leftoverJobs, handlers) = shared.withLockedValue { state in
            state.running = false
            defer { state.jobs.removeAll() }
            return (state.jobs, state.disconnectHandlers)
        }
        // Jobs queued after the end hold continuations: run them against a dead connection so their
        // sends fail or their calls are failed below.
        for job in leftoverJobs { job(connection) }
        for (_, call) in pending { call.continuation.resume(throwing: DBusClientError.disconnected) }
        pending.removeAll()
        if dropped { for handler in handlers { handler() } }
        finished.unlock(withValue: true)
    }

    private func expireCalls() {
        guard !pending.isEmpty else { return }
        let now = ContinuousClock.now
        for (serial, call) in pending where call.deadline <= now {
            pending[serial] = nil
            let seconds = Double(call.timeout.components.seconds) + Double(call.timeout.components.attoseconds) / 1e18
            call.continuation.resume(throwing: DBusClientError.timedOut(method: call.method, seconds: seconds))
        }
    }

    private func dispatch(_ message: DBusMessageRef) {
        switch message.type {
        case DBUS_MESSAGE_TYPE_METHOD_RETURN:
            guard let call = pending.removeValue(forKey: message.replySerial) else { return }
            do {
                call.continuation.resume(returning: try message.arguments())
            } catch {
                call.continuation.resume(throwing: error)
            }
        case DBUS_MESSAGE_TYPE_ERROR:
            guard let call = pending.removeValue(forKey: message.replySerial) else { return }
            let text = (try? message.arguments().first?.string) ?? nil
            call.continuation.resume(throwing: DBusClientError.remote(name: message.errorName ?? "", message: text ?? ""))
        case DBUS_MESSAGE_TYPE_SIGNAL:
            guard let interface = message.interface, let member = message.member else { return }
            let handlers = shared.withLockedValue { state in
                state.subscriptions.filter { $0.interface == interface && ($0.member == nil || $0.member == member) }
            }
            guard !handlers.isEmpty, let arguments = try? message.arguments() else { return }
            let signal = DBusSignal(sender: message.sender ?? "", path: message.path ?? "", interface: interface,
                                    member: member, arguments: arguments)
            for subscription in handlers { subscription.handler(signal) }
        case DBUS_MESSAGE_TYPE_METHOD_CALL:
            answer(message)
        default:
            return
        }
    }

    private func answer(_ message: DBusMessageRef) {
        let path = message.path ?? ""
        let handler = shared.withLockedValue { $0.exports[path] }
        let reply: DBusMessageRef?
        do {
            if let handler {
                let call = DBusMethodCall(sender: message.sender ?? "", path: path, interface: message.interface ?? "",
                                          member: message.member ?? "", arguments: try message.arguments())
                switch handler(call) {
                case .values(let values):
                    let ret = try message.makeReturn()
                    try ret.append(values)
                    reply = ret
                case .error(let name, let text):
                    reply = try message.makeError(name: name, text: text)
                }
            } else {
                // Nobody takes ownership of descriptors passed to an unknown object.
                for case .unixFD(let fd) in (try? message.arguments()) ?? [] { _ = closeDescriptor(fd) }
                reply = try message.makeError(name: "org.freedesktop.DBus.Error.UnknownObject", text: "no object at \(path)")
            }
        } catch {
            reply = try? message.makeError(name: "org.freedesktop.DBus.Error.InvalidArgs", text: "\(error)")
        }
        if let reply, !message.noReply { _ = dbus_connection_send(connection, reply.pointer, nil) }
    }
}

/// Moves a non-Sendable reference to the loop thread, which is its only user from then on.
struct UncheckedBox<T>: @unchecked Sendable {
    let value: T
    init(_ value: T) { self.value = value }
}

extension dbus_bool_t {
    var boolValue: Bool { self != 0 }
}
