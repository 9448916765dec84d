import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Writes to standard output or standard error that report a failure instead of trapping.
///
/// `FileHandle.write(_:)` (the non-throwing form) traps in swift-corelibs-foundation when the write
/// fails, and with SIGPIPE ignored (as this process does) a closed pipe is such a failure: `run | head -1`
/// ended in a crash. Here a failed write is remembered, reported once to an observer (`run` stops cleanly
/// then), and later writes to that stream are dropped: a command never dies of its output going away.
final class StandardStream: Sendable {
    /// Why a stream can no longer be written.
    enum Failure: Sendable, Equatable, CustomStringConvertible {
        /// The reader went away (`EPIPE`): `| head`, a closed terminal, a `tee` stopped by Ctrl-C.
        case closed
        /// Any other error (`ENOSPC` for `> /dev/full`, `EIO`), with its words.
        case failed(errno: Int32, reason: String)

        var description: String {
            switch self {
            case .closed: "its reader closed it"
            case .failed(_, let reason): reason
            }
        }
    }

    /// Standard output.
    static let output = StandardStream(descriptor: STDOUT_FILENO)
    /// Standard error.
    static let error = StandardStream(descriptor: STDERR_FILENO)

    private let descriptor: Int32
    private struct State {
        var failure: Failure?
        var observers: [@Sendable (Failure) -> Void] = []
    }
    private let state = Mutex(State())

    private init(descriptor: Int32) {
        self.descriptor = descriptor
    }

    /// The failure that ended the stream, if any.
    var failure: Failure? { state.withLock { $0.failure } }

    /// Calls `observer` once, from the writing thread, when a write fails (at once if one already did).
    func onFailure(_ observer: @escaping @Sendable (Failure) -> Void) {
        let failure = state.withLock { state -> Failure? in
            if state.failure == nil { state.observers.append(observer) }
            return state.failure
        }
        if let failure { observer(failure) }
    }

    /// Watches a pipe or socket for its reader going away, so that `run | head -1` stops when `head`
    /// exits, not at the next line `run` happens to print (which may be minutes later): a thread waits in
    /// `poll` for an error condition only, which a pipe reports once its last reader closed. Nothing for
    /// a terminal or a file, where no reader can go away.
    func watchForClosedReader() {
        var status = stat()
        guard fstat(descriptor, &status) == 0,
              status.st_mode & S_IFMT == S_IFIFO || status.st_mode & S_IFMT == S_IFSOCK else { return }
        let descriptor = descriptor
        let thread = Thread { [self] in
            var entry = pollfd(fd: descriptor, events: 0, revents: 0)
            while failure == nil {
                let ready = poll(&entry, 1, -1)
                if ready < 0 && errno == EINTR { continue }
                guard ready > 0, entry.revents & Int16(POLLERR | POLLHUP) != 0 else { return }
                fail(.closed)
                return
            }
        }
        thread.name = "stdout-watch"
        thread.start()
    }

    /// Records `failure` (the first one wins) and tells the observers.
    private func fail(_ failure: Failure) {
        let observers = state.withLock { state -> [@Sendable (Failure) -> Void] in
            guard state.failure == nil else { return [] }
            state.failure = failure
            defer { state.observers = [] }
            return state.observers
        }
        for observer in observers { observer(failure) }
    }

    /// Writes all of `text` as UTF-8; false (and nothing more is written, ever) once the stream failed.
    @discardableResult
    func write(_ text: String) -> Bool { write(Data(text.utf8)) }

    /// Writes all of `data`, whole, in order with other writers; false once the stream failed.
    @discardableResult
    func write(_ data: Data) -> Bool {
        enum Outcome { case written, droppedAfterFailure, failed(Failure) }
        // Under the lock: lines written from several threads never interleave.
        let outcome = state.withLock { state -> Outcome in
            guard state.failure == nil else { return .droppedAfterFailure }
            return Self.writeAll(data, to: descriptor).map(Outcome.failed) ?? .written
        }
        switch outcome {
        case .written: return true
        case .droppedAfterFailure: return false
        case .failed(let failure):
            fail(failure)
            return false
        }
    }

    /// `write(2)` until all of `data` is written; nil, or the failure.
    private static func writeAll(_ data: Data, to descriptor: Int32) -> Failure? {
        data.withUnsafeBytes { bytes -> Failure? in
            var done = 0
            while done < bytes.count {
                let count = Glibc.write(descriptor, bytes.baseAddress.map { $0 + done }, bytes.count - done)
                if count < 0 {
                    let number = errno
                    if number == EINTR { continue }
                    if number == EPIPE { return .closed }
                    return .failed(errno: number, reason: String(cString: strerror(number)))
                }
                done += count
            }
            return nil
        }
    }
}

/// Whether a local TCP port can be listened on now.
enum TCPPortProbe {
    /// Nil when a listener could bind `host:port` now (with `SO_REUSEADDR`, as the node's listeners do,
    /// so a port in `TIME_WAIT` counts as free); else why not, in words.
    static func unavailableReason(host: String, port: Int) -> String? {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        guard inet_pton(AF_INET, host, &address.sin_addr) == 1 else { return "\(host) is not an IPv4 address" }
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { return String(cString: strerror(errno)) }
        defer { close(descriptor) }
        var on: Int32 = 1
        _ = setsockopt(descriptor, SOL_SOCKET, SO_REUSEADDR, &on, socklen_t(MemoryLayout<Int32>.size))
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound != 0 else { return nil }
        return errno == EADDRINUSE ? "in use by another process" : String(cString: strerror(errno))
    }
}

/// Dotted IPv4 addresses given on the command line.
enum IPv4Address {
    /// Whether `text` is a dotted IPv4 address (`inet_pton`'s four decimal parts).
    static func isValid(_ text: String) -> Bool { octets(text) != nil }

    /// Whether `text` is an IPv4 multicast address (224.0.0.0/4).
    static func isMulticast(_ text: String) -> Bool { octets(text).map { (224...239).contains($0[0]) } ?? false }

    private static func octets(_ text: String) -> [UInt8]? {
        var address = in_addr()
        guard inet_pton(AF_INET, text, &address) == 1 else { return nil }
        return withUnsafeBytes(of: address.s_addr) { Array($0) }
    }
}
