import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A connected, full-duplex Bluetooth byte stream (an RFCOMM socket, or a stand-in), owned until it is
/// handed to NIO. Closes its descriptor on deinit if nobody took it.
public final class BluetoothSocket: @unchecked Sendable {
    /// The device at the other end.
    public let remoteAddress: BluetoothAddress
    private var descriptor: Int32?
    private let lock = NIOLock()

    /// Takes ownership of a connected stream socket descriptor.
    public init(adoptingDescriptor descriptor: Int32, remoteAddress: BluetoothAddress) {
        self.descriptor = descriptor
        self.remoteAddress = remoteAddress
    }

    deinit {
        if let descriptor { _ = closeDescriptor(descriptor) }
    }

    /// Gives up ownership of the descriptor (to NIO); `nil` if it was already taken or closed.
    func takeDescriptor() -> Int32? {
        lock.withLock {
            defer { descriptor = nil }
            return descriptor
        }
    }

    /// Closes the socket without using it (a refused connection).
    public func close() {
        if let descriptor = takeDescriptor() { _ = closeDescriptor(descriptor) }
    }

    /// Wraps the stream as an NIO channel on `eventLoop` (a pipe channel over the socket: NIO's socket
    /// channels only know IP and UNIX addresses, a pipe channel works on any stream descriptor).
    /// `initializer` sets up the pipeline before the channel becomes active.
    public func makeChannel(on eventLoop: any EventLoop,
                            initializer: @escaping @Sendable (any Channel) -> EventLoopFuture<Void>)
        async throws -> any Channel
    {
        guard let descriptor = takeDescriptor() else { throw BluetoothTransportError.socketAlreadyUsed }
        do {
            return try await NIOPipeBootstrap(group: eventLoop)
                .channelInitializer(initializer)
                .takingOwnershipOfDescriptor(inputOutput: descriptor)
                .get()
        } catch {
            _ = closeDescriptor(descriptor)
            throw error
        }
    }
}

@inline(__always)
func closeDescriptor(_ descriptor: Int32) -> Int32 { close(descriptor) }

/// Makes the socket `fd`, just bound to `channel` (`bindErrno`: 0, or why the bind failed), listen; on
/// failure closes it and throws, naming the `kind` of socket.
func listenOrClose(_ fd: Int32, bindErrno: Int32, channel: UInt8, kind: String) throws {
    guard bindErrno == 0 else {
        _ = closeDescriptor(fd)
        if bindErrno == EADDRINUSE { throw BluetoothTransportError.channelInUse(channel) }
        throw BluetoothTransportError.systemCallFailed(call: "bind(\(kind) channel \(channel))", errno: bindErrno)
    }
    guard listen(fd, 16) == 0 else {
        let code = errno
        _ = closeDescriptor(fd)
        throw BluetoothTransportError.systemCallFailed(call: "listen(\(kind))", errno: code)
    }
}

/// Accepts incoming Bluetooth streams on one channel.
public protocol BluetoothListener: Sendable {
    /// Waits for the next incoming stream. Throws `BluetoothTransportError.listenerClosed` once closed.
    func accept() async throws -> BluetoothSocket
    /// Stops listening; a pending `accept()` throws.
    func close()
}

/// How Thali opens Bluetooth byte streams: RFCOMM sockets on real hardware (`RFCOMMTransport`), or an
/// in-process stand-in on machines without a radio (`InProcessBluetoothTransport`).
public protocol BluetoothTransport: Sendable {
    /// Opens a stream to `address` on RFCOMM `channel`.
    func connect(to address: BluetoothAddress, channel: UInt8) async throws -> BluetoothSocket
    /// Listens for streams on RFCOMM `channel`.
    func listen(channel: UInt8) async throws -> any BluetoothListener
    /// Throws when this machine cannot carry the transport's streams at all (RFCOMM: a kernel without
    /// Bluetooth sockets), so that a node says so before it registers anything with bluetoothd.
    func checkAvailable() throws
    /// Whether other devices can open streams to adapter `hci<adapterIndex>` now (RFCOMM: whether the
    /// controller has page scan on); nil when it cannot be told.
    func acceptsIncomingStreams(adapterIndex: Int) -> Bool?
}

extension BluetoothTransport {
    /// Stand-in transports work wherever the process runs: nothing to check.
    public func checkAvailable() throws {}
    /// A stand-in's listeners are always reachable.
    public func acceptsIncomingStreams(adapterIndex: Int) -> Bool? { true }
}

/// Failures of a Bluetooth transport.
public enum BluetoothTransportError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The kernel has no Bluetooth sockets (`socket(AF_BLUETOOTH)` failed with EAFNOSUPPORT, or
    /// similar): no Bluetooth support in this kernel or container.
    case bluetoothUnsupported(errno: Int32)
    /// A system call failed.
    case systemCallFailed(call: String, errno: Int32)
    /// Nothing listens at that address and channel.
    case connectionRefused(BluetoothAddress, channel: UInt8)
    /// The device did not answer the connect in time (RFCOMM: the kernel's own connect timeout, which a
    /// blocking connect reports as EINPROGRESS).
    case connectTimedOut(BluetoothAddress, channel: UInt8)
    /// Something already listens on that channel.
    case channelInUse(UInt8)
    /// The listener was closed.
    case listenerClosed
    /// The socket was already handed to a channel or closed.
    case socketAlreadyUsed

    public var description: String {
        switch self {
        case .bluetoothUnsupported(let code):
            return "this kernel has no Bluetooth sockets: socket(AF_BLUETOOTH, SOCK_STREAM, BTPROTO_RFCOMM) failed with "
                + "\(errnoName(code)) (\(String(cString: strerror(code))))"
        case .systemCallFailed(let call, let code):
            return "\(call) failed: \(errnoName(code)) (\(String(cString: strerror(code))))"
        case .connectionRefused(let address, let channel):
            return "no Bluetooth listener at \(address) channel \(channel)"
        case .connectTimedOut(let address, let channel):
            return "connecting to \(address) channel \(channel) timed out: the device did not answer"
        case .channelInUse(let channel): return "RFCOMM channel \(channel) is already in use"
        case .listenerClosed: return "the Bluetooth listener is closed"
        case .socketAlreadyUsed: return "the Bluetooth socket was already used"
        }
    }
}

/// The symbolic name of the errno values this module reports.
func errnoName(_ code: Int32) -> String {
    switch code {
    case EAFNOSUPPORT: return "EAFNOSUPPORT"
    case EPROTONOSUPPORT: return "EPROTONOSUPPORT"
    case EACCES: return "EACCES"
    case EPERM: return "EPERM"
    case ECONNREFUSED: return "ECONNREFUSED"
    case EHOSTDOWN: return "EHOSTDOWN"
    case EHOSTUNREACH: return "EHOSTUNREACH"
    case ETIMEDOUT: return "ETIMEDOUT"
    case EADDRINUSE: return "EADDRINUSE"
    case EBADF: return "EBADF"
    case EINVAL: return "EINVAL"
    default: return "errno \(code)"
    }
}
