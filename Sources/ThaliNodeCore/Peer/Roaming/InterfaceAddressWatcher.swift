import Foundation
import NIOConcurrencyHelpers
import NIOCore

#if canImport(Glibc)
import Glibc
#endif

/// Watches one network interface's IPv4 addresses and reports every change of the set, on its own
/// thread: a peer that follows its interface (``PeerConfiguration/followsInterface``) moves when its
/// address goes (``InterfaceAddressPlan``).
///
/// It wakes on the kernel's own notice: a `NETLINK_ROUTE` socket subscribed to `RTMGRP_IPV4_IFADDR`
/// receives a message for every IPv4 address added or removed on any interface. The messages are not
/// parsed — any of them only means "read the set again", and the set is read with `getifaddrs(3)` (as
/// ``NodeInterface/select(configured:)`` reads it), so no bytes from the kernel are interpreted here. A
/// change is seen within milliseconds of `ip addr del`/`add`. Every ``PeerConfiguration/interfaceRecheckInterval``
/// the set is read anyway: where the socket cannot be opened (a sandbox that refuses `AF_NETLINK`) that
/// period alone bounds how late a change is seen, and a notice lost to a full socket buffer (`ENOBUFS`)
/// is made up for.
final class InterfaceAddressWatcher: Sendable {
    /// Reads of the netlink socket per wake-up at most, each of at most ``readBufferBytes``: a burst of
    /// notices is drained, never buffered; more than this many wait for the next wake-up.
    static let maxReadsPerWake = 64
    /// The size of one read of the netlink socket (its contents are discarded).
    static let readBufferBytes = 8192
    /// `AF_NETLINK`, `NETLINK_ROUTE` and the IPv4 address group (`RTMGRP_IPV4_IFADDR`), from `<linux/netlink.h>`
    /// and `<linux/rtnetlink.h>` (not in Swift's Glibc module).
    private static let addressFamilyNetlink: Int32 = 16
    private static let netlinkRoute: Int32 = 0
    private static let ipv4AddressGroup: UInt32 = 0x10

    /// The interface watched.
    let interface: String
    /// The netlink socket (-1: none, the set is read every recheck interval alone) and the pipe that wakes
    /// the thread to stop.
    private let netlink: Int32
    private let wake: (read: Int32, write: Int32)
    private let stopped = NIOLockedValueBox(false)

    /// The IPv4 addresses `interface` has now, in the kernel's order (its primary first), each once.
    static func addresses(of interface: String) -> [String] {
        var seen: [String] = []
        for device in (try? System.enumerateDevices()) ?? [] where device.name == interface {
            guard case .v4 = device.address, let ip = device.address?.ipAddress, !seen.contains(ip) else { continue }
            seen.append(ip)
        }
        return seen
    }

    /// Starts watching `interface`, whose addresses were `initial`: `changed` gets each set that differs
    /// from the one before (the first from `initial`), on the watcher's thread, until ``stop()``. Reads
    /// the set at least every `recheckInterval`.
    init(interface: String, initial: [String], recheckInterval: Duration, changed: @escaping @Sendable ([String]) -> Void) {
        self.interface = interface
        netlink = Self.openNetlinkSocket()
        var fds: [Int32] = [-1, -1]
        if pipe(&fds) == 0 {
            for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        }
        wake = (fds[0], fds[1])
        let milliseconds = Int32(clamping: max(1, recheckInterval.components.seconds * 1000
            + recheckInterval.components.attoseconds / 1_000_000_000_000_000))
        let (netlink, wakeRead) = (self.netlink, wake.read)
        let stopped = self.stopped
        let thread = Thread {
            var last = initial
            var buffer = [UInt8](repeating: 0, count: Self.readBufferBytes)
            while !stopped.withLockedValue({ $0 }) {
                var polled = [pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0)]
                if netlink >= 0 { polled.append(pollfd(fd: netlink, events: Int16(POLLIN), revents: 0)) }
                let ready = poll(&polled, nfds_t(polled.count), milliseconds)
                if ready < 0 && errno != EINTR { break }
                if polled[0].revents != 0 { break }
                if polled.count > 1, polled[1].revents != 0 {
                    // Drained, not parsed: a notice only says "read the set again".
                    for _ in 0..<Self.maxReadsPerWake {
                        if recv(netlink, &buffer, buffer.count, Int32(MSG_DONTWAIT)) <= 0 { break }
                    }
                }
                let now = Self.addresses(of: interface)
                if now != last {
                    last = now
                    changed(now)
                }
            }
            if netlink >= 0 { close(netlink) }
            if wakeRead >= 0 { close(wakeRead) }
        }
        thread.name = "thali-interface-watch"
        thread.start()
    }

    /// Whether the kernel's notices wake the watcher (false: it reads the set every recheck interval only).
    var usesNetlink: Bool { netlink >= 0 }

    /// Stops the thread (it closes its descriptors as it ends); `changed` is not called after it returns
    /// but for a set being reported at this very moment.
    func stop() {
        let first = stopped.withLockedValue { stopped -> Bool in
            defer { stopped = true }
            return !stopped
        }
        guard first, wake.write >= 0 else { return }
        var byte: UInt8 = 1
        _ = write(wake.write, &byte, 1)
        close(wake.write)
    }

    /// A `NETLINK_ROUTE` socket in the IPv4 address group, non-blocking, or -1 when it cannot be opened.
    private static func openNetlinkSocket() -> Int32 {
        let fd = socket(addressFamilyNetlink, Int32(SOCK_RAW.rawValue) | Int32(SOCK_CLOEXEC.rawValue), netlinkRoute)
        guard fd >= 0 else { return -1 }
        // struct sockaddr_nl, in host byte order: family (u16), pad (u16), pid (u32, 0: the kernel assigns), groups (u32).
        var address = [UInt8](repeating: 0, count: 12)
        withUnsafeBytes(of: UInt16(addressFamilyNetlink)) { address.replaceSubrange(0..<2, with: $0) }
        withUnsafeBytes(of: ipv4AddressGroup) { address.replaceSubrange(8..<12, with: $0) }
        let bound = address.withUnsafeBytes { bytes -> Int32 in
            guard let base = bytes.baseAddress else { return -1 }
            return bind(fd, base.assumingMemoryBound(to: sockaddr.self), socklen_t(bytes.count))
        }
        guard bound == 0, fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) == 0 else {
            close(fd)
            return -1
        }
        return fd
    }
}
