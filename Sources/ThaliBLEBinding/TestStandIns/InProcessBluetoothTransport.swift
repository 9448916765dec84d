import NIOConcurrencyHelpers
import NIOCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A stand-in for the radio on machines without Bluetooth: a shared "air" in which each device has an
/// address and may listen on channels; a connection is a UNIX stream socket pair, so everything above
/// the transport (NIO channels, the handshake, the relay) runs on real descriptors.
public final class InProcessBluetoothAir: Sendable {
    private struct Key: Hashable {
        let address: BluetoothAddress
        let channel: UInt8
    }

    private let listeners = NIOLockedValueBox<[Key: InProcessListener]>([:])
    private let connections = NIOLockedValueBox(0)

    /// How many connections listeners have taken in this air so far (what a test of link reuse counts).
    public var connectionCount: Int { connections.withLockedValue { $0 } }
    /// How long a connect takes to reach the listener (a page and the link setup).
    public let connectLatency: Duration

    /// Creates an empty air whose connects take `connectLatency`.
    public init(connectLatency: Duration = .zero) {
        self.connectLatency = connectLatency
    }

    /// A transport for a device with `address` in this air.
    public func transport(for address: BluetoothAddress) -> InProcessBluetoothTransport {
        InProcessBluetoothTransport(air: self, localAddress: address)
    }

    fileprivate func register(_ listener: InProcessListener, address: BluetoothAddress, channel: UInt8) throws {
        try listeners.withLockedValue { table in
            let key = Key(address: address, channel: channel)
            if table[key] != nil { throw BluetoothTransportError.channelInUse(channel) }
            table[key] = listener
        }
    }

    fileprivate func unregister(address: BluetoothAddress, channel: UInt8) {
        _ = listeners.withLockedValue { $0.removeValue(forKey: Key(address: address, channel: channel)) }
    }

    fileprivate func connectionMade() {
        connections.withLockedValue { $0 += 1 }
    }

    fileprivate func listener(address: BluetoothAddress, channel: UInt8) -> InProcessListener? {
        listeners.withLockedValue { $0[Key(address: address, channel: channel)] }
    }
}

/// One device's view of an `InProcessBluetoothAir`.
public struct InProcessBluetoothTransport: BluetoothTransport {
    /// The air this device is in.
    public let air: InProcessBluetoothAir
    /// This device's Bluetooth address (what listeners see as the remote address).
    public let localAddress: BluetoothAddress

    public func connect(to address: BluetoothAddress, channel: UInt8) async throws -> BluetoothSocket {
        if air.connectLatency > .zero { try await Task.sleep(for: air.connectLatency) }
        guard let listener = air.listener(address: address, channel: channel) else {
            throw BluetoothTransportError.connectionRefused(address, channel: channel)
        }
        var fds: [Int32] = [-1, -1]
        let result = fds.withUnsafeMutableBufferPointer {
            socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, $0.baseAddress)
        }
        guard result == 0 else {
            throw BluetoothTransportError.systemCallFailed(call: "socketpair", errno: errno)
        }
        let theirs = BluetoothSocket(adoptingDescriptor: fds[1], remoteAddress: localAddress)
        guard listener.deliver(theirs) else {
            theirs.close()
            _ = closeDescriptor(fds[0])
            throw BluetoothTransportError.connectionRefused(address, channel: channel)
        }
        air.connectionMade()
        return BluetoothSocket(adoptingDescriptor: fds[0], remoteAddress: address)
    }

    public func listen(channel: UInt8) async throws -> any BluetoothListener {
        let listener = InProcessListener(air: air, address: localAddress, channel: channel)
        try air.register(listener, address: localAddress, channel: channel)
        return listener
    }
}

/// A listener in the in-process air: a queue of delivered sockets and at most one waiting `accept`.
final class InProcessListener: BluetoothListener {
    /// The most connections queued before `accept` takes them (like a listen backlog).
    static let backlog = 16

    private struct State {
        var queue: [BluetoothSocket] = []
        var waiter: CheckedContinuation<BluetoothSocket, any Error>?
        var closed = false
    }

    private let state = NIOLockedValueBox(State())
    private let air: InProcessBluetoothAir
    private let address: BluetoothAddress
    private let channel: UInt8

    init(air: InProcessBluetoothAir, address: BluetoothAddress, channel: UInt8) {
        self.air = air
        self.address = address
        self.channel = channel
    }

    /// Queues an incoming socket (or hands it to a waiting `accept`); `false` if closed or the backlog is full.
    func deliver(_ socket: BluetoothSocket) -> Bool {
        enum Decision {
            case handTo(CheckedContinuation<BluetoothSocket, any Error>)
            case queued
            case refused
        }
        let decision: Decision = state.withLockedValue { state in
            if state.closed { return .refused }
            if let waiter = state.waiter {
                state.waiter = nil
                return .handTo(waiter)
            }
            guard state.queue.count < Self.backlog else { return .refused }
            state.queue.append(socket)
            return .queued
        }
        switch decision {
        case .handTo(let waiter):
            waiter.resume(returning: socket)
            return true
        case .queued: return true
        case .refused: return false
        }
    }

    func accept() async throws -> BluetoothSocket {
        try await withCheckedThrowingContinuation { continuation in
            let immediate: Result<BluetoothSocket, any Error>? = state.withLockedValue { state in
                if state.closed { return .failure(BluetoothTransportError.listenerClosed) }
                if !state.queue.isEmpty { return .success(state.queue.removeFirst()) }
                if state.waiter != nil { return .failure(BluetoothTransportError.systemCallFailed(call: "accept (concurrent)", errno: EBUSY)) }
                state.waiter = continuation
                return nil
            }
            if let immediate { continuation.resume(with: immediate) }
        }
    }

    func close() {
        let (waiter, queued): (CheckedContinuation<BluetoothSocket, any Error>?, [BluetoothSocket]) =
            state.withLockedValue { state in
                state.closed = true
                defer { state.waiter = nil; state.queue = [] }
                return (state.waiter, state.queue)
            }
        air.unregister(address: address, channel: channel)
        waiter?.resume(throwing: BluetoothTransportError.listenerClosed)
        for socket in queued { socket.close() }
    }
}
