import NIOCore
import ThaliPSKTLS
import ThaliSSDP

/// Roaming: a peer that follows its interface (``PeerConfiguration/followsInterface``) moves when the
/// interface's address changes — its port, SSDP and outgoing connections — as ``InterfaceAddressPlan``
/// decides (spec/node.md, "Roaming").
extension ThaliPeer {
    /// Starts watching the followed interface, if any (Wi-Fi only: other bindings do not use the address).
    func startFollowingInterface() {
        guard configuration.wifi, let interface = configuration.followsInterface, !isStopped else { return }
        let bound = boundAddress
        // The plan and the watcher start from the same set: a change between two reads is not lost.
        let addresses = InterfaceAddressWatcher.addresses(of: interface)
        state.withLockedValue { $0.addressPlan = InterfaceAddressPlan(bound: bound, addresses: addresses) }
        // One change at a time, in order; a set superseded while a move runs is skipped for the newest.
        let (changes, continuation) = AsyncStream.makeStream(of: [String].self, bufferingPolicy: .bufferingNewest(1))
        let watcher = InterfaceAddressWatcher(interface: interface, initial: addresses,
                                              recheckInterval: configuration.interfaceRecheckInterval) {
            continuation.yield($0)
        }
        addressWatcher.withLockedValue { $0 = watcher }
        logger.info("following the interface's address",
                    metadata: ["interface": "\(interface)", "address": "\(bound)", "netlink": "\(watcher.usesNetlink)"])
        spawn { [self] in
            for await addresses in changes {
                guard !Task.isCancelled, !isStopped else { break }
                await interfaceAddressesChanged(to: addresses)
            }
        }
    }

    /// Stops watching the interface (the stop's first binding step).
    func stopFollowingInterface() {
        addressWatcher.withLockedValue { watcher in
            watcher?.stop()
            watcher = nil
        }
    }

    /// Closes the sessions this peer opened to `location`: a contact that was there moved (its beacons
    /// came from another location), and the sessions cannot be answered there any more; their links
    /// reconnect at the new location at once rather than after the keepalive's minute.
    func closeSessions(to location: BeaconLocation) {
        let stale = state.withLockedValue { state in
            state.channels.values.filter { $0.remoteAddress?.ipAddress == location.host && $0.remoteAddress?.port == location.port }
        }
        if !stale.isEmpty {
            logger.notice("a contact moved: closing the sessions with its old location", metadata: ["location": "\(location)"])
        }
        for channel in stale { channel.close(promise: nil) }
    }

    /// A contact authenticated on a Wi-Fi connection accepted from `host`. Its connections accepted from
    /// another address are from before it moved (roaming): its node closed them as it moved, but their
    /// close could not leave an address that was gone, so here they would last until a timeout (the
    /// delivery idle timeout, 60 s) and hold the contact's one sending session, refusing the delivery of
    /// every new connection ("a sending session with alice is already running") until then. They are
    /// closed now, at once: below TLS, since TLS's orderly close would wait `closeTimeout` (5 s) for a
    /// close_notify that cannot reach a peer gone from that address. The contact's next delivery stream
    /// finds the session free.
    func acceptedWiFiConnection(_ channel: Channel, from host: String, contact: Contact) {
        let id = ObjectIdentifier(channel)
        let stale = state.withLockedValue { state -> [Channel] in
            let stale = state.acceptedWiFi.filter { $0.key != id && $0.value.contactKey == contact.publicKey && $0.value.host != host }
            for key in stale.keys { state.acceptedWiFi[key] = nil }
            state.acceptedWiFi[id] = (contact.publicKey, host, channel)
            return stale.values.map(\.channel)
        }
        channel.closeFuture.whenComplete { [weak self] _ in _ = self?.state.withLockedValue { $0.acceptedWiFi.removeValue(forKey: id) } }
        if !stale.isEmpty {
            logger.notice("a contact connected from a new address: closing its connections from the old one",
                          metadata: ["contact": "\(contact.name)", "address": "\(host)"])
        }
        for old in stale { Self.closeBelowTLS(old) }
    }

    /// Closes `channel` at once: from the PSK-TLS handler toward the socket, without the close_notify
    /// TLS would first try to send (and wait for); a channel without that handler is closed as usual.
    static func closeBelowTLS(_ channel: Channel) {
        channel.eventLoop.execute {
            if let context = try? channel.pipeline.syncOperations.context(handlerType: PSKTLSHandler.self) {
                context.close(promise: nil)
            } else {
                channel.close(promise: nil)
            }
        }
    }

    /// The followed interface's addresses are now `addresses`: the plan's action.
    func interfaceAddressesChanged(to addresses: [String]) async {
        let action = state.withLockedValue { $0.addressPlan?.addressesChanged(to: addresses) } ?? .stay
        switch action {
        case .stay:
            return
        case .waitForAddress(let lost):
            logger.warning("the interface has no IPv4 address; waiting for one",
                           metadata: ["interface": "\(configuration.followsInterface ?? "?")", "lost": "\(lost)"])
        case .move(let from, let to):
            await move(from: from, to: to)
        }
    }

    /// Moves from `old` to `new`: the port rebinds on `new` (the same number when it is free there), the
    /// bindings move (SSDP: byebye from the old socket where it still can, the alive at the new LOCATION at
    /// once, a search), connections from `old` close (their links retry from `new`), and
    /// ``PeerEvent/locationChanged(location:previous:)`` reports it.
    func move(from old: String, to new: String) async {
        let previous = await bindings.first?.location()
        let (wasListening, port) = state.withLockedValue { state -> (Bool, Int?) in
            state.address = new
            return (state.listener != nil, state.boundPort)
        }
        // Closed for an overload: it reopens on the new address when its period ends (reopenPort).
        var nodePort = port ?? configuration.port
        if wasListening {
            await closePort()
            do {
                nodePort = try await bindPort()
            } catch {
                // The port number is taken on the new address: any free one (the new LOCATION says which).
                do {
                    nodePort = try await bindPort(port: 0)
                } catch {
                    logger.error("the port could not be bound on the new address", metadata: ["address": "\(new)", "error": "\(error)"])
                }
            }
        }
        for binding in bindings { await binding.interfaceAddressChanged(to: new, nodePort: nodePort) }
        // Sessions from the old address cannot hear their answers any more: closed now rather than left
        // to time out, so that their links retry from the new address. After the bindings moved: a
        // session that ends may announce anew (a lingering delivery session's contact gets its beacons
        // back), and listeners must first see the same USN at the new location to drop the old one.
        let stale = state.withLockedValue { state in
            state.channels.values.filter { $0.localAddress?.ipAddress == old }
        }
        for channel in stale { channel.close(promise: nil) }
        logger.notice("moved to the interface's new address", metadata: ["from": "\(old)", "to": "\(new)", "port": "\(nodePort)"])
        if let location = await bindings.first?.location(), let previous, location != previous, !isStopped {
            emit(.locationChanged(location: location, previous: previous))
        }
    }
}
