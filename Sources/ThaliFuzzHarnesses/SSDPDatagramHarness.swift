import ThaliSSDP

/// SSDP datagrams through the strict parser.
///
/// Invariants: a datagram over the size limit is refused before parsing; a parsed message serialises to
/// bytes that parse to the same message, and serialising that again gives the same bytes. Serialising
/// normalises (one space after each header's colon), so it may add one byte per header and no more: the
/// re-parse allows for that much over the size limit.
enum SSDPDatagramHarness {
    static let name = "ssdp-datagram"
    static let limits = SSDPParserLimits()

    static let harness = FuzzHarness(name: name, summary: "SSDP NOTIFY, M-SEARCH and search responses", seeds: seeds) {
        (input: inout FuzzInput) throws(FuzzInvariantViolation) in
        let datagram = input.rest()
        let message: SSDPMessage
        do {
            message = try SSDPMessage.parse(datagram, limits: limits)
        } catch {
            return
        }
        try check(datagram.count <= limits.maxDatagramBytes, name, "parsed a datagram of \(datagram.count) bytes")
        let serialized = message.serialize()
        try check(serialized.count <= datagram.count + limits.maxHeaderCount, name,
                  "serialising grew \(datagram.count) bytes to \(serialized.count)")
        var normalised = limits
        normalised.maxDatagramBytes += limits.maxHeaderCount
        switch Result(catching: { () throws(SSDPParseError) in try SSDPMessage.parse(serialized, limits: normalised) }) {
        case .success(let again):
            try check(again == message, name, "re-parsed message differs: \(message) vs \(again)")
            try check(again.serialize() == serialized, name, "serialisation is not stable")
        case .failure(let error):
            throw FuzzInvariantViolation(harness: name, detail: "our own serialisation does not parse: \(error)")
        }
    }

    static func seeds() -> [[UInt8]] {
        let usn = "USN: data:3f2c1a9e-6b7d-4e21-9c3a-0d5e8f7a6b10:0\r\n"
        let texts = [
            "NOTIFY * HTTP/1.1\r\nHOST: 239.255.255.250:1900\r\nNT: http://www.thaliproject.org/ssdp\r\nNTS: ssdp:alive\r\n"
                + usn + "LOCATION: http://10.0.0.2:4242/NotificationBeacons\r\nCACHE-CONTROL: max-age=60\r\nSERVER: x/1\r\n\r\n",
            "NOTIFY * HTTP/1.1\r\nHOST: 228.227.226.225:1900\r\nNT: http://www.thaliproject.org/ssdp\r\nNTS: ssdp:byebye\r\n"
                + usn + "\r\n",
            "M-SEARCH * HTTP/1.1\r\nHOST: 239.255.255.250:1900\r\nMAN: \"ssdp:discover\"\r\nMX: 1\r\nST: http://www.thaliproject.org/ssdp\r\n\r\n",
            "HTTP/1.1 200 OK\r\nST: http://www.thaliproject.org/ssdp\r\n" + usn
                + "LOCATION: http://192.168.1.23:49152\r\nCACHE-CONTROL: max-age=1800\r\nDATE: Tue, 24 Nov 2026 10:00:00 GMT\r\n"
                + "SERVER: node.js/0.10.40 UPnP/1.1 node-ssdp/2.6.5\r\nEXT:\r\n\r\n",
        ]
        return texts.map { Array($0.utf8) }
    }
}
