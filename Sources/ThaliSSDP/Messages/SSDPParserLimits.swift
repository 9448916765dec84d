/// Bounds the SSDP parser enforces before it looks at a datagram's meaning.
///
/// SSDP arrives unsolicited from anyone on the multicast group, so every datagram is hostile input: these
/// bounds keep the cost of rejecting one small and constant.
public struct SSDPParserLimits: Hashable, Sendable {
    /// The largest datagram accepted, in bytes. Real SSDP messages are a few hundred bytes; UPnP 1.1 asks
    /// senders to stay within one Ethernet frame. Larger datagrams are dropped unread.
    public var maxDatagramBytes: Int
    /// The most header lines accepted in one message; a Thali message has at most nine.
    public var maxHeaderCount: Int
    /// The longest USN, search target or notification type accepted, in bytes.
    public var maxIdentifierBytes: Int

    /// Defaults: 1,500-byte datagrams, 24 headers, 256-byte identifiers.
    public init(maxDatagramBytes: Int = 1500, maxHeaderCount: Int = 24, maxIdentifierBytes: Int = 256) {
        self.maxDatagramBytes = maxDatagramBytes
        self.maxHeaderCount = maxHeaderCount
        self.maxIdentifierBytes = maxIdentifierBytes
    }
}
