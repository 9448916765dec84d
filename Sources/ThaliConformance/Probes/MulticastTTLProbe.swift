import Foundation
import NIOCore
import ThaliSSDP

#if canImport(Glibc)
import Glibc
#endif

/// Reads the IP TTL of the implementation's multicast alives [SSDP-1.2]. On the link they were sent on
/// no router lowers it, so the TTL a receiver reads (`IP_RECVTTL`) is the one it was sent with.
enum MulticastTTLProbe {
    /// The most alives the probe reads before it judges.
    static let maxAlives = 3
    /// The largest datagram read (an SSDP message is far smaller; longer ones are cut and skipped).
    static let maxDatagramBytes = 2048

    /// What the probe heard.
    struct Heard: Sendable, Hashable {
        /// The TTL of each alive that named the location, in the order heard.
        var ttls: [Int] = []
        /// Every datagram read on the group, the implementation's and others'.
        var datagrams = 0
    }

    /// Why the probe could not listen.
    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    /// Listens on `group:port` (SO_REUSEADDR, beside the implementation's and the suite's own sockets),
    /// joined on `interface`, for up to `duration` or until ``maxAlives`` alives whose LOCATION names
    /// `location`'s host and port came. Blocking: run it off the event loops.
    static func listen(group: String, port: Int, interface: String, location: BeaconLocation, duration: TimeAmount) throws -> Heard {
        var groupAddress = in_addr(), interfaceAddress = in_addr()
        guard inet_pton(AF_INET, group, &groupAddress) == 1, inet_pton(AF_INET, interface, &interfaceAddress) == 1 else {
            throw Failure(description: "\(group) or \(interface) is not an IPv4 address")
        }
        let descriptor = socket(AF_INET, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { throw Failure(description: "socket: \(String(cString: strerror(errno)))") }
        defer { close(descriptor) }
        var one: Int32 = 1
        var bound = sockaddr_in()
        bound.sin_family = sa_family_t(AF_INET)
        bound.sin_port = in_port_t(UInt16(port).bigEndian)
        bound.sin_addr = groupAddress
        var request = ip_mreq(imr_multiaddr: groupAddress, imr_interface: interfaceAddress)
        var slice = timeval(tv_sec: 0, tv_usec: 200_000)
        let failedCall: String? =
            setsockopt(descriptor, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size)) != 0 ? "SO_REUSEADDR"
            : withUnsafePointer(to: &bound, { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }) != 0 ? "bind \(group):\(port)"
            : setsockopt(descriptor, Int32(IPPROTO_IP), IP_ADD_MEMBERSHIP, &request, socklen_t(MemoryLayout<ip_mreq>.size)) != 0 ? "IP_ADD_MEMBERSHIP"
            : setsockopt(descriptor, Int32(IPPROTO_IP), IP_RECVTTL, &one, socklen_t(MemoryLayout<Int32>.size)) != 0 ? "IP_RECVTTL"
            : setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &slice, socklen_t(MemoryLayout<timeval>.size)) != 0 ? "SO_RCVTIMEO"
            : nil
        if let failedCall { throw Failure(description: "\(failedCall): \(String(cString: strerror(errno)))") }

        let deadline = NIODeadline.now() + duration
        var heard = Heard()
        var payload = [UInt8](repeating: 0, count: maxDatagramBytes)
        var control = [UInt8](repeating: 0, count: 64)
        while heard.ttls.count < maxAlives && NIODeadline.now() < deadline {
            let (count, ttl) = payload.withUnsafeMutableBytes { payloadBytes in
                control.withUnsafeMutableBytes { controlBytes -> (Int, Int?) in
                    var vector = iovec(iov_base: payloadBytes.baseAddress, iov_len: payloadBytes.count)
                    return withUnsafeMutablePointer(to: &vector) { vectorPointer -> (Int, Int?) in
                        var message = msghdr()
                        message.msg_iov = vectorPointer
                        message.msg_iovlen = 1
                        message.msg_control = controlBytes.baseAddress
                        message.msg_controllen = controlBytes.count
                        let count = recvmsg(descriptor, &message, 0)
                        guard count >= 0, message.msg_flags & Int32(MSG_TRUNC) == 0 else { return (count < 0 ? -1 : 0, nil) }
                        return (count, Self.ttl(in: message))
                    }
                }
            }
            guard count > 0 else { continue }  // timed out (a slice), cut, or interrupted
            heard.datagrams += 1
            if let ttl, Self.isAlive(payload.prefix(count), naming: location) { heard.ttls.append(ttl) }
        }
        return heard
    }

    /// The `IP_TTL` control message's value in `message`, if the kernel gave one.
    private static func ttl(in message: msghdr) -> Int? {
        guard let base = message.msg_control, Int(message.msg_controllen) >= MemoryLayout<cmsghdr>.size else { return nil }
        let end = base + Int(message.msg_controllen)
        let alignment = MemoryLayout<Int>.size  // CMSG_ALIGN: to a size_t
        var current = base
        while current + MemoryLayout<cmsghdr>.size <= end {
            let header = current.loadUnaligned(as: cmsghdr.self)
            let length = Int(header.cmsg_len)
            guard length >= MemoryLayout<cmsghdr>.size, current + length <= end else { return nil }
            if header.cmsg_level == IPPROTO_IP && header.cmsg_type == IP_TTL {
                // CMSG_DATA: the value (an int) follows the aligned header.
                let data = current + ((MemoryLayout<cmsghdr>.size + alignment - 1) & ~(alignment - 1))
                guard data + MemoryLayout<Int32>.size <= current + length else { return nil }
                return Int(data.loadUnaligned(as: Int32.self))
            }
            current += (length + alignment - 1) & ~(alignment - 1)
        }
        return nil
    }

    /// Whether `datagram` is an SSDP alive (ThaliSSDP's strict parser) whose LOCATION is `location`'s
    /// host and port, with any path.
    static func isAlive(_ datagram: some Collection<UInt8>, naming location: BeaconLocation) -> Bool {
        guard case .notification(let notification)? = try? SSDPMessage.parse(datagram), notification.subtype == .alive,
              let named = notification.location else { return false }
        let prefix = "http://\(location.host):\(location.port)"
        return named == prefix || named.hasPrefix(prefix + "/")
    }
}
