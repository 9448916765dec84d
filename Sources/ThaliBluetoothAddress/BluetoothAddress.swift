/// A Bluetooth device address (BD_ADDR), 48 bits.
///
/// `octets` are in the order people write them ("AA:BB:CC:DD:EE:FF" → `[0xAA, 0xBB, ...]`), which is
/// also the order Thali puts them on the wire in advertisements. The radio and the kernel's `bdaddr_t`
/// keep them reversed (least significant first); `reversedOctets` gives that form.
public struct BluetoothAddress: Hashable, Sendable, CustomStringConvertible, Comparable {
    /// The address as a 48-bit number, the first written octet most significant.
    public let value: UInt64

    /// The number of octets in a Bluetooth address.
    public static let octetCount = 6

    /// `00:00:00:00:00:00`, the kernel's `BDADDR_ANY`: no particular adapter.
    public static let any = BluetoothAddress(value: 0)

    private init(value: UInt64) {
        self.value = value
    }

    /// Creates an address from its six octets in written order; `nil` unless there are exactly six.
    public init?(octets: some Collection<UInt8>) {
        guard octets.count == Self.octetCount else { return nil }
        self.value = octets.reduce(0) { ($0 << 8) | UInt64($1) }
    }

    /// Parses the usual text form `AA:BB:CC:DD:EE:FF` (either case; `-` also accepted as separator).
    public init?(_ text: some StringProtocol) {
        let parts = text.split(separator: ":", omittingEmptySubsequences: false)
        let pieces = parts.count == 6 ? parts : text.split(separator: "-", omittingEmptySubsequences: false)
        guard pieces.count == 6 else { return nil }
        var octets: [UInt8] = []
        for piece in pieces {
            guard piece.count == 2, let octet = UInt8(piece, radix: 16) else { return nil }
            octets.append(octet)
        }
        self.init(octets: octets)
    }

    /// The six octets in written order.
    public var octets: [UInt8] {
        (0..<Self.octetCount).map { UInt8(truncatingIfNeeded: value >> (8 * UInt64(Self.octetCount - 1 - $0))) }
    }

    /// A loopback address (`127.D.E.F`, from the last three octets; never 127.0.0.1) that stands for this
    /// device when its relayed connections reach a local port: the port's per-source admission limits
    /// then count each Bluetooth peer apart instead of all of them as 127.0.0.1. Linux routes all of
    /// 127/8 to the loopback interface. Devices that share their last three octets share a source.
    public var loopbackSource: String {
        let last = octets.suffix(3).map(String.init)
        let text = "127.\(last.joined(separator: "."))"
        return text == "127.0.0.1" || text == "127.0.0.0" ? "127.0.0.2" : text
    }

    /// The six octets least significant first, as in the kernel's `bdaddr_t` and on the air.
    public var reversedOctets: [UInt8] { octets.reversed() }

    /// `AA:BB:CC:DD:EE:FF`, upper case, as BlueZ prints it.
    public var description: String {
        octets.map { hex2($0) }.joined(separator: ":")
    }

    public static func < (lhs: BluetoothAddress, rhs: BluetoothAddress) -> Bool { lhs.value < rhs.value }
}

@inline(__always)
func hex2(_ byte: UInt8) -> String {
    let digits = Array("0123456789ABCDEF")
    return String([digits[Int(byte >> 4)], digits[Int(byte & 0x0F)]])
}
