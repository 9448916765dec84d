/// A `NOTIFY * HTTP/1.1` announcement: a service is alive (with where to reach it) or leaving.
public struct SSDPNotification: Hashable, Sendable {
    /// The `NTS` header.
    public enum Subtype: String, Hashable, Sendable {
        /// `ssdp:alive`: the service is reachable at `LOCATION` for `max-age` seconds.
        case alive = "ssdp:alive"
        /// `ssdp:byebye`: the service is leaving; forget the USN now.
        case byebye = "ssdp:byebye"
    }

    /// `HOST`: the group and port the message was sent to, e.g. `239.255.255.250:1900`.
    public var host: String
    /// `NT`: the notification type (Thali's is `http://www.thaliproject.org/ssdp`).
    public var notificationType: String
    /// `NTS`.
    public var subtype: Subtype
    /// `USN`: the unique service name.
    public var uniqueServiceName: String
    /// `LOCATION` (required for alive, absent for byebye).
    public var location: String?
    /// `max-age` from `CACHE-CONTROL`, in seconds (required for alive, absent for byebye).
    public var maxAge: Int?
    /// `SERVER` (optional).
    public var server: String?

    /// An `ssdp:alive` announcement.
    public static func alive(host: String, notificationType: String, uniqueServiceName: String, location: String,
                             maxAge: Int, server: String?) -> SSDPNotification {
        SSDPNotification(host: host, notificationType: notificationType, subtype: .alive,
                         uniqueServiceName: uniqueServiceName, location: location, maxAge: maxAge, server: server)
    }

    /// An `ssdp:byebye` announcement.
    public static func byebye(host: String, notificationType: String, uniqueServiceName: String) -> SSDPNotification {
        SSDPNotification(host: host, notificationType: notificationType, subtype: .byebye,
                         uniqueServiceName: uniqueServiceName, location: nil, maxAge: nil, server: nil)
    }

    /// Creates a notification from its fields.
    public init(host: String, notificationType: String, subtype: Subtype, uniqueServiceName: String,
                location: String?, maxAge: Int?, server: String?) {
        self.host = host
        self.notificationType = notificationType
        self.subtype = subtype
        self.uniqueServiceName = uniqueServiceName
        self.location = location
        self.maxAge = maxAge
        self.server = server
    }

    init(_ block: SSDPHeaderBlock, limits: SSDPParserLimits) throws(SSDPParseError) {
        host = try block.required("host")
        notificationType = try block.required("nt")
        uniqueServiceName = try block.required("usn")
        let nts = try block.required("nts")
        guard let subtype = Subtype(rawValue: nts) else {
            throw SSDPParseError(.invalidHeaderValue(header: "NTS", value: String(nts.prefix(64))))
        }
        self.subtype = subtype
        guard SSDPValue.isIdentifier(notificationType, limit: limits.maxIdentifierBytes) else {
            throw SSDPParseError(.invalidHeaderValue(header: "NT", value: String(notificationType.prefix(64))))
        }
        guard SSDPValue.isIdentifier(uniqueServiceName, limit: limits.maxIdentifierBytes) else {
            throw SSDPParseError(.invalidHeaderValue(header: "USN", value: String(uniqueServiceName.prefix(64))))
        }
        server = block.value("server")
        switch subtype {
        case .alive:
            let location = try block.required("location")
            guard SSDPValue.isIdentifier(location, limit: limits.maxIdentifierBytes) else {
                throw SSDPParseError(.invalidHeaderValue(header: "LOCATION", value: String(location.prefix(64))))
            }
            self.location = location
            let cacheControl = try block.required("cache-control")
            guard let maxAge = SSDPValue.maxAge(cacheControl) else {
                throw SSDPParseError(.invalidHeaderValue(header: "CACHE-CONTROL", value: String(cacheControl.prefix(64))))
            }
            self.maxAge = maxAge
        case .byebye:
            location = nil
            maxAge = nil
        }
    }

    var headerBlock: SSDPHeaderBlock {
        var headers: [(name: String, value: String)] = [("HOST", host), ("NT", notificationType), ("NTS", subtype.rawValue),
                                                        ("USN", uniqueServiceName)]
        if let location { headers.append(("LOCATION", location)) }
        if let maxAge { headers.append(("CACHE-CONTROL", "max-age=\(maxAge)")) }
        if let server { headers.append(("SERVER", server)) }
        return SSDPHeaderBlock(startLine: SSDPMessage.notifyLine, headers: headers)
    }
}
