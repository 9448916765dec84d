import NIOConcurrencyHelpers
import CBluetooth
import NIOCore
import NIOPosix

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Bluetooth streams over real RFCOMM sockets (libbluetooth / the kernel's `AF_BLUETOOTH`).
///
/// Blocking calls (`connect`, `accept`) run on `threadPool`. On a kernel without Bluetooth every call
/// fails with `BluetoothTransportError.bluetoothUnsupported`, naming the errno (EAFNOSUPPORT).
public struct RFCOMMTransport: BluetoothTransport {
    private let threadPool: NIOThreadPool

    /// Creates the transport; blocking socket calls run on `threadPool`.
    public init(threadPool: NIOThreadPool = .singleton) {
        self.threadPool = threadPool
    }

    /// Opens an RFCOMM socket, or says why the kernel cannot.
    static func openSocket() throws -> Int32 {
        let fd = thali_rfcomm_socket()
        guard fd >= 0 else {
            let code = errno
            switch code {
            case EAFNOSUPPORT, EPROTONOSUPPORT, ESOCKTNOSUPPORT:
                throw BluetoothTransportError.bluetoothUnsupported(errno: code)
            default:
                throw BluetoothTransportError.systemCallFailed(call: "socket(AF_BLUETOOTH)", errno: code)
            }
        }
        return fd
    }

    public func connect(to address: BluetoothAddress, channel: UInt8) async throws -> BluetoothSocket {
        let fd = try Self.openSocket()
        let addressLE = address.reversedOctets
        let code: Int32 = try await threadPool.runIfActive {
            addressLE.withUnsafeBufferPointer { thali_rfcomm_connect(fd, $0.baseAddress, channel) } == 0 ? 0 : errno
        }
        guard code == 0 else {
            _ = closeDescriptor(fd)
            if code == ECONNREFUSED { throw BluetoothTransportError.connectionRefused(address, channel: channel) }
            throw BluetoothTransportError.systemCallFailed(call: "connect(RFCOMM \(address) channel \(channel))", errno: code)
        }
        return BluetoothSocket(adoptingDescriptor: fd, remoteAddress: address)
    }

    public func listen(channel: UInt8) async throws -> any BluetoothListener {
        let fd = try Self.openSocket()
        guard thali_rfcomm_bind_any(fd, channel) == 0 else {
            let code = errno
            _ = closeDescriptor(fd)
            if code == EADDRINUSE { throw BluetoothTransportError.channelInUse(channel) }
            throw BluetoothTransportError.systemCallFailed(call: "bind(RFCOMM channel \(channel))", errno: code)
        }
        guard Glibc.listen(fd, 16) == 0 else {
            let code = errno
            _ = closeDescriptor(fd)
            throw BluetoothTransportError.systemCallFailed(call: "listen(RFCOMM)", errno: code)
        }
        return RFCOMMListener(descriptor: fd, threadPool: threadPool)
    }
}

/// A listening RFCOMM socket; `accept` blocks on the thread pool, `close` shuts the socket down so a
/// blocked `accept` returns.
final class RFCOMMListener: BluetoothListener, @unchecked Sendable {
    private let descriptor: Int32
    private let threadPool: NIOThreadPool
    private let closed = NIOLockedValueBox(false)

    init(descriptor: Int32, threadPool: NIOThreadPool) {
        self.descriptor = descriptor
        self.threadPool = threadPool
    }

    deinit {
        close()
        _ = closeDescriptor(descriptor)
    }

    func accept() async throws -> BluetoothSocket {
        guard !closed.withLockedValue({ $0 }) else { throw BluetoothTransportError.listenerClosed }
        let fd = descriptor
        let (client, code, addressLE): (Int32, Int32, [UInt8]) = try await threadPool.runIfActive {
            var address = [UInt8](repeating: 0, count: 6)
            let client = address.withUnsafeMutableBufferPointer { thali_rfcomm_accept(fd, $0.baseAddress) }
            return (client, client < 0 ? errno : 0, address)
        }
        guard client >= 0 else {
            if closed.withLockedValue({ $0 }) { throw BluetoothTransportError.listenerClosed }
            throw BluetoothTransportError.systemCallFailed(call: "accept(RFCOMM)", errno: code)
        }
        guard let remote = BluetoothAddress(octets: addressLE.reversed()) else {
            _ = closeDescriptor(client)
            throw BluetoothTransportError.systemCallFailed(call: "accept(RFCOMM): address", errno: EINVAL)
        }
        return BluetoothSocket(adoptingDescriptor: client, remoteAddress: remote)
    }

    func close() {
        let wasClosed = closed.withLockedValue { value in
            defer { value = true }
            return value
        }
        if !wasClosed { _ = shutdown(descriptor, Int32(SHUT_RDWR)) }
    }
}
