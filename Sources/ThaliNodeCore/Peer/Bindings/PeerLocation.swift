@_exported import ThaliBluetoothAddress
import ThaliSSDP

/// Where a peer is found, by binding: the SSDP `LOCATION` it announces over Wi-Fi, or its Bluetooth
/// address. Events and the status name peers by it; ``description`` is the text form `thali-node run`
/// prints (the location URL, or `bluetooth:` and the address).
public enum PeerLocation: Sendable, Hashable, CustomStringConvertible {
    /// A peer heard over SSDP, serving its beacons and PSK-TLS at this location.
    case wifi(BeaconLocation)
    /// A peer heard over BLE, reached over RFCOMM at this address.
    case bluetooth(BluetoothAddress)

    /// The binding the peer was found over.
    public var binding: PeerBindingKind {
        switch self {
        case .wifi: .wifi
        case .bluetooth: .bluetooth
        }
    }

    /// `http://host:port/NotificationBeacons`, or `bluetooth:AA:BB:CC:DD:EE:FF`.
    public var description: String {
        switch self {
        case .wifi(let location): location.description
        case .bluetooth(let address): "bluetooth:\(address)"
        }
    }

    /// Parses the text form of ``description``; nil for anything else.
    public init?(_ text: String) {
        if text.hasPrefix("bluetooth:") {
            guard let address = BluetoothAddress(text.dropFirst("bluetooth:".count)) else { return nil }
            self = .bluetooth(address)
        } else {
            guard let location = BeaconLocation(parsing: text) else { return nil }
            self = .wifi(location)
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
