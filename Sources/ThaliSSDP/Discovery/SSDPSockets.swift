import NIOCore
import NIOPosix
import ThaliMutants

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Discovery's two UDP sockets, both pinned to the configuration's interface: the unicast one (sends
/// everything, reads search answers) and the multicast one (bound to the group address, so unicast to the
/// port is not read). Each hands its datagrams to `onDatagram`, on the channel's loop.
enum SSDPSockets {
    typealias DatagramSink = @Sendable (AddressedEnvelope<ByteBuffer>) -> Void

    /// Reads at most one byte more than the parser accepts, so an oversized datagram is truncated by the
    /// kernel and then refused by its size, never buffered whole.
    static func datagramAllocator(_ configuration: SSDPDiscoveryConfiguration) -> FixedSizeRecvByteBufferAllocator {
        FixedSizeRecvByteBufferAllocator(capacity: configuration.parserLimits.maxDatagramBytes + 1)
    }

    /// The unicast socket on an ephemeral port of the interface, its multicast sends pinned to the
    /// interface with the configured TTL, looped back to this host's listeners.
    static func openUnicast(configuration: SSDPDiscoveryConfiguration, on eventLoop: EventLoop,
                            onDatagram: @escaping DatagramSink) -> EventLoopFuture<Channel> {
        let interface: in_addr
        do {
            guard case .v4(let address) = try SocketAddress(ipAddress: configuration.interfaceAddress, port: 0) else {
                return eventLoop.makeFailedFuture(SSDPDiscoveryService.StartError.invalidAddress(configuration.interfaceAddress))
            }
            interface = address.address.sin_addr
        } catch {
            return eventLoop.makeFailedFuture(error)
        }
        return DatagramBootstrap(group: eventLoop)
            .channelOption(.recvAllocator, value: datagramAllocator(configuration))
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(SSDPDatagramHandler(onDatagram))
                }
            }
            .bind(host: configuration.interfaceAddress, port: 0)
            .flatMap { channel in
                guard let options = channel as? SocketOptionProvider else {
                    return channel.close().flatMapThrowing { throw SSDPDiscoveryService.StartError.socketOptionsUnavailable }
                }
                return options.setIPMulticastIF(interface)
                    .flatMap { options.setIPMulticastTTL(Mutant.ssdpMulticastTTLOne.isActive ? 1 : configuration.multicastTTL) }
                    .flatMap { options.setIPMulticastLoop(1) }
                    .map { channel }
            }
    }

    /// The multicast socket, bound to `group` and its port, the group joined on `device` (the interface).
    static func openMulticast(configuration: SSDPDiscoveryConfiguration, group: SocketAddress, device: SocketAddress,
                              on eventLoop: EventLoop, onDatagram: @escaping DatagramSink) -> EventLoopFuture<Channel> {
        DatagramBootstrap(group: eventLoop)
            .channelOption(.recvAllocator, value: datagramAllocator(configuration))
            .channelOption(.socketOption(.so_reuseaddr), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(SSDPDatagramHandler(onDatagram))
                }
            }
            .bind(host: configuration.groupAddress, port: configuration.port)
            .flatMap { (channel: Channel) -> EventLoopFuture<Channel> in
                // IP_ADD_MEMBERSHIP by hand: NIO's joinGroup refuses interfaces without the MULTICAST
                // flag, and `lo` has none, yet pinning both sides to 127.0.0.1 works there.
                guard case .v4(let groupAddress) = group, case .v4(let interface) = device else {
                    return channel.close().flatMapThrowing {
                        throw SSDPDiscoveryService.StartError.invalidAddress(configuration.groupAddress)
                    }
                }
                let request = ip_mreq(imr_multiaddr: groupAddress.address.sin_addr, imr_interface: interface.address.sin_addr)
                guard let options = channel as? SocketOptionProvider else {
                    return channel.close().flatMapThrowing { throw SSDPDiscoveryService.StartError.socketOptionsUnavailable }
                }
                return options
                    .unsafeSetSocketOption(level: .ip, name: .ip_add_membership, value: request)
                    .map { channel }
            }
    }
}
