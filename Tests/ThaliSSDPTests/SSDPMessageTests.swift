import Foundation
import Testing
import ThaliTestSupport

@testable import ThaliSSDP

private func bytes(_ text: String) -> [UInt8] { Array(text.utf8) }

private func parseError(_ text: String, limits: SSDPParserLimits = .init()) -> SSDPParseError.Reason? {
    do {
        _ = try SSDPMessage.parse(bytes(text), limits: limits)
        return nil
    } catch {
        return error.reason
    }
}

@Suite("SSDP message grammar")
struct SSDPMessageTests {
    static let alive = "NOTIFY * HTTP/1.1\r\nHOST: 239.255.255.250:1900\r\nNT: http://www.thaliproject.org/ssdp\r\n"
        + "NTS: ssdp:alive\r\nUSN: uuid:3f2c1a9e-6b7d-4e21-9c3a-0d5e8f7a6b10\r\n"
        + "LOCATION: http://10.0.0.2:4242/NotificationBeacons\r\nCACHE-CONTROL: max-age=60\r\nSERVER: x/1\r\n\r\n"

    @Test func parsesOurAliveAndSerialisesItBackByteForByte() throws {
        let message = try SSDPMessage.parse(bytes(Self.alive))
        guard case .notification(let notification) = message else { Issue.record("not a notification"); return }
        #expect(notification.subtype == .alive)
        #expect(notification.notificationType == ThaliServiceName.notificationType)
        #expect(notification.uniqueServiceName == "uuid:3f2c1a9e-6b7d-4e21-9c3a-0d5e8f7a6b10")
        #expect(notification.location == "http://10.0.0.2:4242/NotificationBeacons")
        #expect(notification.maxAge == 60)
        #expect(notification.server == "x/1")
        #expect(message.serialize() == bytes(Self.alive))
    }

    @Test func roundTripsEveryKind() throws {
        let messages: [SSDPMessage] = [
            .notification(.byebye(host: "239.255.255.250:1900", notificationType: "nt", uniqueServiceName: "uuid:x")),
            .search(SSDPSearchRequest(host: "239.255.255.250:1900", maxWaitSeconds: 3, searchTarget: "ssdp:all",
                                      searcherServiceName: "uuid:me", userAgent: "ua/1")),
            .searchResponse(SSDPSearchResponse(maxAge: 60, date: "Sat, 21 Nov 2026 10:00:00 GMT",
                                               location: "http://1.2.3.4:5/NotificationBeacons", server: "s",
                                               searchTarget: "st", uniqueServiceName: "uuid:y")),
        ]
        for message in messages {
            #expect(try SSDPMessage.parse(message.serialize()) == message)
        }
    }

    @Test func acceptsTheDeployedNodeSSDPMessages() throws {
        let path = PackagePaths.root() + "/Tests/ThaliSSDPTests/Reference/ssdp-node-ssdp-messages.json"
        let records = try #require(
            try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: path))) as? [[String: String]])
        #expect(records.count == 3)
        var kinds: [String] = []
        for record in records {
            let text = try #require(record["text"])
            switch try SSDPMessage.parse(bytes(text)) {
            case .notification(let notification):
                kinds.append(notification.subtype.rawValue)
                #expect(notification.uniqueServiceName == "data:3f2c1a9e-6b7d-4e21-9c3a-0d5e8f7a6b10:0")
                #expect(ThaliServiceName.isThaliServiceName(notification.uniqueServiceName))
                if notification.subtype == .alive {
                    #expect(notification.maxAge == 1800)
                    // No path in the deployed LOCATION; the client still requests /NotificationBeacons.
                    let location = try #require(notification.location.flatMap(BeaconLocation.init(parsing:)))
                    #expect(location == BeaconLocation(host: "192.168.1.23", port: 49152))
                    #expect(location.description == "http://192.168.1.23:49152/NotificationBeacons")
                }
            case .searchResponse(let response):
                kinds.append("response")
                #expect(response.searchTarget == ThaliServiceName.notificationType)
                #expect(response.maxAge == 1800)
                #expect(response.date == "<now>")
            case .search:
                Issue.record("no M-SEARCH in the recording")
            }
        }
        #expect(kinds == ["ssdp:alive", "ssdp:byebye", "response"])
    }

    @Test func headerNamesAreCaseInsensitiveAndWhitespaceIsOptional() throws {
        let text = "NOTIFY * HTTP/1.1\r\nhost:239.255.255.250:1900\r\nnt:\tnt-x \r\nnts:ssdp:byebye\r\nusn:   uuid:a\r\n\r\n"
        guard case .notification(let notification) = try SSDPMessage.parse(bytes(text)) else {
            Issue.record("not a notification"); return
        }
        #expect(notification.notificationType == "nt-x")
        #expect(notification.uniqueServiceName == "uuid:a")
        #expect(notification.subtype == .byebye)
    }

    @Test func maxAgeForms() {
        #expect(SSDPValue.maxAge("max-age=60") == 60)
        #expect(SSDPValue.maxAge("max-age = 60") == 60)  // the seed's own spelling
        #expect(SSDPValue.maxAge("no-cache, MAX-AGE=5") == 5)
        #expect(SSDPValue.maxAge("max-age=-1") == nil)
        #expect(SSDPValue.maxAge("max-age=1e3") == nil)
        #expect(SSDPValue.maxAge("max-age=9999999999") == nil)
        #expect(SSDPValue.maxAge("no-cache") == nil)
    }

    @Test func rejectsAwkwardInputWithTypedReasons() {
        let base = Self.alive
        #expect(parseError(base.replacingOccurrences(of: "\r\n", with: "\n")) == .badLineEnding(offset: 17))
        // (Byte-wise: "\r\n" is a single Character to String.dropLast.)
        #expect(parseError(String(decoding: bytes(base).dropLast(2), as: UTF8.self)) == .badLineEnding(offset: base.utf8.count - 2))
        #expect(parseError(String(decoding: bytes(base).dropLast(1), as: UTF8.self)) == .badLineEnding(offset: base.utf8.count - 2))
        #expect(parseError("") == .badLineEnding(offset: 0))
        #expect(parseError("\r\n") == .badLineEnding(offset: 2))
        #expect(parseError(base + "body") == .unexpectedBody(bytes: 4))
        #expect(parseError(base.replacingOccurrences(of: "NOTIFY *", with: "NOTIFY  *")) == .unknownStartLine("NOTIFY  * HTTP/1.1"))
        #expect(parseError(base.replacingOccurrences(of: "HTTP/1.1", with: "HTTP/1.0")) == .unknownStartLine("NOTIFY * HTTP/1.0"))
        #expect(parseError(base.replacingOccurrences(of: "SERVER: x/1", with: "SERVER x/1")) == .malformedHeader(line: 8))
        #expect(parseError(base.replacingOccurrences(of: "SERVER: x/1", with: ": x/1")) == .malformedHeader(line: 8))
        #expect(parseError(base.replacingOccurrences(of: "SERVER: x/1", with: "SER VER: x/1")) == .malformedHeader(line: 8))
        #expect(parseError(base.replacingOccurrences(of: "SERVER: x/1", with: " folded")) == .malformedHeader(line: 8))
        #expect(parseError(base.replacingOccurrences(of: "SERVER: x/1", with: "usn: uuid:b")) == .duplicateHeader("USN"))
        #expect(parseError(base.replacingOccurrences(of: "SERVER: x/1", with: "SERVER: x\u{0}1")) == .invalidByte(offset: base.utf8.count - 6, value: 0))
        #expect(parseError(base.replacingOccurrences(of: "SERVER: x/1", with: "SERVER: xé")) == .invalidByte(offset: base.utf8.count - 6, value: 0xC3))
        #expect(parseError(base.replacingOccurrences(of: "NTS: ssdp:alive", with: "NTS: ssdp:update")) == .invalidHeaderValue(header: "NTS", value: "ssdp:update"))
        #expect(parseError(base.replacingOccurrences(of: "CACHE-CONTROL: max-age=60\r\n", with: "")) == .missingHeader("CACHE-CONTROL"))
        #expect(parseError(base.replacingOccurrences(of: "LOCATION: http://10.0.0.2:4242/NotificationBeacons\r\n", with: "")) == .missingHeader("LOCATION"))
        #expect(parseError(base.replacingOccurrences(of: "USN: uuid:3f2c1a9e-6b7d-4e21-9c3a-0d5e8f7a6b10", with: "USN: a b")) == .invalidHeaderValue(header: "USN", value: "a b"))
        #expect(parseError(base.replacingOccurrences(of: "USN: uuid:3f2c1a9e-6b7d-4e21-9c3a-0d5e8f7a6b10", with: "USN:")) == .invalidHeaderValue(header: "USN", value: ""))
    }

    @Test func searchGrammar() {
        let search = "M-SEARCH * HTTP/1.1\r\nHOST: 239.255.255.250:1900\r\nMAN: \"ssdp:discover\"\r\nMX: 3\r\nST: ssdp:all\r\n\r\n"
        #expect(parseError(search) == nil)
        #expect(parseError(search.replacingOccurrences(of: "\"ssdp:discover\"", with: "ssdp:discover")) == .invalidHeaderValue(header: "MAN", value: "ssdp:discover"))
        #expect(parseError(search.replacingOccurrences(of: "MX: 3", with: "MX: -3")) == .invalidHeaderValue(header: "MX", value: "-3"))
        #expect(parseError(search.replacingOccurrences(of: "MX: 3", with: "MX: 1000")) == .invalidHeaderValue(header: "MX", value: "1000"))
        #expect(parseError(search.replacingOccurrences(of: "MX: 3\r\n", with: "")) == .missingHeader("MX"))
    }

    @Test func enforcesTheBoundsBeforeReading() {
        let limits = SSDPParserLimits(maxDatagramBytes: 100, maxHeaderCount: 3, maxIdentifierBytes: 10)
        #expect(parseError(String(repeating: "A", count: 101), limits: limits) == .datagramTooLarge(size: 101, limit: 100))
        #expect(parseError(Self.alive, limits: SSDPParserLimits(maxHeaderCount: 3)) == .tooManyHeaders(limit: 3))
        let longUSN = Self.alive.replacingOccurrences(of: "uuid:3f2c", with: "uuid:" + String(repeating: "f", count: 300))
        #expect(parseError(longUSN) == .invalidHeaderValue(header: "USN", value: String(("uuid:" + String(repeating: "f", count: 300)).prefix(64))))
        // A megabyte of garbage is refused by its size alone.
        #expect(parseError(String(repeating: "\r\n", count: 500_000)) == .datagramTooLarge(size: 1_000_000, limit: 1500))
    }

    @Test func everyTruncationOfAValidDatagramFailsCleanly() {
        let valid = bytes(Self.alive)
        for length in 0..<valid.count {
            #expect(throws: SSDPParseError.self) { try SSDPMessage.parse(valid[..<length]) }
        }
    }

    @Test func locationsAreStrict() {
        #expect(BeaconLocation(parsing: "http://10.1.2.3:80/x") == BeaconLocation(host: "10.1.2.3", port: 80))
        #expect(BeaconLocation(parsing: "HTTP://10.1.2.3") == BeaconLocation(host: "10.1.2.3", port: 80))
        #expect(BeaconLocation(parsing: "https://10.1.2.3:80/") == nil)
        #expect(BeaconLocation(parsing: "http://example.com:80/") == nil)  // never a name lookup
        #expect(BeaconLocation(parsing: "http://010.1.2.3:80/") == nil)  // octal-looking octet
        #expect(BeaconLocation(parsing: "http://10.1.2.256:80/") == nil)
        #expect(BeaconLocation(parsing: "http://10.1.2.3:0/") == nil)
        #expect(BeaconLocation(parsing: "http://10.1.2.3:65536/") == nil)
        #expect(BeaconLocation(parsing: "http://10.1.2.3:/") == nil)
        #expect(BeaconLocation(parsing: "http://user@10.1.2.3:80/") == nil)
        #expect(BeaconLocation(parsing: "http://10.1.2.3.4:80/") == nil)
    }

    @Test func thaliServiceNames() {
        #expect(ThaliServiceName.isThaliServiceName(ThaliServiceName.makeUniqueServiceName()))
        #expect(ThaliServiceName.isThaliServiceName("data:3f2c1a9e-6b7d-4e21-9c3a-0d5e8f7a6b10:12"))
        #expect(!ThaliServiceName.isThaliServiceName("data:3f2c1a9e-6b7d-4e21-9c3a-0d5e8f7a6b10"))
        #expect(!ThaliServiceName.isThaliServiceName("uuid:device-1::urn:schemas-upnp-org:device:Basic:1"))
        #expect(ThaliServiceName.makeUniqueServiceName() != ThaliServiceName.makeUniqueServiceName())
    }
}

@Suite("SSDP parser under random damage")
struct SSDPParserFuzzTests {
    /// Deterministic xorshift, so a failure reproduces.
    struct Generator: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 {
            state ^= state << 13
            state ^= state >> 7
            state ^= state << 17
            return state
        }
    }

    @Test func damagedDatagramsParseOrFailWithATypedErrorAndNeverMore() {
        var random = Generator(state: 0x5EED_7A11)
        let seeds = [SSDPMessageTests.alive,
                     "M-SEARCH * HTTP/1.1\r\nHOST: 239.255.255.250:1900\r\nMAN: \"ssdp:discover\"\r\nMX: 3\r\nST: ssdp:all\r\n\r\n"]
            .map { Array($0.utf8) }
        var accepted = 0
        var rejected = 0
        for round in 0..<20_000 {
            var bytes = seeds[round % seeds.count]
            for _ in 0..<Int.random(in: 1...4, using: &random) {
                let index = Int.random(in: 0..<bytes.count, using: &random)
                switch Int.random(in: 0..<4, using: &random) {
                case 0: bytes[index] = UInt8.random(in: 0...255, using: &random)
                case 1: bytes.remove(at: index)
                case 2: bytes.insert(UInt8.random(in: 0...255, using: &random), at: index)
                default: bytes.insert(contentsOf: bytes[index...].prefix(40), at: index)  // duplicate a run
                }
                if bytes.isEmpty { bytes = [0] }
            }
            do {
                let message = try SSDPMessage.parse(bytes)
                accepted += 1
                // Whatever is accepted re-serialises to something that parses to the same message.
                #expect(try SSDPMessage.parse(message.serialize()) == message)
            } catch {
                rejected += 1
            }
        }
        #expect(rejected > 0 && accepted > 0)  // the damage model exercises both outcomes
    }
}
