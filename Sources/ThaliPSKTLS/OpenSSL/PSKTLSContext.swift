import COpenSSL
import ThaliMutants

/// An OpenSSL `SSL_CTX` configured for the Thali PSK profile, for one role. Immutable once built and
/// shared by every connection of a client or server (building one costs far more than a handshake).
///
/// The profile: TLS 1.2 only; the cipher list is exactly `DHE-PSK-AES256-GCM-SHA384` and no TLS 1.3
/// suites; no session cache, tickets or renegotiation (each handshake runs a fresh DH exchange and
/// the PSK lookup); security level 2, so a client refuses DH primes under 2048 bits during the
/// handshake; a server uses the configured RFC 7919 group and sends no identity hint.
public final class PSKTLSContext: @unchecked Sendable {
    // @unchecked: the SSL_CTX is fully configured in init and only read afterwards; OpenSSL allows
    // concurrent SSL_new on one context.

    /// The side this context serves.
    public let role: PSKTLSRole
    /// The configuration it was built from.
    public let configuration: PSKTLSConfiguration

    let pointer: OpaquePointer  // SSL_CTX *
    private let dhParameters: DHParameters?

    /// Builds a context for `role`. Throws `PSKTLSError` with reason `invalidConfiguration` if OpenSSL
    /// refuses a setting (which means the OpenSSL build lacks the suite or the group).
    public init(role: PSKTLSRole, configuration: PSKTLSConfiguration = PSKTLSConfiguration()) throws(PSKTLSError) {
        OpenSSLErrors.clear()
        try Self.validateApplicationProtocols(configuration.applicationProtocols, role: role)
        // The group first: everything allocated before a throw must already belong to a stored property.
        let dhParameters = role == .server ? try DHParameters(group: configuration.dhGroup) : nil
        guard let context = SSL_CTX_new(role == .server ? TLS_server_method() : TLS_client_method()) else {
            throw PSKTLSError(.invalidConfiguration, role: role, detail: "SSL_CTX_new: \(OpenSSLErrors.drain())")
        }
        self.role = role
        self.configuration = configuration
        self.pointer = context
        self.dhParameters = dhParameters
        self.applicationProtocols = configuration.applicationProtocols.map { Array($0.utf8) }
        PSKTLSDiagnostics.adjust(\.contexts, by: 1)

        func check(_ ok: Bool, _ what: String) throws(PSKTLSError) {
            if !ok { throw PSKTLSError(.invalidConfiguration, role: role, detail: "\(what): \(OpenSSLErrors.drain())") }
        }
        // Self is fully initialised: a throw below runs deinit, which frees the context.
        try check(thali_SSL_CTX_set_min_proto_version(context, TLS1_2_VERSION) == 1, "min version")
        try check(thali_SSL_CTX_set_max_proto_version(context, TLS1_2_VERSION) == 1, "max version")
        try check(SSL_CTX_set_cipher_list(context, PSKTLSProfile.cipherSuite) == 1, "cipher list")
        try check(SSL_CTX_set_ciphersuites(context, "") == 1, "TLS 1.3 suites")
        SSL_CTX_set_security_level(context, Mutant.tlsAcceptsSmallGroup.isActive ? 0 : 2)
        _ = SSL_CTX_set_options(
            context, (Mutant.tlsSessionTickets.isActive ? 0 : thali_SSL_OP_NO_TICKET()) | thali_SSL_OP_NO_RENEGOTIATION()
                | thali_SSL_OP_NO_COMPRESSION())
        if Mutant.tlsIdentityHint.isActive && role == .server { _ = SSL_CTX_use_psk_identity_hint(context, "thali") }
        _ = thali_SSL_CTX_set_session_cache_mode(context, Int(SSL_SESS_CACHE_OFF))
        SSL_CTX_set_info_callback(context) { ssl, type, value in
            guard let ssl, type & SSL_CB_ALERT != 0, let connection = SSLConnection.owner(of: ssl) else { return }
            connection.recordAlert(level: UInt8(truncatingIfNeeded: value >> 8),
                                   alert: TLSAlert(rawValue: UInt8(truncatingIfNeeded: value)),
                                   sent: type & SSL_CB_WRITE != 0)
        }
        try Self.configureApplicationProtocols(context, role: role, configuration.applicationProtocols)
        if let dhParameters {
            let key = dhParameters.retainedPointer()
            if SSL_CTX_set0_tmp_dh_pkey(context, key) != 1 {
                EVP_PKEY_free(key)
                try check(false, "SSL_CTX_set0_tmp_dh_pkey(\(configuration.dhGroup.rawValue))")
            }
            SSL_CTX_set_psk_server_callback(context) { ssl, identity, psk, maximumLength in
                guard let ssl, let identity, let psk, let connection = SSLConnection.owner(of: ssl) else { return 0 }
                return connection.serverPSK(identity: identity, into: psk, maximumLength: Int(maximumLength))
            }
        }
        OpenSSLErrors.clear()
    }

    /// The ALPN protocols of the context, each as its bytes: checked for length and count.
    let applicationProtocols: [[UInt8]]

    /// Client: the protocols offered in the ClientHello. Server: a selection callback that picks the first
    /// of ours the client offered, and sends no ALPN extension (rather than a fatal alert) when none fits,
    /// so a client that offers something else still connects.
    private static func configureApplicationProtocols(_ context: OpaquePointer, role: PSKTLSRole,
                                                      _ names: [String]) throws(PSKTLSError) {
        guard !names.isEmpty else { return }
        var wire: [UInt8] = []
        for name in names {
            let bytes = Array(name.utf8)
            wire.append(UInt8(bytes.count))
            wire += bytes
        }
        switch role {
        case .client:
            // SSL_CTX_set_alpn_protos returns 0 on success.
            if SSL_CTX_set_alpn_protos(context, wire, UInt32(wire.count)) != 0 {
                throw PSKTLSError(.invalidConfiguration, role: role, detail: "SSL_CTX_set_alpn_protos: \(OpenSSLErrors.drain())")
            }
        case .server:
            SSL_CTX_set_alpn_select_cb(context, { ssl, out, outLength, offered, offeredLength, _ in
                guard let ssl, let out, let outLength, let offered,
                      let connection = SSLConnection.owner(of: ssl) else { return SSL_TLSEXT_ERR_NOACK }
                let list = UnsafeBufferPointer(start: offered, count: Int(offeredLength))
                guard let range = SSLConnection.selectApplicationProtocol(
                    offered: list, accepted: connection.contextApplicationProtocols) else { return SSL_TLSEXT_ERR_NOACK }
                // Points into the client's list: OpenSSL copies the selection before the list goes.
                out.pointee = offered + range.lowerBound
                outLength.pointee = UInt8(range.count)
                return SSL_TLSEXT_ERR_OK
            }, nil)
        }
    }

    /// Checks the names against the profile's bounds.
    static func validateApplicationProtocols(_ names: [String], role: PSKTLSRole) throws(PSKTLSError) {
        guard names.count <= PSKTLSProfile.maximumApplicationProtocols else {
            throw PSKTLSError(.invalidConfiguration, role: role,
                              detail: "\(names.count) application protocols; at most \(PSKTLSProfile.maximumApplicationProtocols)")
        }
        for name in names where name.utf8.isEmpty || name.utf8.count > PSKTLSProfile.maximumApplicationProtocolLength {
            throw PSKTLSError(.invalidConfiguration, role: role,
                              detail: "application protocol \"\(name)\" is not 1...\(PSKTLSProfile.maximumApplicationProtocolLength) bytes")
        }
    }

    deinit {
        SSL_CTX_free(pointer)
        PSKTLSDiagnostics.adjust(\.contexts, by: -1)
    }
}
