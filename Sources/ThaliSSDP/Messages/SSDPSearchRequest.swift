/// An `M-SEARCH * HTTP/1.1` request: "who offers this search target?".
public struct SSDPSearchRequest: Hashable, Sendable {
    /// The only `MAN` value SSDP defines, quotes included.
    public static let discoverExtension = "\"ssdp:discover\""
    /// The search target that matches every service.
    public static let allTargets = "ssdp:all"

    /// `HOST`: the group and port, e.g. `239.255.255.250:1900`.
    public var host: String
    /// `MX`: the longest delay, in seconds, the searcher allows before an answer.
    public var maxWaitSeconds: Int
    /// `ST`: the search target.
    public var searchTarget: String
    /// `S`: the searcher's own USN (Thali sends it; other stacks do not).
    public var searcherServiceName: String?
    /// `USER-AGENT` (optional).
    public var userAgent: String?

    /// Creates a search request.
    public init(host: String, maxWaitSeconds: Int, searchTarget: String, searcherServiceName: String? = nil,
                userAgent: String? = nil) {
        self.host = host
        self.maxWaitSeconds = maxWaitSeconds
        self.searchTarget = searchTarget
        self.searcherServiceName = searcherServiceName
        self.userAgent = userAgent
    }

    init(_ block: SSDPHeaderBlock, limits: SSDPParserLimits) throws(SSDPParseError) {
        host = try block.required("host")
        let man = try block.required("man")
        guard man == Self.discoverExtension else {
            throw SSDPParseError(.invalidHeaderValue(header: "MAN", value: String(man.prefix(64))))
        }
        let mx = try block.required("mx")
        guard let maxWait = SSDPValue.decimal(Substring(mx), maxDigits: 3) else {
            throw SSDPParseError(.invalidHeaderValue(header: "MX", value: String(mx.prefix(64))))
        }
        maxWaitSeconds = maxWait
        searchTarget = try block.required("st")
        guard SSDPValue.isIdentifier(searchTarget, limit: limits.maxIdentifierBytes) else {
            throw SSDPParseError(.invalidHeaderValue(header: "ST", value: String(searchTarget.prefix(64))))
        }
        searcherServiceName = block.value("s")
        if let searcher = searcherServiceName, !SSDPValue.isIdentifier(searcher, limit: limits.maxIdentifierBytes) {
            throw SSDPParseError(.invalidHeaderValue(header: "S", value: String(searcher.prefix(64))))
        }
        userAgent = block.value("user-agent")
    }

    var headerBlock: SSDPHeaderBlock {
        var headers: [(name: String, value: String)] = [("HOST", host), ("MAN", Self.discoverExtension),
                                                        ("MX", String(maxWaitSeconds)), ("ST", searchTarget)]
        if let searcherServiceName { headers.append(("S", searcherServiceName)) }
        if let userAgent { headers.append(("USER-AGENT", userAgent)) }
        return SSDPHeaderBlock(startLine: SSDPMessage.searchLine, headers: headers)
    }
}
