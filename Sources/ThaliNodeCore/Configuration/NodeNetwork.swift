import NIOCore
import ThaliSSDP

/// The network interface the node announces on and listens on.
public struct NodeInterface: Sendable, Hashable {
    /// The interface's name (e.g. `eth0`, `lo`).
    public let name: String
    /// Its IPv4 address, as text.
    public let ipv4Address: String
    /// Its index, for pinning multicast to it.
    public let index: Int

    /// Creates an interface description.
    public init(name: String, ipv4Address: String, index: Int) {
        self.name = name
        self.ipv4Address = ipv4Address
        self.index = index
    }

    /// Selects the interface `configured` names (the configuration's `interface`), or when it is `nil` the
    /// first non-loopback interface with an IPv4 address. Throws ``NodeError/noUsableInterface(name:)``
    /// when there is no such interface.
    public static func select(configured: String?) throws -> NodeInterface {
        let candidates = try System.enumerateDevices().compactMap { device -> NodeInterface? in
            guard let address = device.address, case .v4 = address, let ip = address.ipAddress else { return nil }
            return NodeInterface(name: device.name, ipv4Address: ip, index: device.interfaceIndex)
        }
        if let configured {
            guard let match = candidates.first(where: { $0.name == configured }) else {
                throw NodeError.noUsableInterface(name: configured)
            }
            return match
        }
        guard let first = candidates.first(where: { !$0.ipv4Address.hasPrefix("127.") }) else {
            throw NodeError.noUsableInterface(name: nil)
        }
        return first
    }
}

extension NodeInterface {
    /// Checks that `address` is an IPv4 address some local interface has; throws
    /// ``NodeError/addressNotLocal(_:reason:)`` saying which it is not (and which addresses there are).
    public static func validateLocalAddress(_ address: String) throws {
        guard let parsed = try? SocketAddress(ipAddress: address, port: 0), case .v4 = parsed else {
            throw NodeError.addressNotLocal(address, reason: "not an IPv4 address")
        }
        let local = (try? System.enumerateDevices().compactMap { device -> String? in
            guard case .v4 = device.address else { return nil }
            return device.address?.ipAddress
        }) ?? []
        // The kernel's test, not the list: all of 127.0.0.0/8 is this host's (Linux routes it to `lo`).
        guard local.contains(address) || LocalAddress.isLocal(address) else {
            throw NodeError.addressNotLocal(address, reason: "no local interface has it (local IPv4 addresses: \(Set(local).sorted().joined(separator: ", ")))")
        }
    }
}
