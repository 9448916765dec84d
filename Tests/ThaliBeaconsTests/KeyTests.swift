import Foundation
import Testing
import ThaliBeacons
import ThaliSupport
import ThaliTestSupport

@Suite struct KeyTests {
    // A vector sender (S01): private key and its uncompressed public key.
    let secretHex = "b17718888015ed739a3b34252d79f7b8d5355dbf89cfce54cabac067eb8579db"
    let publicHex = "0446828faac4011e5e8eadb981a4dbe029c5602f29620959798a582b973f6529616e322ef693d9bb78d2d2593d0f798e4519b8a197ca34ef67caa46b233cf9d9ce"

    @Test func privateKeyDerivesItsPublicKey() throws {
        let key = try PrivateKey(hex: secretHex)
        #expect(key.publicKey.hexString() == publicHex)
        #expect(Hex.encode(key.rawRepresentation) == secretHex)
    }

    @Test func compressedAndUncompressedImportsAreTheSamePoint() throws {
        let full = try PublicKey(hex: publicHex)
        #expect(full.uncompressed.count == 65)
        #expect(full.compressed.count == 33)
        // Y ends in ...ce (even), so the compressed prefix is 02.
        #expect(full.compressed.first == 0x02)
        let fromCompressed = try PublicKey(sec1: full.compressed)
        #expect(fromCompressed == full)
        #expect(fromCompressed.hashValue == full.hashValue)
        #expect(fromCompressed.uncompressed == full.uncompressed)
        #expect(try PublicKey(hex: full.hexString(compressed: true)) == full)
        #expect(try PublicKey(hex: publicHex.uppercased()) == full)
    }

    @Test func base64AndSubjectPublicKeyInfoRoundTrip() throws {
        let key = try PublicKey(hex: publicHex)
        #expect(key.base64String() == Data(key.uncompressed).base64EncodedString())
        #expect(try PublicKey(base64: key.base64String()) == key)
        #expect(try PublicKey(base64: key.base64String(compressed: true)) == key)
        #expect(key.subjectPublicKeyInfo.count == 88)
        #expect(Hex.encode(key.subjectPublicKeyInfo.prefix(23)) == "3056301006072a8648ce3d020106052b8104000a034200")
        #expect(try PublicKey(subjectPublicKeyInfo: key.subjectPublicKeyInfo) == key)
    }

    @Test func strictParsingRejectsBadKeys() throws {
        let good = try #require(Hex.decode(publicHex))
        func kind(_ bytes: [UInt8]) -> KeyError.Kind? {
            do { _ = try PublicKey(sec1: bytes); return nil } catch { return error.kind }
        }
        #expect(kind([]) == .invalidEncoding)
        #expect(kind(Array(good.dropLast())) == .invalidEncoding)
        #expect(kind(good + [0]) == .invalidEncoding)
        var hybrid = good
        hybrid[0] = 0x06
        #expect(kind(hybrid) == .invalidEncoding)
        var offCurve = good
        offCurve[64] ^= 1
        #expect(kind(offCurve) == .notOnCurve)
        // x = 5 has no point on secp256k1 (5^3 + 7 = 132 is not a square mod p).
        #expect(kind([0x02] + [UInt8](repeating: 0, count: 31) + [5]) == .notOnCurve)
        #expect(throws: KeyError.self) { try PublicKey(hex: "zz") }
        #expect(throws: KeyError.self) { try PublicKey(base64: "***") }
    }

    @Test func privateKeyRangeIsChecked() {
        #expect(throws: KeyError.self) { try PrivateKey(rawRepresentation: [UInt8](repeating: 0, count: 32)) }
        #expect(throws: KeyError.self) { try PrivateKey(rawRepresentation: [UInt8](repeating: 1, count: 31)) }
        // n, the group order, is out of range.
        #expect(throws: KeyError.self) {
            try PrivateKey(hex: "fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141")
        }
        #expect(throws: Never.self) {
            try PrivateKey(hex: "fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364140")
        }
    }

    @Test func randomKeysDifferAndAgreeOnECDH() {
        let alice = PrivateKey()
        let bob = PrivateKey()
        #expect(alice.rawRepresentation != bob.rawRepresentation)
        let secret = alice.sharedSecret(with: bob.publicKey)
        #expect(secret.count == 32)
        #expect(secret == bob.sharedSecret(with: alice.publicKey))
        // The x-coordinate, not a hash: for k = 1 the "shared point" is the other side's own point.
        let one = try! PrivateKey(rawRepresentation: [UInt8](repeating: 0, count: 31) + [1])
        #expect(one.sharedSecret(with: bob.publicKey) == Array(bob.publicKey.uncompressed[1..<33]))
    }

    @Test func keyFileRoundTripsWithMode0600() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("thali-beacons-keys-\(getpid())-\(UUID())").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/identity.pem"
        let key = PrivateKey()
        try IdentityKeyFile.save(key, to: path)
        var info = stat()
        #expect(stat(path, &info) == 0)
        #expect(info.st_mode & 0o777 == 0o600)
        let loaded = try IdentityKeyFile.load(from: path)
        #expect(loaded.rawRepresentation == key.rawRepresentation)
        #expect(loaded.publicKey == key.publicKey)
        // Saving again replaces the file and keeps the mode.
        let other = PrivateKey()
        try IdentityKeyFile.save(other, to: path)
        #expect(try IdentityKeyFile.load(from: path).publicKey == other.publicKey)
        #expect(stat(path, &info) == 0 && info.st_mode & 0o777 == 0o600)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory) == ["identity.pem"])
    }

    @Test func keyFileLoadRefusesOpenModesAndGarbage() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("thali-beacons-keys-\(getpid())-\(UUID())").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/identity.pem"
        try IdentityKeyFile.save(PrivateKey(), to: path)
        chmod(path, 0o644)
        #expect { try IdentityKeyFile.load(from: path) } throws: { ($0 as? KeyError)?.kind == .insecurePermissions }

        func loadText(_ text: String) -> KeyError.Kind? {
            _ = FileManager.default.createFile(atPath: path, contents: Data(text.utf8), attributes: [.posixPermissions: 0o600])
            do { _ = try IdentityKeyFile.load(from: path); return nil } catch { return error.kind }
        }
        #expect(loadText("hello") == .invalidKeyFile)
        #expect(loadText("-----BEGIN EC PRIVATE KEY-----\n!!!\n-----END EC PRIVATE KEY-----\n") == .invalidKeyFile)
        // A well-formed file whose public key belongs to another private key.
        var der = IdentityKeyFile.derEncoding(of: PrivateKey())
        der.replaceSubrange(53..<118, with: PrivateKey().publicKey.uncompressed)
        let pem = "-----BEGIN EC PRIVATE KEY-----\n\(Data(der).base64EncodedString())\n-----END EC PRIVATE KEY-----\n"
        #expect(loadText(pem) == .invalidKeyFile)
        #expect(loadText(String(repeating: "A", count: IdentityKeyFile.maximumFileSize + 1)) == .invalidKeyFile)
        #expect { try IdentityKeyFile.load(from: directory + "/missing.pem") } throws: { ($0 as? KeyError)?.kind == .fileSystem }
        #expect { try IdentityKeyFile.load(from: directory) } throws: { ($0 as? KeyError)?.kind == .invalidKeyFile }
    }

    /// The key file is the format OpenSSL uses: the real `openssl` reads ours and derives the same
    /// public key, and we read a key `openssl` generated.
    @Test func keyFileInteroperatesWithOpenSSL() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("thali-beacons-keys-\(getpid())-\(UUID())").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let ours = directory + "/ours.pem"
        let key = PrivateKey()
        try IdentityKeyFile.save(key, to: ours)
        let spki = try runOpenSSL(["ec", "-in", ours, "-pubout", "-outform", "DER"])
        #expect(spki == key.publicKey.subjectPublicKeyInfo)

        let theirs = directory + "/theirs.pem"
        _ = try runOpenSSL(["ecparam", "-name", "secp256k1", "-genkey", "-noout", "-out", theirs], output: false)
        chmod(theirs, 0o600)
        let loaded = try IdentityKeyFile.load(from: theirs)
        let theirSPKI = try runOpenSSL(["ec", "-in", theirs, "-pubout", "-outform", "DER"])
        #expect(loaded.publicKey.subjectPublicKeyInfo == theirSPKI)
    }

    /// Runs `openssl` with `arguments`; when `output` is true, openssl writes to a temporary file (its
    /// DER output is binary, and stderr carries its progress lines) whose bytes are returned.
    private func runOpenSSL(_ arguments: [String], output: Bool = true) throws -> [UInt8] {
        let outputPath = FileManager.default.temporaryDirectory
            .appendingPathComponent("thali-openssl-\(getpid())-\(UUID().uuidString.prefix(8))").path
        defer { try? FileManager.default.removeItem(atPath: outputPath) }
        let result = try ChildProcess.run("/usr/bin/openssl", arguments + (output ? ["-out", outputPath] : []))
        #expect(result.status == 0, "openssl \(arguments): \(result.output)")
        return output ? [UInt8](try Data(contentsOf: URL(fileURLWithPath: outputPath))) : []
    }
}
