import Foundation
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
/// The blocking calls run on threads of their own: each `connect` on a new thread, each listener's
/// `accept` on the listener's thread. Never on a shared pool: on a single-core machine
/// `NIOThreadPool.singleton` has one thread, and an RFCOMM connect that waits out a page timeout there,
/// or an `accept` that waits for ever, starved everything else on it (a node's store and delivery work
/// included: found on real BlueZ). On a kernel without Bluetooth every call
/// fails with `BluetoothTransportError.bluetoothUnsupported`, naming the errno (EAFNOSUPPORT).
public struct RFCOMMTransport: BluetoothTransport {
    /// The adapter this transport uses, by its address; nil lets the kernel choose (any adapter).
    public let localAddress: BluetoothAddress?

    /// Creates the transport.
    ///
    /// - Parameter localAddress: the address of the adapter to connect from and listen on. With more than
    ///   one adapter, leave it nil only if any will do: the kernel then routes a connection through
    ///   whichever adapter it picks, and listens on all of them.
    public init(localAddress: BluetoothAddress? = nil) {
        self.localAddress = localAddress
    }

    /// Binds `fd` to the local adapter (or any) on `channel`; returns the errno on failure.
    private func bind(_ fd: Int32, channel: UInt8) -> Int32 {
        let result: Int32
        if let localAddress {
            result = localAddress.reversedOctets.withUnsafeBufferPointer { thali_rfcomm_bind(fd, $0.baseAddress, channel) }
        } else {
            result = thali_rfcomm_bind(fd, nil, channel)
        }
        return result == 0 ? 0 : errno
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

    /// Opens and closes an RFCOMM socket: throws `.bluetoothUnsupported` on a kernel without Bluetooth.
    public func checkAvailable() throws {
        _ = closeDescriptor(try Self.openSocket())
    }

    /// Whether the controller has page scan on: without it every incoming connect ends in a page timeout
    /// on the other device. Read as `hciconfig` reads it (HCIGETDEVINFO, no privilege needed).
    public func acceptsIncomingStreams(adapterIndex: Int) -> Bool? {
        switch thali_hci_page_scan(Int32(adapterIndex)) {
        case 1: return true
        case 0: return false
        default: return nil
        }
    }

    public func connect(to address: BluetoothAddress, channel: UInt8) async throws -> BluetoothSocket {
        let fd = try Self.openSocket()
        if let localAddress {
            let code = bind(fd, channel: 0)
            guard code == 0 else {
                _ = closeDescriptor(fd)
                throw BluetoothTransportError.systemCallFailed(call: "bind(RFCOMM \(localAddress))", errno: code)
            }
        }
        let addressLE = address.reversedOctets
        // Cancelling shuts the socket down, which ends a connect still waiting in the kernel.
        let code: Int32 = await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                Thread {
                    let result = addressLE.withUnsafeBufferPointer { thali_rfcomm_connect(fd, $0.baseAddress, channel) }
                    continuation.resume(returning: result == 0 ? 0 : errno)
                }.start()
            }
        } onCancel: {
            _ = shutdown(fd, Int32(SHUT_RDWR))
        }
        guard code == 0 else {
            _ = closeDescriptor(fd)
            throw Self.connectError(errno: code, address: address, channel: channel)
        }
        return BluetoothSocket(adoptingDescriptor: fd, remoteAddress: address)
    }

    /// The typed error for a failed blocking RFCOMM `connect`. The kernel bounds a blocking connect by the
    /// socket's send timeout (about 30 s in the guest), and one that runs out of it fails with EINPROGRESS:
    /// a timeout, not a connect still under way.
    static func connectError(errno code: Int32, address: BluetoothAddress, channel: UInt8) -> BluetoothTransportError {
        switch code {
        case ECONNREFUSED: return .connectionRefused(address, channel: channel)
        case EINPROGRESS, ETIMEDOUT: return .connectTimedOut(address, channel: channel)
        default: return .systemCallFailed(call: "connect(RFCOMM \(address) channel \(channel))", errno: code)
        }
    }

    public func listen(channel: UInt8) async throws -> any BluetoothListener {
        let fd = try Self.openSocket()
        try listenOrClose(fd, bindErrno: bind(fd, channel: channel), channel: channel, kind: "RFCOMM")
        return BlockingAcceptListener(descriptor: fd, name: "RFCOMM") { fd in
            var address = [UInt8](repeating: 0, count: 6)
            let client = address.withUnsafeMutableBufferPointer { thali_rfcomm_accept(fd, $0.baseAddress) }
            return (client, BluetoothAddress(octets: address.reversed()))
        }
    }
}

/// A listening stream socket (RFCOMM, or the cross-process stand-in); `accept` blocks on the listener's
/// own thread, `close` shuts the socket down so a blocked `accept` returns, and ends that thread.
final class BlockingAcceptListener: BluetoothListener, @unchecked Sendable {
    /// Accepts one connection on the listening descriptor: the new descriptor (negative on failure, with
    /// errno set) and the remote device's address if the socket's peer address names one.
    typealias Accept = @Sendable (Int32) -> (descriptor: Int32, remote: BluetoothAddress?)

    private let descriptor: Int32
    private let name: String
    private let acceptOne: Accept
    private let acceptThread = NIOThreadPool(numberOfThreads: 1)
    private let closed = NIOLockedValueBox(false)

    /// Takes ownership of the listening `descriptor`; `name` names the socket kind in errors.
    init(descriptor: Int32, name: String, accept: @escaping Accept) {
        self.descriptor = descriptor
        self.name = name
        self.acceptOne = accept
        acceptThread.start()
    }

    deinit {
        close()
        _ = closeDescriptor(descriptor)
    }

    func accept() async throws -> BluetoothSocket {
        guard !closed.withLockedValue({ $0 }) else { throw BluetoothTransportError.listenerClosed }
        let (fd, acceptOne) = (descriptor, self.acceptOne)
        let (client, code, remote): (Int32, Int32, BluetoothAddress?) = try await acceptThread.runIfActive {
            let (client, remote) = acceptOne(fd)
            return (client, client < 0 ? errno : 0, remote)
        }
        guard client >= 0 else {
            if closed.withLockedValue({ $0 }) { throw BluetoothTransportError.listenerClosed }
            throw BluetoothTransportError.systemCallFailed(call: "accept(\(name))", errno: code)
        }
        guard let remote else {
            _ = closeDescriptor(client)
            throw BluetoothTransportError.systemCallFailed(call: "accept(\(name)): address", errno: EINVAL)
        }
        return BluetoothSocket(adoptingDescriptor: client, remoteAddress: remote)
    }

    func close() {
        let wasClosed = closed.withLockedValue { value in
            defer { value = true }
            return value
        }
        if !wasClosed {
            _ = shutdown(descriptor, Int32(SHUT_RDWR))
            acceptThread.shutdownGracefully { _ in }
        }
    }
}
