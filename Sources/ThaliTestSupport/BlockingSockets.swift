import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Blocking IPv4 sockets for tests that move bytes from a thread, created in whatever network namespace
/// the calling thread is in (the lab's tests enter a host's namespace first).
public enum BlockingSockets {
    /// A socket call failed, with the call and its errno.
    public struct Failure: Error, CustomStringConvertible {
        public let description: String

        /// A failure described by `description`.
        public init(description: String) { self.description = description }
    }

    /// The IPv4 address `text` at `port`.
    public static func address(_ text: String, port: Int) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        inet_pton(AF_INET, text, &address.sin_addr)
        return address
    }

    /// Binds `descriptor` to `text` on a port the kernel picks, and returns that port.
    public static func bindAndName(_ descriptor: Int32, _ text: String) throws -> Int {
        var local = address(text, port: 0)
        let bound = withUnsafePointer(to: &local) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0 else { throw Failure(description: "bind: errno \(errno)") }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &local) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) }
        }
        return Int(UInt16(bigEndian: local.sin_port))
    }

    /// A TCP listener on every address, on a port the kernel picks.
    public static func listenTCP() throws -> (descriptor: Int32, port: Int) {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { throw Failure(description: "socket: errno \(errno)") }
        do {
            let port = try bindAndName(descriptor, "0.0.0.0")
            guard listen(descriptor, 8) == 0 else { throw Failure(description: "listen: errno \(errno)") }
            return (descriptor, port)
        } catch {
            close(descriptor)
            throw error
        }
    }

    /// A TCP connection to `host`:`port`, with Nagle's delay off.
    public static func connectTCP(to host: String, port: Int) throws -> Int32 {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { throw Failure(description: "socket: errno \(errno)") }
        var remote = address(host, port: port)
        let connected = withUnsafePointer(to: &remote) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else {
            close(descriptor)
            throw Failure(description: "connect to \(host):\(port): errno \(errno)")
        }
        var on: Int32 = 1
        setsockopt(descriptor, Int32(IPPROTO_TCP), TCP_NODELAY, &on, socklen_t(MemoryLayout<Int32>.size))
        return descriptor
    }

    /// Sends all of `bytes` in one call (no SIGPIPE); false when the socket took fewer.
    public static func sendAll(_ descriptor: Int32, _ bytes: [UInt8]) -> Bool {
        send(descriptor, bytes, bytes.count, Int32(MSG_NOSIGNAL)) == bytes.count
    }

    /// Fills `buffer` from `descriptor`; false at the end of the stream or an error before it is full.
    public static func receiveExactly(_ descriptor: Int32, _ buffer: inout [UInt8]) -> Bool {
        var received = 0
        while received < buffer.count {
            let count = buffer.withUnsafeMutableBytes { bytes -> Int in
                guard let base = bytes.baseAddress else { return 0 }
                return recv(descriptor, base + received, bytes.count - received, 0)
            }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { return false }
            received += count
        }
        return true
    }
}
