import ArgumentParser
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import ThaliBLEBinding

/// `thali-node bench ble`: advertisement decoding rate, Bluetooth relay setup rate and relay throughput
/// (over the in-process transport with real localhost TCP on both sides; no radio involved).
struct BenchBLE: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ble",
        abstract: "Measure AdvData decoding, relay setup (connect + handshake + localhost TCP) and relay throughput."
    )

    @Option(help: "Advertisements to decode.")
    var decodes: Int = 1_000_000

    @Option(help: "Relays to set up and tear down, one after another.")
    var connections: Int = 500

    @Option(help: "MiB to push through one relay.")
    var mebibytes: Int = 256

    func run() async throws {
        benchDecode()
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        do {
            try await benchSetup(group: group)
            try await benchThroughput(group: group)
        } catch {
            try? await group.shutdownGracefully()
            throw error
        }
        try await group.shutdownGracefully()
    }

    private func benchDecode() {
        let payload = ThaliAdvertisement(payload: .bluetoothAddress(BluetoothAddress("A0:B1:C2:D3:E4:F5")!)).advertisingData()
        var found = 0
        let clock = ContinuousClock()
        let elapsed = clock.measure {
            for _ in 0..<decodes {
                if (try? ThaliAdvertisement.decode(advertisingData: payload))?.bluetoothAddress != nil { found += 1 }
            }
        }
        precondition(found == decodes)
        let seconds = elapsed.seconds
        print("advdata decode: \(decodes) in \(format(seconds)) s = \(format(Double(decodes) / seconds / 1e6)) M/s")
    }

    private func benchSetup(group: any EventLoopGroup) async throws {
        let air = InProcessBluetoothAir()
        let serverAddress = BluetoothAddress("00:00:00:00:00:01")!
        let sink = try await Sink.start(group: group)
        let server = BluetoothRelayServer(transport: air.transport(for: serverAddress), group: group, appPort: sink.port,
                                          limits: Self.benchLimits)
        try await server.start(channel: 1)
        let client = BluetoothRelayClient(transport: air.transport(for: BluetoothAddress("00:00:00:00:00:02")!), group: group)
        let start = ContinuousClock.now
        for _ in 0..<connections {
            let relay = try await client.connect(to: serverAddress, channel: 1, hasNotifications: false)
            let tcp = try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: relay.localPort).get()
            try await tcp.close()
            try await relay.closeFuture.get()
        }
        let seconds = (ContinuousClock.now - start).seconds
        print("relay setup: \(connections) connect+handshake+listen+accept+close in \(format(seconds)) s = "
              + "\(format(seconds / Double(connections) * 1e3)) ms each")
        server.stop()
        try await sink.channel.close()
    }

    private func benchThroughput(group: any EventLoopGroup) async throws {
        let air = InProcessBluetoothAir()
        let serverAddress = BluetoothAddress("00:00:00:00:00:01")!
        let total = mebibytes << 20
        let sink = try await Sink.start(group: group, expecting: total)
        let server = BluetoothRelayServer(transport: air.transport(for: serverAddress), group: group, appPort: sink.port)
        try await server.start(channel: 1)
        let client = BluetoothRelayClient(transport: air.transport(for: BluetoothAddress("00:00:00:00:00:02")!), group: group)
        let relay = try await client.connect(to: serverAddress, channel: 1, hasNotifications: false)
        let tcp = try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: relay.localPort).get()
        let chunk = ByteBuffer(repeating: 0x5A, count: 64 << 10)
        let start = ContinuousClock.now
        var sent = 0
        while sent < total {
            // Respect writability so the benchmark measures the relay, not an unbounded queue.
            try await tcp.writeAndFlush(chunk)
            sent += chunk.readableBytes
        }
        try await sink.done.futureResult.get()
        let seconds = (ContinuousClock.now - start).seconds
        print("relay throughput: \(mebibytes) MiB in \(format(seconds)) s = \(format(Double(mebibytes) / seconds)) MiB/s")
        try await tcp.close()
        try await relay.closeFuture.get()
        server.stop()
        try await sink.channel.close()
    }

    static var benchLimits: BluetoothBindingLimits {
        var limits = BluetoothBindingLimits()
        limits.maxIncomingConnectionsPerAddress = .max
        limits.maxIncomingConnectionsPerWindow = .max
        return limits
    }
}

/// A localhost TCP server that discards what it reads and completes `done` after `expecting` octets.
private struct Sink {
    let channel: any Channel
    let done: EventLoopPromise<Void>
    var port: Int { channel.localAddress?.port ?? 0 }

    final class Counter: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        let expecting: Int
        let done: EventLoopPromise<Void>
        var received = 0
        init(expecting: Int, done: EventLoopPromise<Void>) {
            self.expecting = expecting
            self.done = done
        }
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            received += unwrapInboundIn(data).readableBytes
            if expecting > 0, received >= expecting { done.succeed() }
        }
    }

    static func start(group: any EventLoopGroup, expecting: Int = 0) async throws -> Sink {
        let done = group.next().makePromise(of: Void.self)
        let channel = try await ServerBootstrap(group: group)
            .childChannelInitializer { $0.pipeline.addHandler(Counter(expecting: expecting, done: done)) }
            .bind(host: "127.0.0.1", port: 0).get()
        if expecting == 0 { done.succeed() }
        return Sink(channel: channel, done: done)
    }
}

private func format(_ value: Double) -> String {
    let scaled = (value * 100).rounded() / 100
    return "\(scaled)"
}
