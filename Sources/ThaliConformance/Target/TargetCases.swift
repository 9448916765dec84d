import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import ThaliBeacons
import ThaliNodeCore
import ThaliSSDP

extension TargetConformance {
    /// The cases, in the order they are graded.
    public enum Cases {
        /// `target/ssdp/valid-fetched`: a well-formed alive from a new USN is fetched (the control: without
        /// it, the "nothing fetched" cases below prove nothing).
        public static let validFetched = ConformanceCase("target/ssdp/valid-fetched", "a well-formed alive of a new USN is fetched",
                                                         ["SSDP-3.6"])
        /// `target/ssdp/fetch-once-per-usn`: four more alives of that USN fetch it no more.
        public static let fetchOnce = ConformanceCase("target/ssdp/fetch-once-per-usn", "more alives of a fetched USN fetch it no more",
                                                      ["SSDP-5.1"])
        /// `target/beacons/no-match-no-connect`: a stream without a beacon for it leads to no connection.
        public static let noMatchNoConnect = ConformanceCase("target/beacons/no-match-no-connect",
                                                             "a stream without a beacon for it leads to no connection", ["BCN-4.8"])
        /// `target/ssdp/malformed-ignored`: datagrams that break the strict grammar are not acted on.
        public static let malformed = ConformanceCase("target/ssdp/malformed-ignored",
                                                      "alives that break the strict grammar (HTTP/1.0, bare LF, a header twice, NTS ssdp:update, no max-age, folded line, bytes after the end) are not fetched",
                                                      ["SSDP-3.1"])
        /// `target/ssdp/foreign-nt-ignored`: an alive of another NT is not fetched.
        public static let foreignNT = ConformanceCase("target/ssdp/foreign-nt-ignored", "an alive of another UPnP NT is not fetched", ["SSDP-3.2"])
        /// `target/ssdp/bad-usn-ignored`: an alive whose USN is not uuid:/data: is not fetched.
        public static let badUSN = ConformanceCase("target/ssdp/bad-usn-ignored", "alives whose USN is neither uuid:<UUID> nor data:<UUID>:<n> are not fetched",
                                                   ["SSDP-3.4"])
        /// `target/ssdp/spoofed-location-ignored`: an alive whose LOCATION host is not its source is not fetched.
        public static let spoofedLocation = ConformanceCase("target/ssdp/spoofed-location-ignored",
                                                            "an alive whose LOCATION names another host than its source is not fetched", ["SSDP-3.5"])
        /// `target/ssdp/forged-byebye-ignored`: a byebye from another address does not make it forget the peer.
        public static let forgedByebye = ConformanceCase("target/ssdp/forged-byebye-ignored",
                                                         "a byebye from another address does not withdraw the peer (its next alive fetches nothing)",
                                                         ["SSDP-5.2"])

        /// `target/beacons/tampered-no-connect`: our announcement for it with a flipped tag byte is fetched
        /// and leads to no connection.
        public static let tamperedNoConnect = ConformanceCase("target/beacons/tampered-no-connect",
                                                              "an announcement for it from a contact, one byte of its beacon's tag flipped, is fetched and leads to no connection",
                                                              ["BCN-4.8"])
        /// `target/beacons/stranger-first-no-connect`: an announcement whose first beacon is for it from a
        /// stranger (its flag verifies) and whose second is ours leads to no connection: the scan ends at
        /// the stranger's flag.
        public static let strangerFirstNoConnect = ConformanceCase("target/beacons/stranger-first-no-connect",
                                                                   "an announcement whose first beacon is for it from a stranger and whose second is ours, from a contact, is fetched and leads to no connection",
                                                                   ["BCN-4.6"])
        /// `target/beacons/match-connects`: a good announcement for it from a contact leads to a PSK-TLS
        /// connection (the control of the two cases around it).
        public static let matchConnects = ConformanceCase("target/beacons/match-connects",
                                                          "a good announcement for it from a contact is fetched and leads to a PSK-TLS session and delivery, unmarked (our server selects no ALPN)",
                                                          ["NODE-3.2", "BCN-4.7", "NODE-4.2"])
        /// `target/delivery/welcome`: on the session of match-connects, its delivery receiver answers our
        /// hello with welcome.
        public static let welcome = ConformanceCase("target/delivery/welcome",
                                                    "on the session of match-connects, its delivery stream answers our hello(4) with welcome",
                                                    ["NODE-1.22", "NODE-1.26"])
        /// `target/psk-tls/close-notify-first`: the session of match-connects, which it closes once delivery
        /// ends (it connected, and it received), ends with its close_notify before TCP closes.
        public static let closeNotifyFirst = ConformanceCase("target/psk-tls/close-notify-first",
                                                             "closing the session of match-connects once delivery ends, it sends close_notify before it closes TCP",
                                                             ["PSK-6.1"])
        /// `target/beacons/replay-no-connect`: the same announcement again from the same location, under a
        /// new USN, is fetched and leads to no connection.
        public static let replayNoConnect = ConformanceCase("target/beacons/replay-no-connect",
                                                            "the same announcement again from the same location, under a new USN, is fetched and leads to no connection",
                                                            ["BCN-4.5"])

        /// `target/psk-tls/small-group-refused`: connecting on a good beacon to a server that offers a
        /// 1536-bit DH group, it refuses with handshake_failure and sends no ClientKeyExchange.
        public static let smallGroupRefused = ConformanceCase("target/psk-tls/small-group-refused",
                                                              "offered a 1536-bit DH group after a good beacon, it refuses with a fatal handshake_failure, no ClientKeyExchange",
                                                              ["PSK-2.3"])

        /// `target/streams/delivery-header`: offered `thali-streams/1` by our server, its delivery stream
        /// starts with the header `delivery`.
        public static let deliveryHeader = ConformanceCase("target/streams/delivery-header",
                                                           "on a session that agreed on thali-streams/1, the delivery stream it opens starts with the header delivery",
                                                           ["NODE-4.1", "NODE-4.3"])
        /// `target/streams/status-read`: it takes our status 0 off the front of the stream: its welcome
        /// answers our hello.
        public static let statusRead = ConformanceCase("target/streams/status-read",
                                                       "it takes our status 0 off the front of the stream: our hello after it is answered with its welcome",
                                                       ["NODE-4.6"])
        /// `target/streams/refusal-not-retried`: a delivery stream we refuse is closed, not opened again on
        /// that session, and its reconnections stay few.
        public static let refusalNotRetried = ConformanceCase("target/streams/refusal-not-retried",
                                                              "a delivery stream we refuse (not-served) is closed by it, not opened again on that session, and its reconnections back off",
                                                              ["NODE-4.7"])

        /// `target/http/busy-waited`: answered `503` with `Retry-After: 2` to its beacon fetch, it asks
        /// that location again no sooner than 2 s later (an alive of the same USN in between tempts it).
        public static let busyWaited = ConformanceCase("target/http/busy-waited",
                                                       "answered 503 with Retry-After: 2, it fetches that location again on a later alive, and no sooner than 2 s later",
                                                       ["SSDP-6.10", "SSDP-5.1"])
        /// `target/http/status-checked`: an announcement for it served with a status other than 200 or 204,
        /// or with 200 and another Content-Type, is not taken: no connection follows.
        public static let statusChecked = ConformanceCase("target/http/status-checked",
                                                          "a good announcement for it answered with 404, or with 200 and Content-Type text/html, is not taken: no connection follows",
                                                          ["SSDP-6.6"])

        /// `target/ssdp/search-form`: its M-SEARCH datagrams heard on the group are well formed, name the
        /// group in HOST and carry S with its current USN while it advertises one.
        public static let searchForm = ConformanceCase("target/ssdp/search-form",
                                                       "its M-SEARCH for the Thali NT is well formed with HOST group:port, MAN, MX and ST, and carries S with its current USN while it advertises one",
                                                       ["SSDP-2.6"])

        /// Every case of target mode.
        public static let all = [searchForm, validFetched, fetchOnce, noMatchNoConnect, malformed, foreignNT, badUSN, spoofedLocation, forgedByebye,
                                 forgotten, tamperedNoConnect, strangerFirstNoConnect, matchConnects, welcome, closeNotifyFirst, replayNoConnect,
                                 smallGroupRefused, statusChecked, deliveryHeader, statusRead, refusalNotRetried, busyWaited]
        /// The cases of the script (all but the search, which listens beside it).
        static let scripted = Array(all.dropFirst())
        static let beacons = [tamperedNoConnect, strangerFirstNoConnect, matchConnects, welcome, closeNotifyFirst, replayNoConnect, smallGroupRefused,
                              statusChecked]
            + marking
        static let marking = [deliveryHeader, statusRead, refusalNotRetried]
    }
}
