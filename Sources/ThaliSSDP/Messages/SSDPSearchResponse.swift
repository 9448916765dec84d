/// An `HTTP/1.1 200 OK` datagram answering an M-SEARCH, sent by unicast to the searcher.
public struct SSDPSearchResponse: Hashable, Sendable {
    /// `CACHE-CONTROL` `max-age`, in seconds.
    public var maxAge: Int
    /// `DATE` (optional; RFC 1123 date).
    public var date: String?
    /// `LOCATION`.
    public var location: String
    /// `SERVER` (optional).
    public var server: String?
    /// `ST`: the search target this answer is for.
    public var searchTarget: String
    /// `USN`.
    public var uniqueServiceName: String

    /// Creates a search response.
    public init(maxAge: Int, date: String?, location: String, server: String?, searchTarget: String,
                uniqueServiceName: String) {
        self.maxAge = maxAge
        self.date = date
        self.location = location
        self.server = server
        self.searchTarget = searchTarget
        self.uniqueServiceName = uniqueServiceName
    }

    init(_ block: SSDPHeaderBlock, limits: SSDPParserLimits) throws(SSDPParseError) {
        let cacheControl = try block.required("cache-control")
        guard let maxAge = SSDPValue.maxAge(cacheControl) else {
            throw SSDPParseError(.invalidHeaderValue(header: "CACHE-CONTROL", value: String(cacheControl.prefix(64))))
        }
        self.maxAge = maxAge
        date = block.value("date")
        location = try block.required("location")
        server = block.value("server")
        searchTarget = try block.required("st")
        uniqueServiceName = try block.required("usn")
        for (name, value) in [("LOCATION", location), ("ST", searchTarget), ("USN", uniqueServiceName)]
        where !SSDPValue.isIdentifier(value, limit: limits.maxIdentifierBytes) {
            throw SSDPParseError(.invalidHeaderValue(header: name, value: String(value.prefix(64))))
        }
    }

    var headerBlock: SSDPHeaderBlock {
        var headers: [(name: String, value: String)] = [("CACHE-CONTROL", "max-age=\(maxAge)")]
        if let date { headers.append(("DATE", date)) }
        headers.append(("EXT", ""))
        headers.append(("LOCATION", location))
        if let server { headers.append(("SERVER", server)) }
        headers.append(("ST", searchTarget))
        headers.append(("USN", uniqueServiceName))
        return SSDPHeaderBlock(startLine: SSDPMessage.responseLine, headers: headers)
    }
}
