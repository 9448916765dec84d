import ThaliNodeCore

/// A quiet `ThaliPeer` for `person`, pinned to 127.0.0.1 with `ssdpPort`; `configure` adjusts the rest.
public func loopbackPeer(_ person: TestPeople.Person, ssdpPort: Int,
                         _ configure: (inout PeerConfiguration) -> Void = { _ in }) throws -> ThaliPeer {
    var configuration = PeerConfiguration(interfaceAddress: "127.0.0.1")
    configuration.ssdpPort = ssdpPort
    configure(&configuration)
    return try ThaliPeer(store: person.store, identity: person.key, configuration: configuration, logger: quietLogger)
}
