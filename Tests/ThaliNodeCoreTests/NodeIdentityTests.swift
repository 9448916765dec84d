import Foundation
import Testing
import ThaliBeacons
@testable import ThaliNodeCore

@Suite("Node identity")
struct NodeIdentityTests {
    @Test("create writes a 0600 key file that loads back; a second create is refused unless replacing")
    func createAndLoad() throws {
        let temporary = TemporaryHome("identity")
        #expect(throws: NodeError.missingIdentity(path: temporary.home.identityPath)) { try NodeIdentity.load(from: temporary.home) }
        let key = try NodeIdentity.create(in: temporary.home)
        let attributes = try FileManager.default.attributesOfItem(atPath: temporary.home.identityPath)
        #expect((attributes[.posixPermissions] as? NSNumber)?.intValue == 0o600)
        #expect(try NodeIdentity.load(from: temporary.home).publicKey == key.publicKey)
        #expect(throws: NodeError.identityExists(path: temporary.home.identityPath)) { try NodeIdentity.create(in: temporary.home) }
        let replaced = try NodeIdentity.create(in: temporary.home, replace: true)
        #expect(replaced.publicKey != key.publicKey)
        #expect(try NodeIdentity.load(from: temporary.home).publicKey == replaced.publicKey)
    }

    @Test("a damaged or world-readable key file is a typed error naming the file")
    func unusableIdentity() throws {
        let temporary = TemporaryHome("identity-bad")
        try temporary.home.create()
        try Data("not a key".utf8).write(to: URL(fileURLWithPath: temporary.home.identityPath))
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: temporary.home.identityPath)
        let damaged = try #require(throws: NodeError.self) { try NodeIdentity.load(from: temporary.home) }
        guard case .unusableIdentity(let path, _) = damaged else { Issue.record("\(damaged)"); return }
        #expect(path == temporary.home.identityPath)

        try NodeIdentity.create(in: temporary.home, replace: true)
        try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: temporary.home.identityPath)
        let open = try #require(throws: NodeError.self) { try NodeIdentity.load(from: temporary.home) }
        #expect("\(open)".contains("insecure-permissions"))
    }
}
