/// Where a peer serves its beacons: the `LOCATION` of a Thali announcement, `http://IPv4:PORT[/path]`.
///
/// Only IPv4 literals are accepted (a LOCATION never triggers a name lookup), and whatever path the peer
/// sent, the client always requests `/NotificationBeacons` (the deployed Thali sent no path at all).
public struct BeaconLocation: Hashable, Sendable, CustomStringConvertible {
    /// The path every beacon request uses.
    public static let notificationBeaconsPath = "/NotificationBeacons"

    /// The peer's IPv4 address, dotted quad.
    public var host: String
    /// The peer's TCP port.
    public var port: Int

    /// Creates a location from an address and port.
    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    /// Parses a LOCATION value; nil unless it is `http://a.b.c.d[:port][/path]`.
    public init?(parsing text: String) {
        guard text.utf8.count <= 256, text.lowercased().hasPrefix("http://") else { return nil }
        let rest = text.dropFirst("http://".count)
        let authority = rest.prefix(while: { $0 != "/" })
        let hostPart: Substring
        var port = 80
        if let colon = authority.firstIndex(of: ":") {
            hostPart = authority[..<colon]
            guard let parsed = SSDPValue.decimal(authority[authority.index(after: colon)...], maxDigits: 5),
                (1...65535).contains(parsed)
            else { return nil }
            port = parsed
        } else {
            hostPart = authority
        }
        guard let address = IPv4Text(hostPart) else { return nil }
        self.host = address.text
        self.port = port
    }

    /// `http://host:port/NotificationBeacons`.
    public var description: String { "http://\(host):\(port)\(Self.notificationBeaconsPath)" }
}

/// A strict dotted-quad IPv4 address: four decimal octets, no leading zeros (which some parsers read as octal).
struct IPv4Text: Hashable, Sendable {
    let octets: [UInt8]
    var text: String { octets.map(String.init).joined(separator: ".") }

    init?(_ text: Substring) {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 4 else { return nil }
        var octets: [UInt8] = []
        for part in parts {
            guard let value = SSDPValue.decimal(part, maxDigits: 3), value <= 255,
                part.count == 1 || part.first != "0"
            else { return nil }
            octets.append(UInt8(value))
        }
        self.octets = octets
    }
}
