import ArgumentParser
import Foundation
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

    @Option(help: "Measure over a real Bluetooth stack instead: ADVERTISER,SCANNER adapters (e.g. hci0,hci1).")
    var radio: String?

    @Option(help: "Bytes to push through the RFCOMM relay with --radio.")
    var radioBytes: Int = 64 << 10

    @Flag(help: "Print the figures as one JSON object.")
    var json = false

    func run() async throws {
        if let radio {
            let adapters = radio.split(separator: ",").map(String.init)
            guard adapters.count == 2 else { throw ValidationError("--radio takes two adapters: ADVERTISER,SCANNER") }
            let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
            let figures: RadioBench.Figures
            do {
                figures = try await RadioBench(advertiserAdapter: adapters[0], scannerAdapter: adapters[1], bytes: radioBytes)
                    .run(group: group)
            } catch {
                try? await group.shutdownGracefully()
                throw error
            }
            try? await group.shutdownGracefully()
            if json {
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.sortedKeys]
                print(String(decoding: try encoder.encode(figures), as: UTF8.self))
            } else {
                print("BLE discovery \(figures.advertiser) → \(figures.scanner): \(figures.ble_discovery_s) s; "
                      + "RFCOMM connect + handshake: \(figures.rfcomm_connect_s) s; relay: \(figures.relay_bytes) bytes in "
                      + "\(figures.relay_s) s = \(figures.relay_kib_per_s) KiB/s (emulated radio if in the bt-vm)")
            }
            guard figures.relay_intact else { throw RadioBenchError("the relay changed the bytes it carried") }
            return
        }
        var figures: [String: Double] = [:]
        figures["advdata_decode_m_per_s"] = benchDecode()
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        do {
            figures["relay_setup_ms"] = try await benchSetup(group: group)
            figures["relay_mib_per_s"] = try await benchThroughput(group: group)
        } catch {
            try? await group.shutdownGracefully()
            throw error
        }
        try await group.shutdownGracefully()
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys]
            print(String(decoding: try encoder.encode(figures), as: UTF8.self))
        }
    }

    private func benchDecode() -> Double {
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
        if !json { print("advdata decode: \(decodes) in \(format(seconds)) s = \(format(Double(decodes) / seconds / 1e6)) M/s") }
        return Double(decodes) / seconds / 1e6
    }

    private func benchSetup(group: any EventLoopGroup) async throws -> Double {
        let air = InProcessBluetoothAir()
        let serverAddress = BluetoothAddress("00:00:00:00:00:01")!
        let sink = try await ByteSink.start(group: group)
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
        if !json {
            print("relay setup: \(connections) connect+handshake+listen+accept+close in \(format(seconds)) s = "
                  + "\(format(seconds / Double(connections) * 1e3)) ms each")
        }
        server.stop()
        try await sink.channel.close()
        return seconds / Double(connections) * 1e3
    }

    private func benchThroughput(group: any EventLoopGroup) async throws -> Double {
        let air = InProcessBluetoothAir()
        let serverAddress = BluetoothAddress("00:00:00:00:00:01")!
        let total = mebibytes << 20
        let sink = try await ByteSink.start(group: group, expecting: total)
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
        if !json { print("relay throughput: \(mebibytes) MiB in \(format(seconds)) s = \(format(Double(mebibytes) / seconds)) MiB/s") }
        try await tcp.close()
        try await relay.closeFuture.get()
        server.stop()
        try await sink.channel.close()
        return Double(mebibytes) / seconds
    }

    static var benchLimits: BluetoothBindingLimits {
        var limits = BluetoothBindingLimits()
        limits.maxIncomingConnectionsPerAddress = .max
        limits.maxIncomingConnectionsPerWindow = .max
        return limits
    }
}

private func format(_ value: Double) -> String {
    let scaled = (value * 100).rounded() / 100
    return "\(scaled)"
}
