@_exported import ThaliBluetoothAddress
// `NodeIdentity` returns and `ThaliPeer.init` takes a `PrivateKey`: an app names it without adding ThaliBeacons.
@_exported import struct ThaliBeacons.PrivateKey
@_exported import struct ThaliBeacons.PublicKey
import ThaliSSDP

/// Where a peer is found, by binding: the SSDP `LOCATION` it announces over Wi-Fi, its Bluetooth
/// address, or what an app's own binding calls it. Events and the status name peers by it;
/// ``description`` is the text form `thali-node run` prints (the location URL, `bluetooth:` and the
/// address, or the binding's name, a colon and its address).
public enum PeerLocation: Sendable, Hashable, CustomStringConvertible {
    /// A peer heard over SSDP, serving its beacons and PSK-TLS at this location.
    case wifi(BeaconLocation)
    /// A peer heard over BLE, reached over RFCOMM at this address.
    case bluetooth(BluetoothAddress)
    /// A peer found by an app's own binding of `kind`, at `address` in the binding's own words.
    case other(PeerBindingKind, address: String)

    /// The binding the peer was found over.
    public var binding: PeerBindingKind {
        switch self {
        case .wifi: .wifi
        case .bluetooth: .bluetooth
        case .other(let kind, _): kind
        }
    }

    /// `http://host:port/NotificationBeacons`, `bluetooth:AA:BB:CC:DD:EE:FF`, or `KIND:ADDRESS`.
    public var description: String {
        switch self {
        case .wifi(let location): location.description
        case .bluetooth(let address): "bluetooth:\(address)"
        case .other(let kind, let address): "\(kind.rawValue):\(address)"
        }
    }

    /// Parses the text form of ``description``; nil for anything else. `KIND:ADDRESS` with a kind
    /// other than `http`, `wifi` and `bluetooth` is a binding's own (``other(_:address:)``).
    public init?(_ text: String) {
        if text.hasPrefix("bluetooth:") {
            guard let address = BluetoothAddress(text.dropFirst("bluetooth:".count)) else { return nil }
            self = .bluetooth(address)
        } else if let location = BeaconLocation(parsing: text) {
            self = .wifi(location)
        } else if let colon = text.firstIndex(of: ":"), colon != text.startIndex, text.index(after: colon) != text.endIndex {
            let kind = PeerBindingKind(rawValue: String(text[..<colon]))
            guard ![PeerBindingKind.wifi, .bluetooth, PeerBindingKind(rawValue: "http")].contains(kind) else { return nil }
            self = .other(kind, address: String(text[text.index(after: colon)...]))
        } else {
            return nil
        }
    }
}

extension PeerLocation: Codable {
    /// Decodes the text form (``init(_:)``).
    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        let text = try container.decode(String.self)
        guard let location = PeerLocation(text) else {
            throw DecodingError.dataCorruptedError(in: container, debugDescription: "not a peer location: \(text)")
        }
        self = location
    }

    /// Encodes the text form (``description``).
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(description)
    }
}
