/// A binding through which the peer finds contacts and reaches their port: Wi-Fi and Bluetooth are
/// built in, and an app that adds its own binding (``PeerBindingFactory``) names it with a kind of its
/// own. A link tries a contact's bindings in ``preference`` order, the faster first.
///
/// Kinds are equal when their names are: the name is what events, the status and JSON carry (coded
/// as `RawRepresentable`: the name alone, decoded with the built-in kind's preference or 50).
public struct PeerBindingKind: RawRepresentable, Sendable, Hashable, Codable, CustomStringConvertible {
    /// SSDP on the pinned interface; the contact's port over IP. Tried first.
    public static let wifi = PeerBindingKind(rawValue: "wifi", preference: 0)
    /// BLE discovery through bluetoothd; the contact's port through an RFCOMM relay.
    public static let bluetooth = PeerBindingKind(rawValue: "bluetooth", preference: 100)

    /// The kind's name: `wifi`, `bluetooth`, or a binding's own (lower-case letters, digits and `-`
    /// make good names; ``PeerLocation`` writes it before a colon).
    public let rawValue: String
    /// Where the kind comes in the order a link tries bindings: lower first. Wi-Fi is 0, Bluetooth
    /// 100; a kind decoded from its name alone has the built-in kind's preference, else 50.
    public let preference: Int

    /// A kind named `rawValue`, tried in `preference` order.
    public init(rawValue: String, preference: Int) {
        self.rawValue = rawValue
        self.preference = preference
    }

    /// The built-in kind of that name, or a binding's own with preference 50.
    public init(rawValue: String) {
        switch rawValue {
        case Self.wifi.rawValue: self = .wifi
        case Self.bluetooth.rawValue: self = .bluetooth
        default: self.init(rawValue: rawValue, preference: 50)
        }
    }

    /// Whether a link tries `self` before `other`: by preference, then by name (a fixed order).
    func tryFirst(_ other: PeerBindingKind) -> Bool {
        (preference, rawValue) < (other.preference, other.rawValue)
    }

    public static func == (lhs: PeerBindingKind, rhs: PeerBindingKind) -> Bool { lhs.rawValue == rhs.rawValue }
    public func hash(into hasher: inout Hasher) { hasher.combine(rawValue) }

    /// The name.
    public var description: String { rawValue }
}
