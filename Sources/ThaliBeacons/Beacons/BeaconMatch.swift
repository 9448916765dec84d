/// A beacon addressed to us by a contact in our address book.
public struct BeaconMatch: Sendable, Hashable {
    /// The contact who sent the announcement.
    public let sender: PublicKey
    /// Position of our beacon in the stream (0-based).
    public let beaconIndex: Int
    /// The TLS PSK identity to present to the sender.
    public let pskIdentity: String
    /// The TLS pre-shared key for that identity.
    public let psk: [UInt8]
    /// The announcement's expiration, in milliseconds since the epoch.
    public let expiration: UInt64

    /// Creates a match (the receiver is the usual source).
    public init(sender: PublicKey, beaconIndex: Int, pskIdentity: String, psk: [UInt8], expiration: UInt64) {
        self.sender = sender
        self.beaconIndex = beaconIndex
        self.pskIdentity = pskIdentity
        self.psk = psk
        self.expiration = expiration
    }
}
