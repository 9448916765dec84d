#if canImport(Glibc)
import Glibc
#endif

/// Whether this host can use an IPv4 address as its own.
public enum LocalAddress {
    /// Whether a socket can bind `address` (dotted IPv4): the kernel's own test of a local address. It
    /// takes more than the addresses interfaces list: Linux routes all of 127.0.0.0/8 to `lo`, so
    /// 127.0.0.2 is local though only 127.0.0.1 is configured, and joining a multicast group on it works.
    public static func isLocal(_ address: String) -> Bool {
        var socketAddress = sockaddr_in()
        socketAddress.sin_family = sa_family_t(AF_INET)
        guard inet_pton(AF_INET, address, &socketAddress.sin_addr) == 1 else { return false }
        let descriptor = socket(AF_INET, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        return withUnsafePointer(to: &socketAddress) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
    }
}
