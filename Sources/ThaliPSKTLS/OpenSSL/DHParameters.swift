import COpenSSL

/// The parameters (prime and generator) of an RFC 7919 group as an `EVP_PKEY`, built from the group's
/// name so that OpenSSL knows it is a named safe-prime group and uses its short private exponent.
/// OpenSSL generates a fresh key pair from these parameters for every handshake.
final class DHParameters {
    let pointer: OpaquePointer  // EVP_PKEY *

    init(group: DHGroup) throws(PSKTLSError) {
        guard let keyContext = EVP_PKEY_CTX_new_from_name(nil, "DH", nil) else {
            throw PSKTLSError(.invalidConfiguration, role: .server, detail: "EVP_PKEY_CTX_new_from_name(DH): \(OpenSSLErrors.drain())")
        }
        defer { EVP_PKEY_CTX_free(keyContext) }
        var key: OpaquePointer? = nil
        // An OSSL_PARAM keeps pointers to its key and its value: both C strings must outlive every call
        // that reads the parameters, so both come from withCString scopes that enclose those calls. (The
        // key is a Swift String here; passed directly, its temporary C copy would be freed as soon as
        // OSSL_PARAM_construct_utf8_string returned, and set_params would read freed memory.)
        let generated = OSSL_PKEY_PARAM_GROUP_NAME.withCString { parameterName in
            group.rawValue.withCString { name -> Bool in
                guard EVP_PKEY_paramgen_init(keyContext) == 1 else { return false }
                var parameters = [
                    OSSL_PARAM_construct_utf8_string(parameterName, UnsafeMutablePointer(mutating: name), 0),
                    OSSL_PARAM_construct_end(),
                ]
                return EVP_PKEY_CTX_set_params(keyContext, &parameters) == 1 && EVP_PKEY_paramgen(keyContext, &key) == 1
            }
        }
        guard generated, let key else {
            throw PSKTLSError(.invalidConfiguration, role: .server, detail: "DH group \(group.rawValue): \(OpenSSLErrors.drain())")
        }
        pointer = key
        PSKTLSDiagnostics.adjust(\.dhParameters, by: 1)
    }

    /// A new reference for an OpenSSL call that takes ownership (`set0`).
    func retainedPointer() -> OpaquePointer {
        EVP_PKEY_up_ref(pointer)
        return pointer
    }

    deinit {
        EVP_PKEY_free(pointer)
        PSKTLSDiagnostics.adjust(\.dhParameters, by: -1)
    }
}
