/// A TLS alert description (RFC 5246 §7.2, RFC 4279 §2 for `unknown_psk_identity`).
///
/// A struct rather than an enum so that an alert this module has no name for still round-trips.
public struct TLSAlert: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    /// The alert's one-byte description code on the wire.
    public let rawValue: UInt8

    /// The alert with this description code.
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    /// The sender will send nothing more (not a failure).
    public static let closeNotify = TLSAlert(rawValue: 0)
    /// A message arrived that the state does not allow.
    public static let unexpectedMessage = TLSAlert(rawValue: 10)
    /// A record failed authentication (with a wrong PSK: the Finished message).
    public static let badRecordMAC = TLSAlert(rawValue: 20)
    /// A record was too long.
    public static let recordOverflow = TLSAlert(rawValue: 22)
    /// No acceptable parameters (for example no shared cipher suite, or a DH group too small).
    public static let handshakeFailure = TLSAlert(rawValue: 40)
    /// A field was out of range or inconsistent.
    public static let illegalParameter = TLSAlert(rawValue: 47)
    /// A message could not be parsed (for example an identity longer than 256 bytes for OpenSSL 3.0).
    public static let decodeError = TLSAlert(rawValue: 50)
    /// A handshake cryptographic check failed.
    public static let decryptError = TLSAlert(rawValue: 51)
    /// The offered protocol version is not supported (a TLS 1.3-only peer).
    public static let protocolVersion = TLSAlert(rawValue: 70)
    /// The peer requires stronger parameters.
    public static let insufficientSecurity = TLSAlert(rawValue: 71)
    /// The sender failed internally.
    public static let internalError = TLSAlert(rawValue: 80)
    /// A downgrade was detected.
    public static let inappropriateFallback = TLSAlert(rawValue: 86)
    /// The sender cancelled the handshake.
    public static let userCanceled = TLSAlert(rawValue: 90)
    /// Renegotiation refused.
    public static let noRenegotiation = TLSAlert(rawValue: 100)
    /// An extension the sender did not offer came back.
    public static let unsupportedExtension = TLSAlert(rawValue: 110)
    /// The server name is not known.
    public static let unrecognizedName = TLSAlert(rawValue: 112)
    /// RFC 4279 §2: the server does not know the PSK identity the client sent.
    public static let unknownPSKIdentity = TLSAlert(rawValue: 115)

    private static let names: [UInt8: String] = [
        0: "close_notify", 10: "unexpected_message", 20: "bad_record_mac", 21: "decryption_failed",
        22: "record_overflow", 30: "decompression_failure", 40: "handshake_failure", 42: "bad_certificate",
        43: "unsupported_certificate", 44: "certificate_revoked", 45: "certificate_expired",
        46: "certificate_unknown", 47: "illegal_parameter", 48: "unknown_ca", 49: "access_denied",
        50: "decode_error", 51: "decrypt_error", 60: "export_restriction", 70: "protocol_version",
        71: "insufficient_security", 80: "internal_error", 86: "inappropriate_fallback", 90: "user_canceled",
        100: "no_renegotiation", 109: "missing_extension", 110: "unsupported_extension",
        112: "unrecognized_name", 113: "bad_certificate_status_response", 115: "unknown_psk_identity",
        116: "certificate_required", 120: "no_application_protocol",
    ]

    /// The RFC name, e.g. `unknown_psk_identity`, or `alert(N)` for an unnamed code.
    public var description: String { Self.names[rawValue] ?? "alert(\(rawValue))" }
}
