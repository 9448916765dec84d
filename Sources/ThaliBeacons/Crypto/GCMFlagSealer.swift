import COpenSSL

/// Seals `spec` beacon flags (AES-128-GCM of a 16-byte KeyId, each under its own key and nonce)
/// through OpenSSL's EVP with one cipher context, re-keyed for each flag. swift-crypto's `AES.GCM.seal`
/// sets up and frees a context and boxes its result on every call, which cost about three times as
/// much. Owns its context and frees it in `deinit`; not thread-safe, so a generator makes one per
/// announcement.
final class GCMFlagSealer {
    static let keyLength = 16
    static let nonceLength = 12
    static let tagLength = 16

    private let context: OpaquePointer

    /// Throws when libcrypto offers no AES-128-GCM or cannot set up a cipher context (out of memory).
    init() throws(BeaconGenerationError) {
        guard let cipher = AES128GCM.shared.cipher else {
            throw BeaconGenerationError("OpenSSL: AES-128-GCM is not available")
        }
        guard let context = EVP_CIPHER_CTX_new() else {
            throw BeaconGenerationError("OpenSSL: no cipher context (EVP_CIPHER_CTX_new failed)")
        }
        guard EVP_EncryptInit_ex2(context, cipher, nil, nil, nil) == 1 else {
            EVP_CIPHER_CTX_free(context)
            throw BeaconGenerationError("OpenSSL: EVP_EncryptInit_ex2(AES-128-GCM) failed")
        }
        self.context = context
    }

    deinit {
        EVP_CIPHER_CTX_free(context)
    }

    /// Appends the 16-byte ciphertext and the 16-byte tag of `plaintext` (16 bytes) to `stream`.
    /// `key` is 16 bytes and `nonce` 12 (the default GCM nonce length).
    func seal(_ plaintext: [UInt8], key: UnsafeRawBufferPointer, nonce: UnsafeRawBufferPointer, into stream: inout [UInt8]) {
        precondition(plaintext.count == 16 && key.count == Self.keyLength && nonce.count == Self.nonceLength,
                     "a flag seals 16 bytes under a 16-byte key and a 12-byte nonce")
        let start = stream.count
        stream.append(contentsOf: repeatElement(0, count: 16 + Self.tagLength))
        let sealed = stream.withUnsafeMutableBufferPointer { output in
            let ciphertext = output.baseAddress! + start  // stream just grew by 32 bytes: never nil
            var written: Int32 = 0
            return EVP_EncryptInit_ex2(context, nil, key.baseAddress, nonce.baseAddress, nil) == 1
                && EVP_EncryptUpdate(context, ciphertext, &written, plaintext, 16) == 1 && written == 16
                && EVP_EncryptFinal_ex(context, ciphertext + 16, &written) == 1 && written == 0
                && EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_GET_TAG, Int32(Self.tagLength), ciphertext + 16) == 1
        }
        // With a valid key, nonce and length, only a broken libcrypto fails here.
        precondition(sealed, "OpenSSL: sealing a beacon flag with AES-128-GCM failed")
    }
}

/// The process's AES-128-GCM implementation, fetched from OpenSSL's providers once: EVP_CIPHER objects
/// are reference counted and safe to share between threads once fetched. Never freed.
private final class AES128GCM: @unchecked Sendable {
    static let shared = AES128GCM()
    let cipher: OpaquePointer?
    private init() { cipher = EVP_CIPHER_fetch(nil, "AES-128-GCM", nil) }
}
