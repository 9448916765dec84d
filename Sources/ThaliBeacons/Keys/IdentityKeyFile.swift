import Foundation

/// Saves and loads a device identity key as a PEM `EC PRIVATE KEY` file (RFC 5915 `ECPrivateKey`,
/// with the secp256k1 parameters and the public key), the format `openssl ec` reads and writes.
///
/// Files are written with mode 0600 (atomically: a temporary file in the same directory, then
/// `rename`), and refused on load when group or others may read them, as ssh does.
/// `spec/beacons.md` documents the exact bytes.
public enum IdentityKeyFile {
    /// Largest file `load` reads; a valid file is about 220 bytes.
    public static let maximumFileSize = 4096

    private static let pemHeader = "-----BEGIN EC PRIVATE KEY-----"
    private static let pemFooter = "-----END EC PRIVATE KEY-----"
    /// DER up to the private scalar: SEQUENCE(116) { INTEGER 1, OCTET STRING(32) ...
    private static let derBeforeSecret: [UInt8] = [0x30, 0x74, 0x02, 0x01, 0x01, 0x04, 0x20]
    /// ... [0] { OID secp256k1 }, [1] { BIT STRING(66) { 0 unused bits, 04 ‖ X ‖ Y } }.
    private static let derBeforePublicKey: [UInt8] = [
        0xa0, 0x07, 0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x0a, 0xa1, 0x44, 0x03, 0x42, 0x00,
    ]

    /// The DER `ECPrivateKey` of `key` (118 bytes).
    public static func derEncoding(of key: PrivateKey) -> [UInt8] {
        derBeforeSecret + key.rawRepresentation + derBeforePublicKey + key.publicKey.uncompressed
    }

    /// The PEM text of `key`.
    public static func pemEncoding(of key: PrivateKey) -> String {
        let base64 = Data(derEncoding(of: key)).base64EncodedString(options: [.lineLength64Characters, .endLineWithLineFeed])
        return "\(pemHeader)\n\(base64)\n\(pemFooter)\n"
    }

    /// Parses the PEM text written by `pemEncoding(of:)` (or by `openssl ec` for a secp256k1 key).
    public static func parse(pem: String) throws(KeyError) -> PrivateKey {
        let lines = pem.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }
        guard let begin = lines.firstIndex(of: pemHeader), let end = lines.firstIndex(of: pemFooter), begin < end else {
            throw KeyError(.invalidKeyFile, "no '\(pemHeader)' ... '\(pemFooter)' block")
        }
        guard let der = Data(base64Encoded: lines[(begin + 1)..<end].joined()) else {
            throw KeyError(.invalidKeyFile, "the PEM body is not base64")
        }
        let bytes = [UInt8](der)
        let secretStart = derBeforeSecret.count
        let publicStart = secretStart + 32 + derBeforePublicKey.count
        guard bytes.count == publicStart + 65,
              bytes.starts(with: derBeforeSecret),
              bytes[(secretStart + 32)..<publicStart].elementsEqual(derBeforePublicKey)
        else {
            throw KeyError(.invalidKeyFile, "not an RFC 5915 secp256k1 ECPrivateKey with its public key (\(bytes.count) DER bytes)")
        }
        let key = try PrivateKey(rawRepresentation: bytes[secretStart..<(secretStart + 32)])
        let stored = try PublicKey(sec1: bytes[publicStart...])
        guard stored == key.publicKey else {
            throw KeyError(.invalidKeyFile, "the stored public key does not belong to the private key")
        }
        return key
    }

    /// Writes `key` to `path` with mode 0600, replacing any existing file atomically.
    public static func save(_ key: PrivateKey, to path: String) throws(KeyError) {
        let temporary = "\(path).tmp-\(getpid())-\(UInt32.random(in: .min ... .max))"
        let descriptor = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard descriptor >= 0 else { throw systemError("cannot create \(temporary)") }
        var bytes = Array(pemEncoding(of: key).utf8)
        defer { for index in bytes.indices { bytes[index] = 0 } }
        var written = 0
        while written < bytes.count {
            let result = bytes[written...].withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
            if result < 0 && errno == EINTR { continue }
            guard result > 0 else {
                let error = systemError("cannot write \(temporary)")
                close(descriptor)
                unlink(temporary)
                throw error
            }
            written += result
        }
        // fchmod in case a umask or filesystem default widened the mode at creation.
        guard fchmod(descriptor, 0o600) == 0, fsync(descriptor) == 0 else {
            let error = systemError("cannot finish \(temporary)")
            close(descriptor)
            unlink(temporary)
            throw error
        }
        close(descriptor)
        guard rename(temporary, path) == 0 else {
            let error = systemError("cannot rename \(temporary) to \(path)")
            unlink(temporary)
            throw error
        }
    }

    /// Reads a key written by `save(_:to:)`. Refuses files that group or others may access.
    public static func load(from path: String) throws(KeyError) -> PrivateKey {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { throw systemError("cannot open \(path)") }
        defer { close(descriptor) }
        var info = stat()
        guard fstat(descriptor, &info) == 0 else { throw systemError("cannot stat \(path)") }
        guard info.st_mode & S_IFMT == S_IFREG else {
            throw KeyError(.invalidKeyFile, "\(path) is not a regular file")
        }
        guard info.st_mode & 0o077 == 0 else {
            throw KeyError(.insecurePermissions, "\(path) has mode \(String(info.st_mode & 0o777, radix: 8)); a private key file must be 0600 or stricter")
        }
        guard info.st_size <= maximumFileSize else {
            throw KeyError(.invalidKeyFile, "\(path) is \(info.st_size) bytes, more than \(maximumFileSize)")
        }
        var buffer = [UInt8](repeating: 0, count: maximumFileSize + 1)
        defer { for index in buffer.indices { buffer[index] = 0 } }
        var total = 0
        while total < buffer.count {
            let result = buffer[total...].withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
            if result < 0 && errno == EINTR { continue }
            guard result >= 0 else { throw systemError("cannot read \(path)") }
            if result == 0 { break }
            total += result
        }
        guard total <= maximumFileSize else {
            throw KeyError(.invalidKeyFile, "\(path) grew beyond \(maximumFileSize) bytes while reading")
        }
        return try parse(pem: String(decoding: buffer[..<total], as: UTF8.self))
    }

    private static func systemError(_ what: String) -> KeyError {
        KeyError(.fileSystem, "\(what): \(String(cString: strerror(errno)))")
    }
}
