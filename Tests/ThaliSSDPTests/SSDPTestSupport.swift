import Foundation
import NIOCore
import NIOPosix
import Testing
import ThaliTestSupport

@testable import ThaliSSDP

/// Collects a service's events so tests can wait for them.
final class EventLog: @unchecked Sendable {
    private let lock = NSLock()
    private var collected: [SSDPDiscoveryEvent] = []
    private var task: Task<Void, Never>?

    init(_ service: SSDPDiscoveryService) {
        task = Task { [weak self] in
            for await event in service.events { self?.append(event) }
        }
    }

    deinit { task?.cancel() }

    private func append(_ event: SSDPDiscoveryEvent) { lock.withLock { collected.append(event) } }

    var events: [SSDPDiscoveryEvent] { lock.withLock { collected } }

    /// Waits until `predicate` holds for some event; returns it.
    @discardableResult
    func wait(timeout: Duration = .seconds(5), _ what: String = "event",
              _ predicate: (SSDPDiscoveryEvent) -> Bool) async throws -> SSDPDiscoveryEvent {
        let found = try await waitForValue(timeout: timeout) { events.first(where: predicate) }
        return try #require(found, "timed out waiting for \(what); events: \(events)")
    }
}

/// The host a test asked for is not an IPv4 address.
struct NotIPv4: Error, CustomStringConvertible {
    let address: String
    var description: String { "\(address) is not an IPv4 address" }
}

/// Polls `condition` until true or `timeout`.
func eventually(timeout: Duration = .seconds(5), _ what: String, _ condition: () async -> Bool) async throws {
    let held = try await waitUntil(timeout: timeout, condition)
    try #require(held, "timed out waiting for \(what)")
}

/// A free UDP port for a test's multicast group, so concurrent runs never hear each other.
func freeUDPPort() throws -> Int {
    let channel = try DatagramBootstrap(group: MultiThreadedEventLoopGroup.singleton).bind(host: "127.0.0.1", port: 0).wait()
    defer { try? channel.close().wait() }
    return try #require(channel.localAddress?.port, "the bound UDP socket has no port")
}

/// A loopback configuration on a fresh port with short timers.
func loopbackConfiguration(port: Int) -> SSDPDiscoveryConfiguration {
    var configuration = SSDPDiscoveryConfiguration(interfaceAddress: "127.0.0.1")
    configuration.port = port
    configuration.foregroundAliveInterval = .milliseconds(200)
    configuration.searchMaxWait = 1
    configuration.client.responseTimeout = .milliseconds(500)
    configuration.client.initialBackoff = .milliseconds(20)
    return configuration
}

/// A UDP socket on 127.0.0.1 that plays a hand-written SSDP peer: sends to the group (pinned to loopback)
/// or to an address, and records what it receives.
final class RawSSDPSocket: @unchecked Sendable {
    let channel: Channel
    let group: SocketAddress
    private let received = NIOLockedBox()

    init(host: String = "127.0.0.1", groupPort: Int) async throws {
        let box = received
        channel = try await DatagramBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(SSDPDatagramHandler { box.append($0) })
                }
            }
            .bind(host: host, port: 0).get()
        let interface = try SocketAddress(ipAddress: host, port: 0)
        guard case .v4(let v4) = interface else { throw NotIPv4(address: host) }
        try await (channel as! SocketOptionProvider).setIPMulticastIF(v4.address.sin_addr).get()
        group = try SocketAddress(ipAddress: "239.255.255.250", port: groupPort)
    }

    deinit { channel.close(promise: nil) }

    var port: Int { channel.localAddress?.port ?? 0 }

    func send(_ text: String, to target: SocketAddress? = nil) async throws {
        try await send(Array(text.utf8), to: target)
    }

    func send(_ bytes: [UInt8], to target: SocketAddress? = nil) async throws {
        try await channel.writeAndFlush(AddressedEnvelope(remoteAddress: target ?? group,
                                                          data: channel.allocator.buffer(bytes: bytes)))
    }

    var datagrams: [AddressedEnvelope<ByteBuffer>] { received.values }
}

final class NIOLockedBox: @unchecked Sendable {
    private let lock = NSLock()
    private var items: [AddressedEnvelope<ByteBuffer>] = []
    func append(_ item: AddressedEnvelope<ByteBuffer>) { lock.withLock { items.append(item) } }
    var values: [AddressedEnvelope<ByteBuffer>] { lock.withLock { items } }
}

/// An ssdp:alive as a foreign or hand-made Thali peer would send it.
func aliveText(port: Int, usn: String = ThaliServiceName.makeUniqueServiceName(), location: String,
               nt: String = ThaliServiceName.notificationType, maxAge: Int = 60) -> String {
    "NOTIFY * HTTP/1.1\r\nHOST: 239.255.255.250:\(port)\r\nNT: \(nt)\r\nNTS: ssdp:alive\r\nUSN: \(usn)\r\n"
        + "LOCATION: \(location)\r\nCACHE-CONTROL: max-age=\(maxAge)\r\nSERVER: test/1\r\n\r\n"
}
