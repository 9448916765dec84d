import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import ThaliBLEBinding

/// `thali-node bench ble --radio A,B`: the binding over a real Bluetooth stack between two local
/// adapters (in practice the virtual controllers of `scripts/bt-vm/run.sh`): BLE advertisement seen by a
/// scan through bluetoothd, then RFCOMM connect, the handshake octet and the relay's throughput.
struct RadioBench {
    let advertiserAdapter: String
    let scannerAdapter: String
    let bytes: Int
    let channel: UInt8 = 9
    let timeout: Duration = .seconds(60)

    struct Figures: Encodable {
        var advertiser: String
        var scanner: String
        /// From registering the advertisement to the scanner reporting it.
        var ble_discovery_s: Double
        /// RFCOMM connect from the scanner's adapter plus the handshake octet, until the relay listens.
        var rfcomm_connect_s: Double
        /// Bytes that came out of the relay (localhost TCP → RFCOMM → localhost TCP).
        var relay_bytes: Int
        /// Whether every byte came out as it went in (the payload is a pattern the sink checks).
        var relay_intact: Bool
        var relay_s: Double
        var relay_kib_per_s: Double
    }

    func run(group: any EventLoopGroup) async throws -> Figures {
        let bus = ProcessInfo.processInfo.environment["DBUS_SYSTEM_BUS_ADDRESS"] ?? "unix:path=/run/dbus/system_bus_socket"
        let advertiser = try BlueZClient(configuration: BlueZConfiguration(busAddress: bus, adapterName: advertiserAdapter))
        var scannerConfiguration = BlueZConfiguration(busAddress: bus, adapterName: scannerAdapter)
        if let filter = ProcessInfo.processInfo.environment["THALI_BLE_UUID_FILTER"] {
            scannerConfiguration.filterByServiceUUID = filter == "1"  // to measure BlueZ's UUID filter
        }
        let scanner = try BlueZClient(configuration: scannerConfiguration)
        defer {
            advertiser.close()
            scanner.close()
        }
        guard let advertiserAddress = try await advertiser.adapter().address,
              let scannerAddress = try await scanner.adapter().address
        else { throw RadioBenchError("an adapter has no address") }

        // Discovery: our advertisement on one adapter, found by a scan on the other.
        let discovered = ContinuousClock.now
        let stream = try await scanner.scan()
        progress("scanning on \(scannerAdapter) (\(scannerAddress))")
        try await advertiser.advertise(ThaliAdvertisement(payload: .bluetoothAddress(advertiserAddress)))
        progress("advertising on \(advertiserAdapter) (\(advertiserAddress))")
        try await withDeadline(timeout, "the scan on \(scannerAdapter) to see \(advertiserAdapter)'s advertisement") {
            for try await discovery in stream where discovery.peerAddress == advertiserAddress { return }
            throw RadioBenchError("the scan ended without seeing the advertisement")
        }
        let discoverySeconds = (ContinuousClock.now - discovered).seconds
        progress("\(scannerAdapter) saw \(advertiserAdapter)'s advertisement after \(rounded(discoverySeconds)) s")
        try? await scanner.stopScanning()
        try? await advertiser.stopAdvertising()

        // RFCOMM: relay server on the advertiser's adapter, client from the scanner's.
        let sink = try await ByteSink.start(group: group, expecting: bytes, checksPattern: true)
        // A step that throws before the bytes arrived (the RFCOMM connect timed out in the guest once)
        // must not leave `done` pending: NIO's debug build ends the process on a leaked promise (SIGILL,
        // exit 132) instead of reporting the error. Failing a promise that already succeeded does nothing.
        defer { sink.done.fail(RadioBenchError("the relay bench ended before its bytes arrived")) }
        var limits = BluetoothBindingLimits()
        limits.relayIdleTimeout = .seconds(600)
        let server = BluetoothRelayServer(transport: RFCOMMTransport(localAddress: advertiserAddress), group: group,
                                          appPort: sink.port, limits: limits)
        try await server.start(channel: channel)
        defer { server.stop() }
        let client = BluetoothRelayClient(transport: RFCOMMTransport(localAddress: scannerAddress), group: group)
        let connecting = ContinuousClock.now
        let relay = try await withDeadline(timeout, "RFCOMM connect \(scannerAddress) → \(advertiserAddress)") {
            try await client.connect(to: advertiserAddress, channel: channel, hasNotifications: false)
        }
        let connectSeconds = (ContinuousClock.now - connecting).seconds
        progress("RFCOMM relay up after \(rounded(connectSeconds)) s; pushing \(bytes) bytes")
        let tcp = try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: relay.localPort).get()
        let pushing = ContinuousClock.now
        var sent = 0
        while sent < bytes {
            let count = min(16 << 10, bytes - sent)
            try await tcp.writeAndFlush(ByteBuffer(bytes: (sent..<sent + count).lazy.map(ByteSink.patternByte)))
            sent += count
        }
        try await withDeadline(.seconds(120), "\(bytes) bytes through the relay") { try await sink.done.futureResult.get() }
        let relaySeconds = (ContinuousClock.now - pushing).seconds
        try? await tcp.close()
        try? await sink.channel.close()
        return Figures(advertiser: advertiserAdapter, scanner: scannerAdapter, ble_discovery_s: rounded(discoverySeconds),
                       rfcomm_connect_s: rounded(connectSeconds), relay_bytes: sink.counter.received,
                       relay_intact: sink.counter.intact, relay_s: rounded(relaySeconds),
                       relay_kib_per_s: rounded(Double(bytes) / 1024 / relaySeconds))
    }
}

struct RadioBenchError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// Progress goes to standard error so that standard output stays one JSON document.
private func progress(_ line: String) {
    // write(2), never FileHandle.write(_:), which traps when standard error is a closed pipe.
    let text = Array("bench: \(line)\n".utf8)
    _ = text.withUnsafeBytes { write(STDERR_FILENO, $0.baseAddress, $0.count) }
}

private func rounded(_ value: Double) -> Double { (value * 1000).rounded() / 1000 }

/// Runs `body`, or fails naming `what` once `limit` has passed.
func withDeadline<T: Sendable>(_ limit: Duration, _ what: String, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
    try await withThrowingTaskGroup(of: T.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try await Task.sleep(for: limit)
            throw RadioBenchError("timed out after \(limit) waiting for \(what)")
        }
        defer { group.cancelAll() }
        guard let first = try await group.next() else { throw RadioBenchError("no result for \(what)") }
        return first
    }
}

/// A localhost TCP server that counts what it reads, checks it against `patternByte` when asked to,
/// and completes `done` after `expecting` octets.
struct ByteSink {
    let channel: any Channel
    let done: EventLoopPromise<Void>
    let counter: Counter
    var port: Int { channel.localAddress?.port ?? 0 }

    /// The octet at `offset` of a checked payload (251 is prime, so shifted or dropped runs show).
    static func patternByte(_ offset: Int) -> UInt8 { UInt8(offset % 251) }

    final class Counter: ChannelInboundHandler, @unchecked Sendable {
        typealias InboundIn = ByteBuffer
        let expecting: Int
        let checksPattern: Bool
        let done: EventLoopPromise<Void>
        private let lock = NIOLock()
        private var _received = 0
        private var _intact = true
        var received: Int { lock.withLock { _received } }
        var intact: Bool { lock.withLock { _intact } }

        init(expecting: Int, checksPattern: Bool, done: EventLoopPromise<Void>) {
            self.expecting = expecting
            self.checksPattern = checksPattern
            self.done = done
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let buffer = unwrapInboundIn(data)
            let total: Int = lock.withLock {
                if checksPattern, _intact {
                    for (index, byte) in buffer.readableBytesView.enumerated() where byte != ByteSink.patternByte(_received + index) {
                        _intact = false
                        break
                    }
                }
                _received += buffer.readableBytes
                return _received
            }
            if expecting > 0, total >= expecting { done.succeed() }
        }
    }

    static func start(group: any EventLoopGroup, expecting: Int = 0, checksPattern: Bool = false) async throws -> ByteSink {
        let done = group.next().makePromise(of: Void.self)
        let counter = Counter(expecting: expecting, checksPattern: checksPattern, done: done)
        let channel = try await ServerBootstrap(group: group)
            .childChannelInitializer { $0.pipeline.addHandler(counter) }
            .bind(host: "127.0.0.1", port: 0).get()
        if expecting == 0 { done.succeed() }
        return ByteSink(channel: channel, done: done, counter: counter)
    }
}
