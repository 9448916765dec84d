import CSecp256k1

/// Owns the one libsecp256k1 context of the process and frees it in `deinit`.
///
/// After creation and blinding the context is only used through `const` pointers, which libsecp256k1
/// documents as safe to share between threads; hence `@unchecked Sendable`.
final class Secp256k1Context: @unchecked Sendable {
    /// The process-wide context.
    static let shared = Secp256k1Context()

    let pointer: OpaquePointer
    /// The context's memory, allocated by Swift: libsecp256k1 then allocates nothing itself.
    private let memory: UnsafeMutableRawPointer

    private init() {
        let flags = UInt32(SECP256K1_CONTEXT_NONE)
        // Swift allocates the context (and traps on exhaustion as every allocation does); the library's own
        // `secp256k1_context_create` could fail on its malloc and leave nothing to run with.
        memory = .allocate(byteCount: secp256k1_context_preallocated_size(flags), alignment: 16)
        guard let context = secp256k1_context_preallocated_create(memory, flags) else {
            // Cannot fire: preallocated_create allocates nothing and fails only for illegal flags, and these
            // are the constant SECP256K1_CONTEXT_NONE; no input reaches here.
            preconditionFailure("libsecp256k1 refused SECP256K1_CONTEXT_NONE")
        }
        // Blinding protects the scalar multiplications against side channels; a failure only loses
        // the extra protection, so the result is deliberately not fatal.
        var seed = SecureRandom.bytes(count: 32)
        _ = secp256k1_context_randomize(context, &seed)
        self.pointer = context
    }

    deinit {
        secp256k1_context_preallocated_destroy(pointer)
        memory.deallocate()
    }

    /// Parses a SEC1 encoded point (33 or 65 bytes), rejecting points not on the curve.
    func parsePublicKey(_ bytes: UnsafeBufferPointer<UInt8>) -> secp256k1_pubkey? {
        guard let base = bytes.baseAddress else { return nil }
        var key = secp256k1_pubkey()
        guard secp256k1_ec_pubkey_parse(pointer, &key, base, bytes.count) == 1 else { return nil }
        return key
    }

    /// Serialises a point, compressed (33 bytes) or uncompressed (65 bytes).
    func serialize(_ key: secp256k1_pubkey, compressed: Bool) -> [UInt8] {
        var key = key
        var length = compressed ? 33 : 65
        var output = [UInt8](repeating: 0, count: length)
        let flags = UInt32(compressed ? SECP256K1_EC_COMPRESSED : SECP256K1_EC_UNCOMPRESSED)
        let ok = secp256k1_ec_pubkey_serialize(pointer, &output, &length, &key, flags)
        precondition(ok == 1 && length == output.count, "libsecp256k1: serialising a parsed key failed")
        return output
    }

    /// Whether 32 bytes are a valid secret scalar (0 < k < n).
    func isValidSecretKey(_ bytes: [UInt8]) -> Bool {
        bytes.count == 32 && secp256k1_ec_seckey_verify(pointer, bytes) == 1
    }

    /// The public point of a valid secret scalar.
    func publicKey(forSecretKey secret: [UInt8]) -> secp256k1_pubkey {
        var key = secp256k1_pubkey()
        let ok = secp256k1_ec_pubkey_create(pointer, &key, secret)
        precondition(ok == 1, "libsecp256k1: public key of a verified secret key failed")
        return key
    }

    /// ECDH whose output is the 32-byte x-coordinate of the shared point (not hashed, unlike the
    /// library's default), as the beacon formats require. Both inputs were validated at construction,
    /// so the library cannot refuse them.
    func sharedSecret(secretKey: [UInt8], publicKey: secp256k1_pubkey) -> [UInt8] {
        var point = publicKey
        var output = [UInt8](repeating: 0, count: 32)
        let ok = secp256k1_ecdh(pointer, &output, &point, secretKey, copyXCoordinate, nil)
        precondition(ok == 1, "libsecp256k1: ECDH with validated keys failed")
        return output
    }
}

/// `secp256k1_ecdh` hash callback that returns the raw x-coordinate.
private let copyXCoordinate: secp256k1_ecdh_hash_function = { output, x32, _, _ in
    guard let output, let x32 else { return 0 }
    output.update(from: x32, count: 32)
    return 1
}
