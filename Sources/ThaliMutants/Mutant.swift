#if DEBUG
import Foundation
#endif

/// Deliberate faults that prove the conformance suite grades: each breaks one rule of `spec/`, and
/// `spec/conformance-mutants.json` says exactly which conformance cases must catch it.
///
/// A mutant is switched on by the environment variable `THALI_MUTANT=<name>` in a **debug** build only
/// (as `Fuzz/` stays out of release builds): in a release build ``active`` is the constant `nil`, so every
/// check below is compiled away and no setting can turn a fault on.
public enum Mutant: String, CaseIterable, Sendable {
    /// The delivery decoder ignores bytes after a frame's fields [NODE-1.2].
    case deliveryIgnoresTrailingBytes = "delivery-ignores-trailing-bytes"
    /// The delivery decoder accepts a data frame with no bytes [NODE-1.3].
    case deliveryAcceptsEmptyData = "delivery-accepts-empty-data"
    /// The delivery decoder does not check a header's length against the frame maximum [NODE-1.1].
    case deliveryUnboundedFrames = "delivery-unbounded-frames"
    /// The delivery receiver accepts items that have already expired [NODE-1.16].
    case deliveryAcceptsExpired = "delivery-accepts-expired"
    /// The delivery receiver commits content whose SHA-256 is not the offer's [NODE-1.11].
    case deliveryAcceptsDamaged = "delivery-accepts-damaged"
    /// The delivery sender keeps its own chunk size after the receiver's welcome [NODE-1.23].
    case deliveryIgnoresFrameMaximum = "delivery-ignores-frame-maximum"
    /// The version 3 delivery sender streams past the receiver's progress window [NODE-1.28].
    case deliveryIgnoresProgressWindow = "delivery-ignores-progress-window"
    /// The version 3 delivery receiver sends no `progress` frames [NODE-1.27].
    case deliverySendsNoProgress = "delivery-sends-no-progress"
    /// The yamux decoder accepts any version byte [MUX-2.1].
    case yamuxAcceptsAnyVersion = "yamux-accepts-any-version"
    /// A yamux session accepts a stream the peer opened with our parity [MUX-2.5].
    case yamuxAcceptsWrongParity = "yamux-accepts-wrong-parity"
    /// A yamux stream takes data after the peer's FIN [MUX-2.10].
    case yamuxAcceptsDataAfterFIN = "yamux-accepts-data-after-fin"
    /// A yamux session takes a data frame longer than the stream's receive window [MUX-2.12].
    case yamuxIgnoresReceiveWindow = "yamux-ignores-receive-window"
    /// A yamux sender takes whatever it has as its window: it never waits for the peer's window update [MUX-2.11].
    case yamuxSendsPastWindow = "yamux-sends-past-window"
    /// A yamux session takes the peer's GoAway 0 as an error and ends, its open streams with it [MUX-2.14].
    case yamuxGoAwayEndsSession = "yamux-goaway-ends-session"
    /// The thali-multiplex decoder reads varints of eleven bytes [MUX-3.1].
    case thaliMultiplexLongVarints = "thali-multiplex-long-varints"
    /// The thali-multiplex decoder takes open and reset bodies of any length [MUX-3.3].
    case thaliMultiplexUnboundedControlBodies = "thali-multiplex-unbounded-control-bodies"
    /// The PSK-TLS server sends an identity hint [PSK-1.6].
    case tlsIdentityHint = "tls-identity-hint"
    /// The PSK-TLS client takes a DH group under 2048 bits (security level 0) [PSK-2.3].
    case tlsAcceptsSmallGroup = "tls-accepts-small-group"
    /// The PSK-TLS server offers session tickets [PSK-1.4].
    case tlsSessionTickets = "tls-session-tickets"
    /// Closing a PSK-TLS connection closes TCP without sending close_notify first [PSK-6.1].
    case tlsCloseWithoutCloseNotify = "tls-close-without-close-notify"
    /// A TCP close without close_notify after the handshake ends a PSK-TLS connection as cleanly as
    /// close_notify does, instead of as a possible truncation [PSK-6.3].
    case tlsUncleanCloseAsClean = "tls-unclean-close-as-clean"
    /// The announcer does not answer M-SEARCH [SSDP-2.7].
    case ssdpNoSearchAnswer = "ssdp-no-search-answer"
    /// Multicast datagrams go out with TTL 1, the common socket default, instead of 2 [SSDP-1.2].
    case ssdpMulticastTTLOne = "ssdp-multicast-ttl-one"
    /// A peer whose max-age ran out is kept as if it still announced [SSDP-4.4].
    case ssdpNeverForgets = "ssdp-never-forgets"
    /// Its own alives, heard back through multicast loopback, are taken for a peer's [SSDP-3.3].
    case ssdpHearsItself = "ssdp-hears-itself"
    /// The announcer withdraws nothing when its beacons are gone: no byebye [SSDP-2.5].
    case ssdpNoByebye = "ssdp-no-byebye"
    /// The SSDP parser keeps the first of two headers with one name instead of refusing the datagram [SSDP-3.1].
    case ssdpAcceptsDuplicateHeaders = "ssdp-accepts-duplicate-headers"
    /// The USN's UUID is in upper case [SSDP-2.3].
    case ssdpUppercaseUSN = "ssdp-uppercase-usn"
    /// The beacon fetch sends `Host` without the port [SSDP-6.8].
    case httpHostWithoutPort = "http-host-without-port"
    /// The beacon fetch takes a busy server's `503` as a wait of nothing, whatever its `Retry-After` [SSDP-6.10].
    case httpIgnoresRetryAfter = "http-ignores-retry-after"
    /// The beacon fetch takes the body of any answer as the beacons, whatever its status or Content-Type
    /// (a 503 aside) [SSDP-6.6].
    case httpIgnoresStatus = "http-ignores-status"
    /// The beacon fetch takes a busy server's `503` as an empty answer (a 204), so it never asks again [SSDP-5.1].
    case httpBusyAsNoContent = "http-busy-as-no-content"
    /// The beacon receiver keeps no replay cache: an announcement fetched again from the same origin
    /// matches again [BCN-4.5].
    case beaconNoReplayCache = "beacon-no-replay-cache"
    /// The beacon receiver (profile spec) takes a flag whose GCM tag does not verify [BCN-4.8].
    case beaconIgnoresFlagTag = "beacon-ignores-flag-tag"
    /// The beacon receiver (profile spec) skips a verified flag from a stranger and scans on [BCN-4.6].
    case beaconSkipsStrangerFlag = "beacon-skips-stranger-flag"
    /// The stream header reader refuses a malformed header with unknown-kind (1), not bad-header (4) [NODE-4.5].
    case streamsBadHeaderAsUnknownKind = "streams-bad-header-as-unknown-kind"
    /// The opener of a marked stream leaves the accepting side's status in front of the stream's bytes [NODE-4.6].
    case streamsOpenerKeepsStatus = "streams-opener-keeps-status"
    /// Beacon announcements expire 25 h ahead, beyond the 24 h a receiver accepts [BCN-1.2].
    case beaconExpirationBeyondADay = "beacon-expiration-beyond-a-day"

    /// The delivery sender keeps an item the receiver answered `complete` and offers it again [NODE-1.6].
    case deliveryKeepsCompleted = "delivery-keeps-completed"
    /// The delivery sender forgets a receiver's `refused` and offers the item again [NODE-1.7].
    case deliveryForgetsRefusal = "delivery-forgets-refusal"
    /// The delivery sender resumes at a `partial` answer's offset without checking its prefix digest [NODE-1.9].
    case deliveryResumesUnchecked = "delivery-resumes-unchecked"
    /// The delivery sender ends a session over the receiver's protocol error without an `error` frame [NODE-1.24].
    case deliveryEndsWithoutError = "delivery-ends-without-error"
    /// The delivery receiver speaks version 1 only: a `hello` above 1 ends the stream instead of being
    /// welcomed with the highest version it speaks [NODE-1.26].
    case deliveryReceiverRefusesNewerHello = "delivery-receiver-refuses-newer-hello"
    /// The delivery sender is one from before the welcome frame: it says `hello(1)` and offers at once.
    /// Allowed, but graded as such: its hello a WARN against the current version [NODE-1.4], the cases of
    /// later versions N/A.
    case deliverySenderSpeaksVersion1 = "delivery-sender-speaks-version-1"
    /// The opener of a refused marked delivery stream opens another at once on the same session [NODE-4.7].
    case streamsRetryRefused = "streams-retry-refused"
    /// The BLE advertisement decoder ignores deployed Android Thali's manufacturer data [BLE-1.2].
    case advdataIgnoresManufacturerData = "advdata-ignores-manufacturer-data"

    /// The environment variable that names the active mutant (debug builds only).
    public static let environmentVariable = "THALI_MUTANT"

    /// The mutant this process runs with: read once from ``environmentVariable`` in a debug build; always
    /// `nil` in a release build.
    public static let active: Mutant? = {
        #if DEBUG
        ProcessInfo.processInfo.environment[environmentVariable].flatMap(Mutant.init(rawValue:))
        #else
        nil
        #endif
    }()

    /// Whether this mutant is the active one.
    @inlinable
    public var isActive: Bool {
        #if DEBUG
        Self.active == self
        #else
        false
        #endif
    }
}
