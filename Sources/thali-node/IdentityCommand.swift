import ArgumentParser
import Foundation
import ThaliBeacons
import ThaliNodeCore

/// `thali-node identity create|show`: the node's own secp256k1 key, which contacts add with
/// `contacts add NAME PUBLIC-KEY`.
struct Identity: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Create or show this node's identity (its secp256k1 key pair).",
        subcommands: [Create.self, Show.self], defaultSubcommand: Show.self
    )

    struct Description: Encodable {
        let publicKey: String
        let publicKeyUncompressed: String
        let publicKeyBase64: String
        let keyFile: String
        /// `identity create --force`: where the replaced key was kept.
        var oldKeyFile: String?

        init(_ key: PrivateKey, path: String, oldKeyFile: String? = nil) {
            publicKey = key.publicKey.hexString(compressed: true)
            publicKeyUncompressed = key.publicKey.hexString(compressed: false)
            publicKeyBase64 = key.publicKey.base64String(compressed: true)
            keyFile = path
            self.oldKeyFile = oldKeyFile
        }

        func print(json: Bool) throws {
            if json { return try printJSON(self) }
            Swift.print("public key: \(publicKey)")
            Swift.print("  (base64:  \(publicKeyBase64))")
            Swift.print("key file:   \(keyFile)")
            if let oldKeyFile { Swift.print("old key kept at \(oldKeyFile) (delete it once no contact needs it)") }
            Swift.print("Give the public key to your contacts: thali-node contacts add NAME \(publicKey)")
        }
    }

    struct Create: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Create a new identity in the data directory.")
        @OptionGroup var options: NodeOptions
        @Flag(help: "Replace an existing identity, keeping the old key file beside it (contacts must then add the new public key).")
        var force = false
        @Flag(help: "Print JSON for scripts.") var json = false

        func run() throws {
            let home = try options.checkedHome(writing: true)
            _ = try NodeConfiguration.load(home: home)
            // As ssh-keygen does, a terminal is asked before an existing key is replaced.
            let replacing = force || (FileManager.default.fileExists(atPath: home.identityPath)
                && confirm("\(home.identityPath) exists. Replace it (the old key is kept beside it; contacts must add the new one)?"))
            if replacing {
                let (key, kept) = try NodeIdentity.replace(in: home)
                return try Description(key, path: home.identityPath, oldKeyFile: kept).print(json: json)
            }
            let key = try NodeIdentity.create(in: home)
            try Description(key, path: home.identityPath).print(json: json)
        }
    }

    struct Show: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Show this node's public key.")
        @OptionGroup var options: NodeOptions
        @Flag(help: "Print JSON for scripts.") var json = false

        func run() throws {
            let home = try options.checkedHome(writing: false)
            _ = try NodeConfiguration.load(home: home)
            try Description(try NodeIdentity.load(from: home), path: home.identityPath).print(json: json)
        }
    }
}
