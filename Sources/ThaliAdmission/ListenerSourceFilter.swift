import NIOConcurrencyHelpers
import NIOCore
#if canImport(Glibc)
import Glibc
#endif

/// Refuses, in the kernel, the sources an ``AdmissionController`` refuses for their rate: a classic BPF
/// socket filter (``SourceFilterProgram``) on the listening socket drops their segments before a
/// connection exists, so while its refusal period lasts a refused source costs the listener no accept,
/// no close and no event-loop wake-up (its SYNs go unanswered; its connects time out). It needs no
/// privilege: any process may filter its own socket (Linux `SO_ATTACH_FILTER`).
///
/// The kernel refuses only what the gate refuses anyway: the sources in a per-source refusal period
/// (``AdmissionRefusal/sourceRate``), never a global refusal, at most
/// ``AdmissionLimits/maxFilteredSources`` of them (the latest refusals; the rest are refused after
/// their accept as before). The program is replaced (atomically, by one `setsockopt`) when a refusal
/// starts and when the earliest one ends (a timer on the listener's event loop), so a source is let in
/// again on time. Where the socket cannot be filtered (not Linux, or the channel offers no socket
/// options) nothing is attached and the gate refuses in user space alone.
///
/// A connection accepted from the listener starts with a reference to the program the listener had
/// then (Linux copies a listener's filter to the sockets it accepts). It never drops that connection's
/// segments, since its peer was not refused when it connected, and costs it a few comparisons per
/// segment.
public final class ListenerSourceFilter: Sendable {
    /// What the filter has done.
    public struct Counters: Sendable, Hashable {
        /// Programs attached (or detached, when no source is left).
        public var updates = 0
        /// Attaches that failed (the gate still refuses those sources after their accept).
        public var failures = 0
    }

    private struct State {
        var installed: [String] = []
        var counters = Counters()
        var updatePending = false
        var release: Scheduled<Void>?
        var observer: Int?
        var closed = false
    }

    private let listener: any Channel
    private let provider: any SocketOptionProvider
    private let admission: AdmissionController<String>
    private let onUpdate: @Sendable ([String]) -> Void
    private let state = NIOLockedValueBox(State())

    /// The sources the kernel refuses now.
    public var filteredSources: [String] { state.withLockedValue { $0.installed } }
    /// What the filter has done so far.
    public var counters: Counters { state.withLockedValue { $0.counters } }

    /// Keeps `listener`'s kernel filter in step with `admission`'s refused sources until the listener
    /// closes. `onUpdate` is told (on the listener's event loop) each new list of refused sources once
    /// the kernel has it, for monitoring and tests. Nil when ``AdmissionLimits/maxFilteredSources`` is 0
    /// or the listener's socket cannot be filtered. The listener keeps the filter until it closes.
    @discardableResult
    public static func attach(to listener: any Channel, admission: AdmissionController<String>,
                              onUpdate: @escaping @Sendable ([String]) -> Void = { _ in }) -> ListenerSourceFilter? {
        #if os(Linux)
        guard admission.limits.maxFilteredSources > 0, let provider = listener as? any SocketOptionProvider else { return nil }
        let filter = ListenerSourceFilter(listener: listener, provider: provider, admission: admission, onUpdate: onUpdate)
        let observer = admission.addRefusedSourcesObserver { [weak filter] in filter?.scheduleUpdate() }
        filter.state.withLockedValue { $0.observer = observer }
        // The listener keeps its filter until it closes.
        listener.closeFuture.whenComplete { _ in filter.stop() }
        filter.scheduleUpdate()  // sources refused before this listener was bound (a port reopened)
        return filter
        #else
        return nil
        #endif
    }

    private init(listener: any Channel, provider: any SocketOptionProvider, admission: AdmissionController<String>,
                 onUpdate: @escaping @Sendable ([String]) -> Void) {
        self.listener = listener
        self.provider = provider
        self.admission = admission
        self.onUpdate = onUpdate
    }

    deinit {
        if let observer = state.withLockedValue({ $0.observer }) { admission.removeRefusedSourcesObserver(observer) }
    }

    private func stop() {
        let (observer, release) = state.withLockedValue { state in
            state.closed = true
            defer { state.observer = nil; state.release = nil }
            return (state.observer, state.release)
        }
        release?.cancel()
        if let observer { admission.removeRefusedSourcesObserver(observer) }
    }

    /// One update on the event loop however many refusals start before it runs.
    private func scheduleUpdate() {
        let first = state.withLockedValue { state -> Bool in
            guard !state.closed, !state.updatePending else { return false }
            state.updatePending = true
            return true
        }
        if first { listener.eventLoop.execute { [self] in update() } }
    }

    private func update() {
        listener.eventLoop.assertInEventLoop()
        // Cleared before the gate is read, so a refusal that starts meanwhile schedules another update.
        let (previous, closed) = state.withLockedValue { state in
            state.updatePending = false
            state.release?.cancel()
            state.release = nil
            return (state.installed, state.closed)
        }
        guard !closed else { return }
        let refused = admission.refusedSources(now: .now()).compactMap { entry in
            FilteredAddress(entry.source).map { (entry.source, $0, entry.until) }
        }.prefix(admission.limits.maxFilteredSources)
        let sources = refused.map(\.0).sorted()
        if sources != previous {
            let attached = install(SourceFilterProgram(refusing: refused.map(\.1)), detach: sources.isEmpty)
            state.withLockedValue { state in
                if attached {
                    state.installed = sources
                    state.counters.updates += 1
                } else {
                    state.counters.failures += 1
                }
            }
            if attached { onUpdate(sources) }
        }
        // The earliest refusal to end lets its source in again then.
        if let earliest = refused.map(\.2).min() {
            let release = listener.eventLoop.scheduleTask(deadline: earliest) { [weak self] () -> Void in self?.scheduleUpdate() }
            state.withLockedValue { $0.release = release }
        }
    }

    /// Attaches `program` to the listening socket (replacing the one before), or detaches the filter.
    private func install(_ program: SourceFilterProgram, detach: Bool) -> Bool {
        #if os(Linux)
        if detach { return setOption(SO_DETACH_FILTER, CInt(0)) }
        return program.instructions.withUnsafeBufferPointer { buffer in
            setOption(SO_ATTACH_FILTER, KernelProgramHeader(length: UInt16(buffer.count), instructions: buffer.baseAddress))
        }
        #else
        return false
        #endif
    }

    #if os(Linux)
    /// Sets a socket-level option on the listening socket; on the event loop this happens before it
    /// returns (so the kernel has copied a program out of its buffer).
    private func setOption<Value: Sendable>(_ name: CInt, _ value: Value) -> Bool {
        let succeeded = NIOLockedValueBox(false)
        provider.unsafeSetSocketOption(level: SocketOptionLevel(SOL_SOCKET), name: SocketOptionName(name), value: value)
            .whenSuccess { succeeded.withLockedValue { $0 = true } }
        return succeeded.withLockedValue { $0 }
    }
    #endif
}

/// The kernel's `struct sock_fprog`: the program's length and its instructions (which the kernel copies
/// during the `setsockopt`).
private struct KernelProgramHeader: @unchecked Sendable {
    var length: UInt16
    var instructions: UnsafePointer<SourceFilterProgram.Instruction>?
}
