import NIOCore

/// A finite-field Diffie-Hellman group of RFC 7919 that the server offers in its ServerKeyExchange.
///
/// TLS 1.2 has no negotiation of finite-field groups in OpenSSL 3.0, so the server picks one and the
/// client accepts any group of at least 2048 bits. Nothing smaller exists here on purpose.
public enum DHGroup: String, CaseIterable, Hashable, Sendable {
    /// RFC 7919 ffdhe2048: the spec's minimum, the cheapest handshake.
    case ffdhe2048
    /// RFC 7919 ffdhe3072: about 128-bit security, the module's default.
    case ffdhe3072
    /// RFC 7919 ffdhe4096: the largest group offered.
    case ffdhe4096

    /// The size of the group's prime in bits.
    public var bits: Int {
        switch self {
        case .ffdhe2048: 2048
        case .ffdhe3072: 3072
        case .ffdhe4096: 4096
        }
    }
}

/// The protocol profile: the only values this module negotiates. Not configurable on purpose.
public enum PSKTLSProfile {
    /// The one cipher suite, TLS_DHE_PSK_WITH_AES_256_GCM_SHA384 (RFC 5487, code point 0x00AB).
    public static let cipherSuite = "DHE-PSK-AES256-GCM-SHA384"
    /// The cipher suite's IANA code point.
    public static let cipherSuiteID: UInt16 = 0x00AB
    /// The one protocol version, TLS 1.2.
    public static let protocolVersion = "TLSv1.2"
    /// The smallest DH prime a client accepts from a server, in bits (OpenSSL security level 2).
    public static let minimumDHBits = 2048
    /// The longest PSK identity OpenSSL 3.0 sends or accepts, in bytes (`PSK_MAX_IDENTITY_LEN`).
    /// RFC 4279 only obliges implementations to accept 128; Thali's identities are 192 characters.
    public static let maximumIdentityLength = 256
    /// The longest PSK OpenSSL 3.0 accepts, in bytes (`PSK_MAX_PSK_LEN`).
    public static let maximumPSKLength = 512
    /// The longest ALPN protocol name, in bytes (RFC 7301 §3.1: a one-byte length).
    public static let maximumApplicationProtocolLength = 255
    /// The most ALPN protocol names a context offers or accepts (ours; the wire allows about 250 of
    /// the shortest).
    public static let maximumApplicationProtocols = 16
}

/// Settings of a PSK-TLS client or server. Every limit has a default that suits a phone-sized peer.
public struct PSKTLSConfiguration: Sendable {
    /// The DH group a server uses for every handshake (a fresh key each time). Ignored by clients,
    /// which accept any group of at least `PSKTLSProfile.minimumDHBits`. Default: ffdhe3072.
    public var dhGroup: DHGroup = .ffdhe3072

    /// How long a handshake may take from the moment the TCP connection is up; then it fails with
    /// `PSKTLSError.Reason.handshakeTimedOut` and the connection is closed. Default: 10 s.
    public var handshakeTimeout: Duration = .seconds(10)

    /// How long closing waits for the close_notify alert (or a fatal alert), and the data written before
    /// it, to reach the network; a peer that does not read gets its connection closed after this.
    /// Default: 5 s.
    public var closeTimeout: Duration = .seconds(5)

    /// How long a client waits for the TCP connection. Default: 10 s.
    public var connectTimeout: Duration = .seconds(10)

    /// How many bytes of plaintext the handler holds for the application while the handshake is still
    /// running; a write beyond that fails with `writeBufferLimitExceeded`. Default: 1 MiB.
    public var maximumBufferedPlaintextBeforeHandshake: Int = 1 << 20

    /// The size of the buffers plaintext is decrypted into and delivered in. Larger values mean fewer,
    /// bigger reads for the application; each read of the network is decrypted completely before the
    /// next one, so this bounds nothing by itself. Default: 64 KiB.
    public var plaintextReadChunkSize: Int = 64 << 10

    /// The most ciphertext the handler puts in one buffer for the channel: the writes of one flush are
    /// encrypted together into buffers of about this size (a large write is cut at record boundaries), so
    /// a multiplexer's 12-byte frame header and its payload go out in one buffer, not two. Default: 256 KiB.
    public var ciphertextBufferSize: Int = 256 << 10

    /// Writes smaller than this are copied together with the other small writes of their flush and
    /// encrypted as one record (of at most 16 KiB) instead of one record each: a multiplexer's 12-byte
    /// frame header and a small payload cost one encryption and 29 bytes of record overhead, not two.
    /// Larger writes are encrypted where they are, without the copy. 0 turns coalescing off. Default: 4 KiB.
    public var coalescedWriteLimit: Int = 4 << 10

    /// How many ciphertext buffers of 64 KiB or more a connection keeps to write into again once the
    /// channel has sent them, instead of allocating fresh memory (and paying its page faults) for every
    /// large write; 0 keeps none. Each is at most `ciphertextBufferSize` (or one large write), so a busy
    /// connection holds at most this many of them between writes. Default: 2.
    public var recycledCiphertextBuffers: Int = 2

    /// Server only: how many connections (handshaking or established) may be open at once; more are
    /// closed as soon as they are accepted and counted in `PSKTLSServer.Statistics.refused`. Default: 256.
    /// The global open bound of `PSKTLSServer.defaultAdmission(for:)`; per-source bounds come first.
    public var maximumConcurrentConnections: Int = 256

    /// Server only: how many established connections wait for the application to take them from
    /// `PSKTLSServer.connections`; more are closed. Default: 64.
    public var maximumPendingConnections: Int = 64

    /// Server only: how many recent handshake failures `PSKTLSServer.handshakeFailures` keeps for a
    /// consumer that is not reading them; older ones are dropped. Default: 64.
    public var maximumBufferedFailures: Int = 64

    /// Whether receiving `close_notify` only ends the input (half-closure: `ChannelEvent.inputClosed` is
    /// fired and writing stays possible) instead of answering it with our own close_notify and closing the
    /// whole connection at once (RFC 5246 §7.2.1). Half-closure also needs the channel's own
    /// `ChannelOptions.allowRemoteHalfClosure` (which `PSKTLSServer` and `PSKTLSClient` set): a channel
    /// that would close at the end of its TCP input closes at the end of its TLS input too. Default: true.
    public var allowRemoteHalfClosure: Bool = true

    /// Application protocols (TLS ALPN, RFC 7301) in order of preference. A client offers them in its
    /// ClientHello; a server selects the first of its own that the client offered, and answers without
    /// the extension when there is none (so a client offering nothing, or only protocols the server does
    /// not know, connects as before). The outcome is ``PSKTLSNegotiatedParameters/applicationProtocol``.
    /// Each name is 1...``PSKTLSProfile/maximumApplicationProtocolLength`` bytes; at most
    /// ``PSKTLSProfile/maximumApplicationProtocols`` of them. Default: none.
    public var applicationProtocols: [String] = []

    /// The defaults.
    public init() {}

    /// The defaults with the server's DH group set.
    public init(dhGroup: DHGroup) { self.dhGroup = dhGroup }
}

/// The side of a TLS connection.
public enum PSKTLSRole: String, Hashable, Sendable {
    /// The side that connects and presents a PSK identity.
    case client
    /// The side that accepts and looks the PSK up by the identity.
    case server
}

/// What a completed handshake negotiated, checked against `PSKTLSProfile` on both sides.
public struct PSKTLSNegotiatedParameters: Hashable, Sendable {
    /// The protocol version, e.g. `TLSv1.2`.
    public let protocolVersion: String
    /// The OpenSSL name of the cipher suite, e.g. `DHE-PSK-AES256-GCM-SHA384`.
    public let cipherSuite: String
    /// The size in bits of the DH prime used in the key exchange.
    public let dhGroupBits: Int
    /// The PSK identity the client sent (on the server, the one the lookup accepted).
    public let pskIdentity: String
    /// Client only: whether the server sent a PSK identity hint (a Thali server never does).
    public let serverSentIdentityHint: Bool
    /// The application protocol both sides agreed on with ALPN
    /// (``PSKTLSConfiguration/applicationProtocols``); nil when the client offered none or the server
    /// selected none.
    public let applicationProtocol: String?

    /// The parameters of a handshake.
    public init(protocolVersion: String, cipherSuite: String, dhGroupBits: Int, pskIdentity: String,
                serverSentIdentityHint: Bool, applicationProtocol: String? = nil) {
        self.protocolVersion = protocolVersion
        self.cipherSuite = cipherSuite
        self.dhGroupBits = dhGroupBits
        self.pskIdentity = pskIdentity
        self.serverSentIdentityHint = serverSentIdentityHint
        self.applicationProtocol = applicationProtocol
    }
}

/// Events the handler fires through the pipeline.
public enum PSKTLSEvent: Sendable {
    /// The handshake finished and the parameters passed the profile's checks; application data flows.
    case handshakeCompleted(PSKTLSNegotiatedParameters)
}
