/// The 14 bytes that start every Ethernet frame the stage forwards: destination and source MAC addresses
/// and the EtherType (or length). The stage reads no further into a frame.
public struct EthernetHeader: Sendable, Equatable {
    /// The header's length in bytes.
    public static let length = 14
    /// The destination MAC address, in its 48 low bits (first byte on the wire the most significant).
    public var destination: UInt64
    /// The source MAC address, in its 48 low bits.
    public var source: UInt64
    /// The EtherType (or, below 1536, the 802.3 length).
    public var etherType: UInt16

    /// The broadcast address ff:ff:ff:ff:ff:ff.
    public static let broadcast: UInt64 = 0xFFFF_FFFF_FFFF

    /// Reads the header at the start of `frame` (a frame as read from a TAP device, or any bytes); throws
    /// when there are fewer bytes than a header. Reads exactly the first 14 bytes.
    public init<Bytes: Collection>(_ frame: Bytes) throws(EthernetHeaderError) where Bytes.Element == UInt8 {
        var bytes = frame.makeIterator()
        var header: [UInt8] = []
        header.reserveCapacity(Self.length)
        while header.count < Self.length, let byte = bytes.next() { header.append(byte) }
        guard header.count == Self.length else { throw .tooShort(header.count) }
        func address(at offset: Int) -> UInt64 {
            (0..<6).reduce(UInt64(0)) { $0 << 8 | UInt64(header[offset + $1]) }
        }
        destination = address(at: 0)
        source = address(at: 6)
        etherType = UInt16(header[12]) << 8 | UInt16(header[13])
    }

    /// Whether `address` has the group bit (the least significant bit of its first byte) set: multicast or broadcast.
    public static func isGroup(_ address: UInt64) -> Bool { address & 0x0100_0000_0000 != 0 }

    /// A multicast frame: the destination's group bit set, and not broadcast (ARP's broadcasts are unicast-like:
    /// an access point sends them to every station but they are few and short).
    public var isMulticast: Bool { Self.isGroup(destination) && destination != Self.broadcast }
    /// Whether the destination is a group (multicast or broadcast): the stage floods such frames.
    public var isGroupDestination: Bool { Self.isGroup(destination) }
}

/// A frame the stage cannot read.
public enum EthernetHeaderError: Error, Equatable, Sendable {
    /// Fewer bytes than an Ethernet header (the count).
    case tooShort(Int)
}
