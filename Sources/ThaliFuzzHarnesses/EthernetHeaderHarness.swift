import ThaliNetLab
import ThaliSupport

/// The lab wire's only read of a frame (``EthernetHeader``, `Sources/ThaliNetLab`): any bytes a host
/// writes to its TAP device, then through one ``LinkDirection`` as the wire would.
///
/// Invariants: a header is read exactly when there are at least 14 bytes; its fields are those bytes
/// (addresses and EtherType re-encode to the first 14 bytes); multicast means the group bit without
/// broadcast; a link with nothing to add delivers the frame at once.
enum EthernetHeaderHarness {
    static let name = "ethernet-header"

    static let harness = FuzzHarness(name: name, summary: "Ethernet headers of frames the lab's wire forwards", seeds: seeds) {
        (input: inout FuzzInput) throws(FuzzInvariantViolation) in
        let bytes = input.rest()
        let header: EthernetHeader
        do throws(EthernetHeaderError) {
            header = try EthernetHeader(bytes)
        } catch {
            try check(bytes.count < EthernetHeader.length && error == .tooShort(bytes.count), name,
                      "\(bytes.count) bytes refused with \(error)")
            return
        }
        try check(bytes.count >= EthernetHeader.length, name, "a header read from \(bytes.count) bytes")
        func encoded(_ address: UInt64) -> [UInt8] { (0..<6).map { UInt8(truncatingIfNeeded: address >> (40 - 8 * $0)) } }
        let reencoded = encoded(header.destination) + encoded(header.source)
            + [UInt8(header.etherType >> 8), UInt8(header.etherType & 0xFF)]
        try check(reencoded == Array(bytes.prefix(EthernetHeader.length)), name, "the header does not re-encode to its bytes")
        try check(header.isMulticast == (bytes[0] & 1 == 1 && bytes.prefix(6) != [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]), name,
                  "multicast \(header.isMulticast) for destination \(bytes.prefix(6))")
        var direction = LinkDirection(profile: .unshaped)
        var random = SplitMix64(state: 1)
        let verdict = direction.admit(bytes: bytes.count, multicast: header.isMulticast, linkDown: false, now: 7, using: &random)
        try check(verdict == .deliver(at: 7), name, "an unshaped link gave \(verdict)")
    }

    static func seeds() -> [[UInt8]] {
        let arp: [UInt8] = [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x02, 0, 0, 0, 0, 1, 0x08, 0x06] + Array(repeating: 0, count: 28)
        let ssdp: [UInt8] = [0x01, 0x00, 0x5E, 0x7F, 0xFF, 0xFA, 0x02, 0, 0, 0, 0, 2, 0x08, 0x00] + Array(repeating: 0x45, count: 20)
        let unicast: [UInt8] = [0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2, 0x08, 0x00] + Array(repeating: 0x45, count: 40)
        return [arp, ssdp, unicast, Array(unicast.prefix(13))]
    }
}
