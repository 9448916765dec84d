import COpenSSL
import NIOCore

/// Looks up the PSK for an identity a client sent: the bytes, or nil when the identity is unknown or
/// no longer valid (the handshake then fails with `unknown_psk_identity`). Runs on the connection's
/// event loop during the handshake, so it must be quick and must not block.
public typealias PSKLookup = @Sendable (_ identity: String) -> [UInt8]?

/// One OpenSSL `SSL` object and its `ByteBufferBIO`: ciphertext from the network goes in with
/// `receive`, ciphertext for the network comes out with `takeOutput`. It does no I/O itself; the
/// channel handler moves the bytes. Owns the `SSL` (which owns the BIO) and frees it in deinit.
final class SSLConnection {
    /// The index of the `SSL` ex_data slot that points back at this object for OpenSSL's callbacks.
    private static let exDataIndex: Int32 = thali_SSL_get_ex_new_index()

    enum Credentials {
        case client(identity: [CChar], psk: [UInt8])
        case server(lookup: PSKLookup)
    }

    enum HandshakeResult {
        case completed(PSKTLSNegotiatedParameters)
        case wantsInput
        case failed(PSKTLSError)
    }

    enum ReadResult {
        /// Bytes were appended to the buffer (maybe fewer than asked: call again).
        case read(Int)
        /// No complete record is buffered: more ciphertext is needed.
        case wantsInput
        /// The peer sent close_notify.
        case closeNotify
        case failed(PSKTLSError)
    }

    let role: PSKTLSRole
    private let context: PSKTLSContext  // keeps the SSL_CTX alive as long as the SSL
    /// The context's ALPN protocols, for the server's selection callback.
    var contextApplicationProtocols: [[UInt8]] { context.applicationProtocols }
    private let ssl: OpaquePointer
    private let bio: ByteBufferBIO  // released after the SSL, which holds its BIO
    private let credentials: Credentials

    private var fatalAlertSent: TLSAlert?
    private var fatalAlertReceived: TLSAlert?
    /// The first warning alert received other than close_notify (a `no_renegotiation`, say).
    private(set) var warningAlertReceived: TLSAlert?
    private var identityHintReceived = false
    private var acceptedIdentity: String?

    init(context: PSKTLSContext, credentials: Credentials) throws(PSKTLSError) {
        role = context.role
        OpenSSLErrors.clear()
        guard let ssl = SSL_new(context.pointer) else {
            throw PSKTLSError(.failed, role: context.role, detail: "SSL_new: \(OpenSSLErrors.drain())")
        }
        let bio: ByteBufferBIO
        do {
            bio = try ByteBufferBIO(keptOutputBuffers: context.configuration.recycledCiphertextBuffers)
        } catch {
            SSL_free(ssl)
            throw PSKTLSError(.failed, role: context.role, detail: error.detail)
        }
        SSL_set_bio(ssl, bio.bio, bio.bio)  // ssl owns the BIO from here on (one reference for both directions)
        self.context = context
        self.ssl = ssl
        self.bio = bio
        self.credentials = credentials
        PSKTLSDiagnostics.adjust(\.connections, by: 1)

        SSL_set_ex_data(ssl, Self.exDataIndex, Unmanaged.passUnretained(self).toOpaque())
        switch credentials {
        case .client:
            SSL_set_connect_state(ssl)
            SSL_set_psk_client_callback(ssl) { ssl, hint, identity, maximumIdentityLength, psk, maximumPSKLength in
                guard let ssl, let identity, let psk, let connection = SSLConnection.owner(of: ssl) else { return 0 }
                return connection.clientPSK(hint: hint, identity: identity, maximumIdentityLength: Int(maximumIdentityLength),
                                            psk: psk, maximumPSKLength: Int(maximumPSKLength))
            }
        case .server:
            SSL_set_accept_state(ssl)
        }
    }

    deinit {
        SSL_set_ex_data(ssl, Self.exDataIndex, nil)  // callbacks during SSL_free must not reach a dying object
        SSL_free(ssl)
        PSKTLSDiagnostics.adjust(\.connections, by: -1)
    }

    /// The connection an `SSL` belongs to, for OpenSSL's C callbacks.
    static func owner(of ssl: OpaquePointer) -> SSLConnection? {
        guard let pointer = SSL_get_ex_data(ssl, exDataIndex) else { return nil }
        return Unmanaged<SSLConnection>.fromOpaque(pointer).takeUnretainedValue()
    }

    // MARK: Bytes in and out

    /// Hands ciphertext from the network to OpenSSL (kept, not copied, until OpenSSL reads it).
    func receive(_ buffer: ByteBuffer) {
        bio.appendInbound(buffer)
    }

    /// An upper bound for the plaintext the next reads can produce: ciphertext OpenSSL has not read,
    /// plaintext it has decrypted and not returned, and a full record (16 KiB) if part of one already
    /// sits in its buffer.
    var bufferedInput: Int {
        bio.inboundBytes + Int(SSL_pending(ssl)) + (SSL_has_pending(ssl) == 1 ? Self.maximumRecordPlaintext : 0)
    }

    /// The most plaintext one TLS record carries (RFC 5246 §6.2.1).
    static let maximumRecordPlaintext = 16_384

    /// How many bytes of ciphertext wait to go to the network.
    var pendingOutput: Int { bio.pendingOutput }

    /// Makes room for `bytes` more ciphertext, so encrypting a large write allocates once.
    func reserveOutput(_ bytes: Int) { bio.reserveOutput(bytes) }

    /// How many times ciphertext went into a buffer the channel had finished with (for tests).
    var reusedOutputBuffers: Int { bio.reusedOutputBuffers }

    /// All ciphertext waiting for the network.
    func takeOutput() -> ByteBuffer { bio.takeOutput() }

    // MARK: Handshake

    func handshake() -> HandshakeResult {
        OpenSSLErrors.clear()
        let result = SSL_do_handshake(ssl)
        if result == 1 {
            return verifiedParameters()
        }
        switch SSL_get_error(ssl, result) {
        case SSL_ERROR_WANT_READ, SSL_ERROR_WANT_WRITE:
            return .wantsInput
        default:
            return .failed(failure())
        }
    }

    /// Checks what was negotiated against the profile: TLS 1.2, the one suite, a DH prime of at least
    /// 2048 bits. OpenSSL is configured to allow nothing else; this check makes sure of it.
    private func verifiedParameters() -> HandshakeResult {
        let version = String(cString: SSL_get_version(ssl))
        let cipher = SSL_get_current_cipher(ssl)
        let cipherName = cipher.map { String(cString: SSL_CIPHER_get_name($0)) } ?? "none"
        let cipherID = cipher.map { SSL_CIPHER_get_protocol_id($0) } ?? 0
        // The client reads the size from the server's key; a server has freed its own key by now (OpenSSL
        // drops it after deriving the secret) and used the group of its context.
        var dhBits = context.configuration.dhGroup.bits
        if role == .client {
            dhBits = 0
            if let key = thali_SSL_get_peer_tmp_key(ssl) {
                if EVP_PKEY_get_base_id(key) == EVP_PKEY_DH { dhBits = Int(EVP_PKEY_get_bits(key)) }
                EVP_PKEY_free(key)
            }
        }
        guard SSL_version(ssl) == TLS1_2_VERSION, cipherID == PSKTLSProfile.cipherSuiteID,
              dhBits >= PSKTLSProfile.minimumDHBits
        else {
            return .failed(PSKTLSError(.unacceptableNegotiation, role: role,
                                       detail: "version \(version), cipher \(cipherName), DH \(dhBits) bits"))
        }
        let identity: String
        switch credentials {
        case .client(let bytes, _): identity = String(decoding: bytes.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        case .server: identity = acceptedIdentity ?? ""
        }
        return .completed(PSKTLSNegotiatedParameters(
            protocolVersion: version, cipherSuite: cipherName, dhGroupBits: dhBits, pskIdentity: identity,
            serverSentIdentityHint: identityHintReceived, applicationProtocol: selectedApplicationProtocol()))
    }

    /// The ALPN protocol the handshake selected, if any.
    private func selectedApplicationProtocol() -> String? {
        var data: UnsafePointer<UInt8>?
        var length: UInt32 = 0
        SSL_get0_alpn_selected(ssl, &data, &length)
        guard let data, length > 0 else { return nil }
        return String(decoding: UnsafeBufferPointer(start: data, count: Int(length)), as: UTF8.self)
    }

    /// Server: the first of the context's protocols that the client's ALPN list (`offered`, RFC 7301 wire
    /// form) names, as a range of `offered`; nil when none (or the list is malformed).
    static func selectApplicationProtocol(offered: UnsafeBufferPointer<UInt8>, accepted: [[UInt8]]) -> Range<Int>? {
        var names: [Range<Int>] = []
        var index = 0
        while index < offered.count {
            let length = Int(offered[index])
            guard length > 0, index + 1 + length <= offered.count else { return nil }
            names.append(index + 1 ..< index + 1 + length)
            index += 1 + length
        }
        for wanted in accepted {
            if let found = names.first(where: { $0.count == wanted.count && offered[$0].elementsEqual(wanted) }) { return found }
        }
        return nil
    }

    // MARK: Application data

    /// Decrypts into the writable space of `buffer` (at most `maximum` bytes).
    func read(into buffer: inout ByteBuffer, maximum: Int) -> ReadResult {
        OpenSSLErrors.clear()
        var count = 0
        var status: Int32 = 0
        buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: maximum) { target in
            status = SSL_read_ex(ssl, target.baseAddress, min(target.count, maximum), &count)
            return status == 1 ? count : 0
        }
        if status == 1 { return .read(count) }
        switch SSL_get_error(ssl, status) {
        case SSL_ERROR_WANT_READ, SSL_ERROR_WANT_WRITE: return .wantsInput
        case SSL_ERROR_ZERO_RETURN: return .closeNotify
        default: return .failed(failure())
        }
    }

    /// Encrypts `bytes` into the output buffer. The BIO never pushes back, so this writes everything
    /// or fails.
    func write(_ bytes: UnsafeRawBufferPointer) -> PSKTLSError? {
        guard bytes.count > 0 else { return nil }
        OpenSSLErrors.clear()
        var written = 0
        let status = SSL_write_ex(ssl, bytes.baseAddress, bytes.count, &written)
        if status == 1 && written == bytes.count { return nil }
        return failure()
    }

    /// Queues a close_notify alert in the output buffer (without waiting for the peer's).
    func sendCloseNotify() {
        OpenSSLErrors.clear()
        _ = SSL_shutdown(ssl)
        OpenSSLErrors.clear()
    }

    // MARK: Renegotiation (the conformance hook, `PSKTLSRenegotiation`)

    /// Client, after the handshake: queues a ClientHello inside the session. Returns the error when
    /// OpenSSL will not start.
    func requestRenegotiation() -> PSKTLSError? {
        OpenSSLErrors.clear()
        warningAlertReceived = nil  // only an answer to this request counts
        _ = SSL_clear_options(ssl, thali_SSL_OP_NO_RENEGOTIATION())
        guard SSL_renegotiate(ssl) == 1 else { return failure() }
        let result = SSL_do_handshake(ssl)
        guard result != 1 else { return nil }
        switch SSL_get_error(ssl, result) {
        case SSL_ERROR_WANT_READ, SSL_ERROR_WANT_WRITE: return nil
        default: return failure()
        }
    }

    /// Whether a renegotiation asked for has not finished yet.
    var renegotiationPending: Bool { SSL_renegotiate_pending(ssl) == 1 }

    // MARK: Errors and alerts

    /// The typed error for the failure OpenSSL just reported.
    private func failure() -> PSKTLSError {
        let detail = OpenSSLErrors.drain()
        if let alert = fatalAlertReceived { return PSKTLSError(.alertReceived(alert), role: role, detail: detail) }
        if let alert = fatalAlertSent { return PSKTLSError(.alertSent(alert), role: role, detail: detail) }
        return PSKTLSError(.failed, role: role, detail: detail.isEmpty ? "no error queued" : detail)
    }

    /// Called by the info callback for every alert sent or received.
    func recordAlert(level: UInt8, alert: TLSAlert, sent: Bool) {
        // Only fatal alerts (level 2) end a connection; close_notify and warnings are not failures.
        guard level == 2 else {
            if level == 1, !sent, alert != .closeNotify { warningAlertReceived = warningAlertReceived ?? alert }
            return
        }
        if sent { fatalAlertSent = fatalAlertSent ?? alert } else { fatalAlertReceived = fatalAlertReceived ?? alert }
    }

    // MARK: PSK callbacks

    /// The client's callback: copies the identity (NUL-terminated) and the PSK into OpenSSL's buffers.
    fileprivate func clientPSK(hint: UnsafePointer<CChar>?, identity: UnsafeMutablePointer<CChar>,
                               maximumIdentityLength: Int, psk: UnsafeMutablePointer<UInt8>,
                               maximumPSKLength: Int) -> UInt32 {
        identityHintReceived = hint.map { $0.pointee != 0 } ?? false
        guard case .client(let identityBytes, let key) = credentials else { return 0 }
        // identityBytes ends in NUL; OpenSSL's limit excludes it.
        guard identityBytes.count - 1 <= maximumIdentityLength, key.count <= maximumPSKLength, !key.isEmpty else { return 0 }
        identityBytes.withUnsafeBufferPointer { source in
            for index in source.indices { identity[index] = source[index] }
        }
        key.withUnsafeBufferPointer { source in
            for index in source.indices { psk[index] = source[index] }
        }
        return UInt32(key.count)
    }

    /// The server's callback: asks the lookup for the identity's PSK; 0 means unknown identity.
    func serverPSK(identity: UnsafePointer<CChar>, into psk: UnsafeMutablePointer<UInt8>,
                               maximumLength: Int) -> UInt32 {
        guard case .server(let lookup) = credentials,
              let name = String(validatingCString: identity),
              let key = lookup(name), !key.isEmpty, key.count <= maximumLength
        else { return 0 }
        key.withUnsafeBufferPointer { source in
            for index in source.indices { psk[index] = source[index] }
        }
        acceptedIdentity = name
        return UInt32(key.count)
    }
}
