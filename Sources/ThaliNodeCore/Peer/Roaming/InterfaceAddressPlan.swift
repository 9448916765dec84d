/// What a peer that follows its interface (``PeerConfiguration/followsInterface``) does when the
/// interface's IPv4 address set changes, as a value with no I/O: fed each new set (as the kernel lists
/// it, primary first), it answers whether to stay on the address the peer is bound to, move to another,
/// or wait for one (`spec/node.md`, "Roaming").
///
/// The peer stays on its address while the interface still has it, whatever else is added (a second
/// address is not a move); once it is gone it moves to the first address the interface lists; with none
/// left it waits, bound where it was, and moves as soon as an address appears (unless it is the one it
/// waited on: then nothing moved).
public struct InterfaceAddressPlan: Sendable, Hashable {
    /// What to do about a new address set.
    public enum Action: Sendable, Hashable {
        /// Nothing: the bound address is still the interface's (or nothing changed).
        case stay
        /// The bound address `from` is gone: rebind to `to`, say byebye for the old location where the
        /// old socket still can, announce the new one and search again.
        case move(from: String, to: String)
        /// The interface has no IPv4 address any more (`lost` was bound): keep everything, announce into
        /// the void, and move when an address comes.
        case waitForAddress(lost: String)
    }

    /// The address the peer is bound to (its SSDP `LOCATION`'s host).
    public private(set) var bound: String
    /// The interface's IPv4 addresses as last seen.
    public private(set) var addresses: [String]

    /// A plan for a peer bound to `bound` on an interface that has `addresses` now.
    public init(bound: String, addresses: [String]) {
        self.bound = bound
        self.addresses = addresses
    }

    /// The interface's addresses are now `new` (primary first): what to do.
    public mutating func addressesChanged(to new: [String]) -> Action {
        let old = addresses
        addresses = new
        guard !new.contains(bound) else { return .stay }
        guard let next = new.first else {
            // Reported once: the first empty set after a set that had addresses.
            return old.isEmpty ? .stay : .waitForAddress(lost: bound)
        }
        let from = bound
        bound = next
        return .move(from: from, to: next)
    }
}
