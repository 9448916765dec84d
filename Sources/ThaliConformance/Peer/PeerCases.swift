import Crypto
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import TCPMultiplexer
import ThaliBeacons
import ThaliNodeCore
import ThaliPSKTLS
import ThaliSSDP

extension PeerConformance {
    /// The cases, in the order they run.
    public enum Cases {
        /// `peer/ssdp/discovered`: announces itself over SSDP with a LOCATION we can fetch.
        public static let discovered = ConformanceCase("peer/ssdp/discovered", "announces itself over SSDP with a LOCATION we can fetch",
                                                       ["SSDP-2.1", "SSDP-2.2", "SSDP-2.4", "SSDP-3.5"])
        /// `peer/ssdp/usn`: its USN is uuid: and a UUID in lower case.
        public static let usn = ConformanceCase("peer/ssdp/usn", "its USN is uuid: and a UUID in lower case", ["SSDP-2.3"])
        /// `peer/ssdp/search-answer`: an M-SEARCH for the Thali NT is answered by unicast to our port with CACHE-CONTROL, LOCATION, ST and USN.
        public static let searchAnswer = ConformanceCase("peer/ssdp/search-answer",
                                                         "an M-SEARCH for the Thali NT is answered by unicast to our port with CACHE-CONTROL, LOCATION, ST and USN",
                                                         ["SSDP-2.7"])
        /// `peer/ssdp/search-answer-delay`: searches sent at once are answered after delays drawn at random
        /// within min(MX, 5) s.
        public static let searchAnswerDelay = ConformanceCase("peer/ssdp/search-answer-delay",
                                                              "searches sent at once are answered after delays spread at random within min(MX, 5) s",
                                                              ["SSDP-4.3"])
        /// `peer/ssdp/byebye`: once nothing is left for us it withdraws its announcement with a byebye.
        public static let byebye = ConformanceCase("peer/ssdp/byebye", "once nothing is left for us it withdraws its announcement with a byebye",
                                                   ["SSDP-2.5", "SSDP-4.2", "NODE-3.1"])
        /// `peer/http/beacons`: GET /NotificationBeacons answers 200 with the beacon stream.
        public static let beaconFetch = ConformanceCase("peer/http/beacons", "GET /NotificationBeacons answers 200 with the beacon stream",
                                                        ["SSDP-6.2", "SSDP-6.5"])
        /// `peer/beacons/match`: its announcement has a beacon for us that matches.
        public static let beaconMatch = ConformanceCase("peer/beacons/match", "its announcement has a beacon for us that matches",
                                                        ["BCN-1.1", "BCN-2.1", "BCN-2.2", "BCN-2.3", "BCN-2.4", "BCN-2.5", "BCN-4.7", "NODE-3.1"])
        /// `peer/beacons/fresh-ephemeral-key`: the announcements it makes for us over the run (a new one
        /// for each item queued through the adapter) each carry another ephemeral key.
        public static let freshEphemeralKey = ConformanceCase("peer/beacons/fresh-ephemeral-key",
                                                              "every announcement of its that SSDP fetched over the run carries an ephemeral key of its own",
                                                              ["BCN-1.3"])
        /// `peer/beacons/expiration`: expiration is ahead, at most 24 h.
        public static let expiration = ConformanceCase("peer/beacons/expiration", "expiration is ahead, at most 24 h",
                                                       ["BCN-1.2", "BCN-4.3", "BCN-4.4"])
        /// `peer/psk-tls/handshake`: PSK-TLS with the beacon's identity and PSK: TLS 1.2, 0x00AB, DH ≥ 2048.
        public static let handshake = ConformanceCase("peer/psk-tls/handshake", "PSK-TLS with the beacon's identity and PSK: TLS 1.2, 0x00AB, DH ≥ 2048",
                                                      ["PSK-1.1", "PSK-1.2", "PSK-1.7", "PSK-3.1", "PSK-3.2", "BCN-2.6", "BCN-2.7", "NODE-2.1"])
        /// `peer/psk-tls/close-notify-answered`: our close_notify, with TCP kept open, is answered at once.
        public static let closeNotify = ConformanceCase("peer/psk-tls/close-notify-answered",
                                                        "our close_notify, with TCP kept open, is answered at once: its close_notify, then the connection closes",
                                                        ["PSK-6.4", "NODE-1.21"])
        /// `peer/yamux/open-stream`: a yamux stream we open is accepted and served.
        public static let openStream = ConformanceCase("peer/yamux/open-stream", "a yamux stream we open is accepted and served",
                                                       ["MUX-0.1", "MUX-1.1", "MUX-2.6", "NODE-3.3", "NODE-1.19"])
        /// `peer/delivery/hello`: the sender's first frame is hello, version 3 or later (an older version is a warning).
        public static let hello = ConformanceCase("peer/delivery/hello", "the sender's first frame is hello, version 3 or later", ["NODE-1.1", "NODE-1.4"])
        /// `peer/delivery/frame-maximum`: after our welcome announces 1024 bytes, its data frames stay within them.
        public static let frameMaximum = ConformanceCase("peer/delivery/frame-maximum",
                                                         "after our welcome announces a 1024-byte frame maximum, its data frames stay within it",
                                                         ["NODE-1.18", "NODE-1.23"])
        /// `peer/delivery/offer`: the queued item is offered, well formed, epoch milliseconds.
        public static let offer = ConformanceCase("peer/delivery/offer", "the queued item is offered, well formed, epoch milliseconds",
                                                  ["NODE-1.3", "NODE-1.5", "NODE-1.20"])
        /// `peer/delivery/transfer`: start(0), data and end carry exactly the offered bytes.
        public static let transfer = ConformanceCase("peer/delivery/transfer", "start(0), data and end carry exactly the offered bytes",
                                                     ["NODE-1.2", "NODE-1.8"])
        /// `peer/delivery/progress-window`: after our welcome(3) with an 8 KiB window, its content beyond
        /// our last progress stays within the window, and it goes on after each report.
        public static let window = ConformanceCase("peer/delivery/progress-window",
                                                   "after our welcome(3) announces an 8 KiB progress window, its content beyond our last progress stays within it, and our reports let it go on",
                                                   ["NODE-1.28", "NODE-1.27"])
        /// `peer/delivery/item-batch`: texts that fit our frame maximum come whole as item frames, the
        /// last of a batch flagged, nothing else inside the batch.
        public static let itemBatch = ConformanceCase("peer/delivery/item-batch",
                                                      "texts that fit our frame maximum come whole as item frames, intact, the last of the batch flagged and nothing else inside it",
                                                      ["NODE-1.29"])
        /// `peer/delivery/version-2-fallback`: welcomed with version 2 on a second stream, it speaks
        /// version 2: a text goes by offer, not as an item frame, and it needs no progress.
        public static let version2Fallback = ConformanceCase("peer/delivery/version-2-fallback",
                                                             "welcomed with version 2 on a second stream, it speaks version 2: its text goes by offer, not as an item frame, with no progress awaited",
                                                             ["NODE-1.26"])
        /// `peer/delivery/done`: after our acks the sender sends done.
        public static let done = ConformanceCase("peer/delivery/done", "after our acks the sender sends done", ["NODE-1.12", "NODE-1.13"])
        /// `peer/sender/connects`: it fetches our beacons and connects with our PSK.
        public static let senderConnects = ConformanceCase("peer/sender/connects", "it fetches our beacons and connects with our PSK",
                                                           ["SSDP-3.6", "NODE-3.2", "NODE-3.3", "PSK-3.1"])
        /// `peer/sender/beacon-request`: its beacon fetch is GET /NotificationBeacons HTTP/1.1, Host host:port, Connection: close, Accept: application/octet-stream.
        public static let senderBeaconRequest = ConformanceCase("peer/sender/beacon-request",
                                                                "its beacon fetch is GET /NotificationBeacons HTTP/1.1, Host host:port, Connection: close, Accept: application/octet-stream",
                                                                ["SSDP-6.6", "SSDP-6.8"])
        /// `peer/sender/welcome`: it answers our hello (version 4) with welcome: version 3 or 4, its frame
        /// maximum (at least 1024) and its progress window (at least 2048); an older version is a warning.
        public static let senderWelcome = ConformanceCase("peer/sender/welcome",
                                                          "it answers our hello(4) with welcome: version 3 or 4, its frame maximum, at least 1024, and its progress window, at least 2048",
                                                          ["NODE-1.22", "NODE-1.26"])
        /// `peer/sender/opens-stream`: it opens a delivery stream and answers our offer.
        public static let senderStream = ConformanceCase("peer/sender/opens-stream", "it opens a delivery stream and answers our offer",
                                                         ["NODE-1.19", "NODE-1.3", "MUX-1.1"])
        /// `peer/sender/ack`: it acknowledges the item after end.
        public static let senderAck = ConformanceCase("peer/sender/ack", "it acknowledges the item after end", ["NODE-1.10"])
        /// `peer/sender/progress`: before its ack it reports progress of the item, each report larger than
        /// the last, none beyond what we sent, the last the whole item.
        public static let senderProgress = ConformanceCase("peer/sender/progress",
                                                           "before its ack it reports progress, each report larger than the last and within what we sent, the last the whole item",
                                                           ["NODE-1.27"])
        /// `peer/sender/item-batch`: a batch of three texts as item frames, the middle one damaged, is
        /// answered in order after the flagged one: ack, reject, ack.
        public static let senderBatch = ConformanceCase("peer/sender/item-batch",
                                                        "a batch of three texts as item frames, the middle one damaged, is answered in order after the flagged one: ack, reject, ack",
                                                        ["NODE-1.29", "NODE-1.11"])
        /// `peer/sender/refuses-expired`: an item already expired is refused (reason 3).
        public static let refusesExpired = ConformanceCase("peer/sender/refuses-expired", "an item already expired is refused (reason 3)",
                                                           ["NODE-1.16", "NODE-1.20"])
        /// `peer/sender/rejects-damaged`: content that misses its SHA-256 gets reject.
        public static let rejectsDamaged = ConformanceCase("peer/sender/rejects-damaged", "content that misses its SHA-256 gets reject",
                                                           ["NODE-1.11"])
        /// `peer/sender/closes-after-done`: it closes the stream after done.
        public static let senderClose = ConformanceCase("peer/sender/closes-after-done", "it closes the stream after done", ["NODE-1.13"])
        /// `peer/sender/inbox`: the items it acknowledged are in its inbox once, from us, intact; the expired
        /// and the damaged ones are not.
        public static let senderInbox = ConformanceCase("peer/sender/inbox",
                                                        "the items it acknowledged are in its inbox once, from us, intact; the expired and damaged ones are not",
                                                        ["NODE-1.15", "NODE-3.4"])
        /// `peer/psk-tls/no-identity-hint`: the ServerKeyExchange carries no identity hint.
        public static let noHint = ConformanceCase("peer/psk-tls/no-identity-hint", "the ServerKeyExchange carries no identity hint", ["PSK-1.6"])
        /// `peer/psk-tls/unknown-identity`: an unknown identity gets unknown_psk_identity.
        public static let unknownIdentity = ConformanceCase("peer/psk-tls/unknown-identity", "an unknown identity gets unknown_psk_identity",
                                                            ["PSK-4.1", "PSK-4.2"])
        /// `peer/psk-tls/wrong-psk`: its own identity with a wrong PSK fails the handshake.
        public static let wrongPSK = ConformanceCase("peer/psk-tls/wrong-psk", "its own identity with a wrong PSK fails the handshake",
                                                     ["PSK-4.3"])
        /// `peer/psk-tls/renegotiation-refused`: a ClientHello we send inside an established session
        /// gets no_renegotiation, never a second handshake.
        public static let renegotiationRefused = ConformanceCase("peer/psk-tls/renegotiation-refused",
                                                                 "a ClientHello we send inside an established session gets no_renegotiation, never a second handshake",
                                                                 ["PSK-1.5"])
        /// `peer/psk-tls/tls13-refused`: a TLS 1.3-only hello gets protocol_version.
        public static let tls13 = ConformanceCase("peer/psk-tls/tls13-refused", "a TLS 1.3-only hello gets protocol_version", ["PSK-1.3"])
        /// `peer/psk-tls/other-suites-refused`: a hello without 0x00AB gets handshake_failure.
        public static let otherSuites = ConformanceCase("peer/psk-tls/other-suites-refused", "a hello without 0x00AB gets handshake_failure",
                                                        ["PSK-5.1", "PSK-1.2"])
        /// `peer/psk-tls/dh-group-size`: the DH prime has at least 2048 bits.
        public static let dhSize = ConformanceCase("peer/psk-tls/dh-group-size", "the DH prime has at least 2048 bits", ["PSK-2.1"])
        /// `peer/psk-tls/no-compression`: offered DEFLATE and none, it picks none.
        public static let noCompression = ConformanceCase("peer/psk-tls/no-compression", "offered DEFLATE and none, it picks none",
                                                          ["PSK-1.8"])
        /// `peer/psk-tls/no-session-tickets`: asked for a session ticket, it sends no ticket extension.
        public static let noTickets = ConformanceCase("peer/psk-tls/no-session-tickets", "asked for a session ticket, it sends no ticket extension",
                                                      ["PSK-1.4"])
        /// `peer/psk-tls/dh-fresh`: two handshakes carry different dh_Ys.
        public static let dhFresh = ConformanceCase("peer/psk-tls/dh-fresh", "two handshakes carry different dh_Ys", ["PSK-2.2"])

        /// `peer/yamux/ping-answered`: a raw Ping with SYN is answered with ACK and the same value.
        public static let pingAnswered = ConformanceCase("peer/yamux/ping-answered", "a Ping with SYN is answered by a Ping with ACK and the same opaque value",
                                                         ["MUX-2.3"])
        /// `peer/yamux/data-after-fin`: data on a stream after our FIN resets that stream, and only it.
        public static let dataAfterFIN = ConformanceCase("peer/yamux/data-after-fin",
                                                         "data on a stream after our FIN resets that stream (RST), and the session goes on",
                                                         ["MUX-2.10", "MUX-2.8"])
        /// `peer/yamux/reset-stream`: after our RST, and data on the reset stream, the session goes on.
        public static let resetStream = ConformanceCase("peer/yamux/reset-stream",
                                                        "after our RST on an open stream, and a late data frame on it (dropped), the session goes on: no GoAway, a Ping answered",
                                                        ["MUX-2.9"])
        /// `peer/yamux/wrong-parity`: a stream we open with the server's parity ends the session with GoAway 1.
        public static let wrongParity = ConformanceCase("peer/yamux/wrong-parity",
                                                        "a stream opened by the client with an even id ends the session with GoAway code 1 (protocol error)",
                                                        ["MUX-2.5", "MUX-2.4", "MUX-2.15"])
        /// `peer/yamux/window-overrun`: a data frame beyond the 256 KiB window ends the session with GoAway 1.
        public static let windowOverrun = ConformanceCase("peer/yamux/window-overrun",
                                                          "a data frame of 256 KiB + 1 on a new stream, beyond its window, ends the session with GoAway code 1",
                                                          ["MUX-2.12", "MUX-2.15"])

        /// `peer/yamux/goaway-normal`: after our GoAway 0 its open stream goes on and the session answers
        /// a Ping; after our GoAway 2 it ends the session.
        public static let goAwayNormal = ConformanceCase("peer/yamux/goaway-normal",
                                                         "after our GoAway 0 the stream it serves is not reset and a Ping is answered; after our GoAway 2 it ends the session",
                                                         ["MUX-2.14"])

        /// Every case of peer mode.
        public static let all = [discovered, beaconFetch, beaconMatch, expiration, freshEphemeralKey, handshake, closeNotify, openStream, hello, offer,
                                 transfer, frameMaximum, window, itemBatch, done, version2Fallback] + answers + [usn, searchAnswer, searchAnswerDelay, multicastTTL, ownAlivesDropped, byebye,
                                 senderConnects, senderBeaconRequest, senderWelcome, senderStream, senderProgress, senderAck, refusesExpired,
                                 rejectsDamaged, senderBatch, senderClose, senderInbox,
                                 uncleanCloseReported, noHint, noCompression, noTickets, unknownIdentity, wrongPSK, renegotiationRefused, tls13, otherSuites, dhSize, dhFresh,
                                 pingAnswered, dataAfterFIN, resetStream, wrongParity, windowOverrun, goAwayNormal,
                                 unmarkedServed, alpnSelected, unknownKindRefused, badHeaderRefused, appNotServed, deliveryAccepted,
                                 sendWindowRespected]
        static let rawMultiplexer = [pingAnswered, dataAfterFIN, resetStream, wrongParity, windowOverrun, goAwayNormal]
        static let receiverRole = [openStream, hello, offer, transfer, frameMaximum, window, itemBatch, done]
        static let senderRole = [senderConnects, senderBeaconRequest, senderWelcome, senderStream, senderProgress, senderAck, refusesExpired,
                                 rejectsDamaged, senderBatch, senderClose, senderInbox]
    }
}
