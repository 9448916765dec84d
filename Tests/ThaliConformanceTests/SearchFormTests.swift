import NIOCore
import Testing
import ThaliSSDP

@testable import ThaliConformance

/// `target/ssdp/search-form` [SSDP-2.6]: the judgement of the M-SEARCH datagrams an implementation
/// multicasts, fed the bytes ThaliSSDP writes and hand-written ones that break the rule.
@Suite("Conformance: an implementation's searches")
struct SearchFormTests {
    static let host = "239.255.255.250:41999"
    static let nt = ThaliServiceName.notificationType
    static let implementation = try! SocketAddress(ipAddress: "127.0.0.1", port: 40_000)

    static func alive(_ usn: String) -> [UInt8] {
        SSDPMessage.notification(.alive(host: host, notificationType: nt, uniqueServiceName: usn,
                                        location: "http://127.0.0.1:40001/NotificationBeacons", maxAge: 5, server: nil)).serialize()
    }

    static func byebye(_ usn: String) -> [UInt8] {
        SSDPMessage.notification(.byebye(host: host, notificationType: nt, uniqueServiceName: usn)).serialize()
    }

    /// A search as ThaliSSDP writes it.
    static func search(searcher: String?, host: String = host) -> [UInt8] {
        SSDPMessage.search(SSDPSearchRequest(host: host, maxWaitSeconds: 3, searchTarget: nt, searcherServiceName: searcher,
                                             userAgent: "Linux UPnP/1.1 thali-swift/1.0")).serialize()
    }

    static func judge(_ datagrams: [[UInt8]], from sender: SocketAddress = implementation) -> (holds: Bool, actual: String)? {
        var heard = ImplementationSearches(host: host)
        for datagram in datagrams { heard.consider(datagram, from: sender) }
        return heard.judge()
    }

    @Test("searches with S its current USN while it advertises, and without S before it does, hold")
    func conforming() throws {
        let usn = ThaliServiceName.makeUniqueServiceName()
        let early = try #require(Self.judge([Self.search(searcher: nil), Self.alive(usn), Self.search(searcher: usn)]))
        #expect(early.holds, "\(early.actual)")
        #expect(early.actual.contains("S its current USN") && early.actual.contains("none with S while it advertised nothing"))
        // Withdrawn by a byebye: it advertises nothing again, so no S is right.
        #expect(Self.judge([Self.alive(usn), Self.byebye(usn), Self.search(searcher: nil)])?.holds == true)
        // S naming the USN it announces just after its search.
        #expect(Self.judge([Self.search(searcher: usn), Self.alive(usn)])?.holds == true)
    }

    @Test("no S while it advertises, another S, an S it never announced, HOST of another port, a broken grammar: each fails, named")
    func broken() throws {
        let usn = ThaliServiceName.makeUniqueServiceName(), other = ThaliServiceName.makeUniqueServiceName()
        let cases: [([[UInt8]], String)] = [
            ([Self.alive(usn), Self.search(searcher: nil)], "no S while it advertised \(usn)"),
            ([Self.alive(usn), Self.search(searcher: other)], "S \(other) while it advertised \(usn)"),
            ([Self.search(searcher: other)], "S \(other) names no USN it announced"),
            ([Self.search(searcher: nil, host: "239.255.255.250:1900")], "HOST 239.255.255.250:1900, not \(Self.host)"),
            ([Array("M-SEARCH * HTTP/1.1\r\nHOST: \(Self.host)\r\nMAN: ssdp:discover\r\nMX: 3\r\nST: \(Self.nt)\r\n\r\n".utf8)], "MAN"),
            ([Array("M-SEARCH * HTTP/1.1\r\nHOST: \(Self.host)\r\nMAN: \"ssdp:discover\"\r\nST: \(Self.nt)\r\n\r\n".utf8)], "MX"),
            ([Array("M-SEARCH * HTTP/1.1\nHOST: \(Self.host)\nMAN: \"ssdp:discover\"\nMX: 3\nST: \(Self.nt)\n\n".utf8)], "grammar"),
        ]
        for (datagrams, problem) in cases {
            let judged = try #require(Self.judge(datagrams), "\(problem)")
            #expect(!judged.holds && judged.actual.contains(problem), "\(judged.actual)")
        }
    }

    @Test("nothing to judge: no search, a search for another ST, the suite's own senders, a broken search for another ST")
    func nothingToJudge() {
        #expect(Self.judge([Self.alive(ThaliServiceName.makeUniqueServiceName())]) == nil)
        let upnp = SSDPMessage.search(SSDPSearchRequest(host: Self.host, maxWaitSeconds: 3, searchTarget: "ssdp:all")).serialize()
        #expect(Self.judge([upnp, Array("M-SEARCH * HTTP/1.1\r\nST: upnp:rootdevice\r\n\r\n".utf8)]) == nil)
        var heard = ImplementationSearches(host: Self.host)
        heard.ignore(Self.implementation)
        heard.consider(Self.search(searcher: "uuid:not-ours"), from: Self.implementation)
        #expect(heard.judge() == nil)
        // Another socket of the same address is not the suite's: its alive still sets the current USN.
        let usn = ThaliServiceName.makeUniqueServiceName()
        heard.consider(Self.alive(usn), from: try! SocketAddress(ipAddress: "127.0.0.1", port: 40_002))
        heard.consider(Self.search(searcher: nil), from: try! SocketAddress(ipAddress: "127.0.0.1", port: 40_003))
        #expect(heard.judge()?.actual.contains("no S while it advertised \(usn)") == true)
    }

    @Test("a search with S not yet announced awaits the announcement; the announcement ends the wait")
    func awaitsAnnouncement() {
        let usn = ThaliServiceName.makeUniqueServiceName()
        var heard = ImplementationSearches(host: Self.host)
        heard.consider(Self.search(searcher: usn), from: Self.implementation)
        #expect(heard.heardAny && heard.awaitsAnnouncement)
        heard.consider(Self.alive(usn), from: Self.implementation)
        #expect(!heard.awaitsAnnouncement)
    }
}
