import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A stand-in for the radio shared by several processes on one Linux machine, for tests of whole nodes
/// where there is no Bluetooth: each device's listening channel is an abstract UNIX stream socket named
/// `thali-bt/<scope>/<address>/<channel>`, and a connecting device binds its own socket to
/// `thali-bt/<scope>/<address>/c<random>` first, so the listener learns who connected from `accept` as it
/// does from RFCOMM. Everything above the transport (NIO channels, the handshake, the relay) runs on the
/// real descriptors; only `RFCOMMTransport` is replaced, and only by test configuration.
///
/// Abstract names vanish with the process that bound them (a killed node leaves nothing behind), and are
/// private to the network namespace. `scope` keeps concurrent tests apart.
public struct CrossProcessBluetoothTransport: BluetoothTransport {
    /// Separates one test's devices from another's.
    public let scope: String
    /// This device's address: the name it listens under, and what listeners see as the remote address.
    public let localAddress: BluetoothAddress

    /// The longest `scope`: the whole name must fit `sockaddr_un.sun_path` (108 bytes).
    public static let maxScopeLength = 48

    /// A device with `localAddress` among the processes that use the same `scope` (at most
    /// ``maxScopeLength`` bytes; a longer one makes every call fail with ENAMETOOLONG).
    public init(scope: String, localAddress: BluetoothAddress) {
        self.scope = scope
        self.localAddress = localAddress
    }

    private static let prefix = "thali-bt/"

    private func name(_ address: BluetoothAddress, _ suffix: String) -> String {
        Self.prefix + "\(scope)/\(address)/\(suffix)"
    }

    public func connect(to address: BluetoothAddress, channel: UInt8) async throws -> BluetoothSocket {
        // Non-blocking: a listener whose backlog is full refuses (EAGAIN) instead of blocking this task.
        let fd = try Self.openSocket(nonBlocking: true)
        // Unique per connection: the kernel refuses a second bind to one abstract name.
        let own = name(localAddress, "c\(UInt64.random(in: 0...UInt64.max))")
        var code = Self.withAbstractAddress(own) { bind(fd, $0, $1) } == 0 ? 0 : errno
        if code == 0 {
            code = Self.withAbstractAddress(name(address, "\(channel)")) { Glibc.connect(fd, $0, $1) } == 0 ? 0 : errno
        }
        guard code == 0 else {
            _ = closeDescriptor(fd)
            if code == ECONNREFUSED || code == ENOENT || code == EAGAIN { throw BluetoothTransportError.connectionRefused(address, channel: channel) }
            throw BluetoothTransportError.systemCallFailed(call: "connect(stand-in \(address) channel \(channel))", errno: code)
        }
        return BluetoothSocket(adoptingDescriptor: fd, remoteAddress: address)
    }

    public func listen(channel: UInt8) async throws -> any BluetoothListener {
        let fd = try Self.openSocket()
        let bound = Self.withAbstractAddress(name(localAddress, "\(channel)")) { bind(fd, $0, $1) } == 0 ? 0 : errno
        try listenOrClose(fd, bindErrno: bound, channel: channel, kind: "stand-in")
        let prefix = Self.prefix + "\(scope)/"
        return BlockingAcceptListener(descriptor: fd, name: "stand-in") { fd in
            var storage = sockaddr_un()
            var length = socklen_t(MemoryLayout<sockaddr_un>.size)
            let client = withUnsafeMutablePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.accept(fd, $0, &length) }
            }
            guard client >= 0 else { return (client, nil) }
            _ = fcntl(client, F_SETFD, FD_CLOEXEC)
            return (client, Self.remoteAddress(storage, length: length, prefix: prefix))
        }
    }

    /// The device address in a connector's name `<prefix><address>/c<random>`, or nil.
    private static func remoteAddress(_ storage: sockaddr_un, length: socklen_t, prefix: String) -> BluetoothAddress? {
        let pathOffset = MemoryLayout<sockaddr_un>.offset(of: \.sun_path) ?? 2
        let count = Int(length) - pathOffset
        guard count > 1 else { return nil }
        let bytes = withUnsafeBytes(of: storage.sun_path) { Array($0.prefix(count)) }
        // An abstract name starts with a NUL byte.
        guard bytes.first == 0, let text = String(bytes: bytes.dropFirst(), encoding: .utf8),
              text.hasPrefix(prefix) else { return nil }
        guard let address = text.dropFirst(prefix.count).split(separator: "/").first else { return nil }
        return BluetoothAddress(String(address))
    }

    private static func openSocket(nonBlocking: Bool = false) throws -> Int32 {
        let flags = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | (nonBlocking ? Int32(SOCK_NONBLOCK.rawValue) : 0)
        let fd = socket(AF_UNIX, flags, 0)
        guard fd >= 0 else { throw BluetoothTransportError.systemCallFailed(call: "socket(AF_UNIX)", errno: errno) }
        return fd
    }

    /// Calls `body` with the abstract socket address for `name` and its length.
    private static func withAbstractAddress(_ name: String,
                                            _ body: (UnsafePointer<sockaddr>, socklen_t) -> Int32) -> Int32 {
        var storage = sockaddr_un()
        storage.sun_family = sa_family_t(AF_UNIX)
        let path = [0] + Array(name.utf8)
        let capacity = MemoryLayout.size(ofValue: storage.sun_path)
        guard path.count <= capacity else {
            errno = ENAMETOOLONG
            return -1
        }
        withUnsafeMutableBytes(of: &storage.sun_path) { $0.copyBytes(from: path) }
        let pathOffset = MemoryLayout<sockaddr_un>.offset(of: \.sun_path) ?? 2
        return withUnsafePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(pathOffset + path.count)) }
        }
    }
}
