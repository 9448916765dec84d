import Foundation
import NIOCore
import NIOPosix
import TCPMultiplexer
import Testing
import ThaliBLEBinding
import ThaliBluetoothTestSupport
import ThaliNodeTestSupport
@testable import ThaliConformance

/// `thali-node conformance bluetooth` against our own `thali-node run --bluetooth` over the cross-process
/// stand-in (BlueZ played by python-dbusmock, as in `NodeProcessesOverBluetoothTests`): every case passes.
/// Then the mode in-process against Bluetooth servers and clients written here on the same stand-in, right
/// but for one fault each: each fault fails exactly its cases, so the mode grades, not just runs.
@Suite(.serialized, .timeLimit(.minutes(2)))
struct ConformanceBluetoothTests {
    @Test("against thali-node run --bluetooth: every case passes, each printed as it ends",
          .enabled(if: BlueZMock.peersPresent))
    func againstOurNode() async throws {
        let executable = try #require(PackagePaths.thaliNode(), "thali-node is not built")
        let mock = try await BlueZMock()
        try await mock.addAdapter("hci0")
        let address = try await mock.address(of: "hci0")
        let people = try TestPeople(["alice"], label: "bt-conformance")
        let scope = "conformance-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        let environment = ["DBUS_SYSTEM_BUS_ADDRESS": mock.busAddress, "THALI_BLUETOOTH_STANDIN": scope]
        let node = try RunningPeer("alice", executable, ["run", "--home", try people["alice"].home.path, "--json",
                                                         "--bluetooth", "hci0", "--no-wifi"], environment: environment)
        defer { _ = node.kill(signal: SIGTERM) }
        try await node.waitFor("started") { $0.isStarted }

        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("thali-bt-conformance-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let jsonPath = directory + "/bluetooth.json"
        // The suite's adapter, hci1, is the one it advertises on for the client cases.
        try await mock.addAdapter("hci1")
        let suiteAddress = try await mock.address(of: "hci1")
        let run = try ChildProcess(executable, ["conformance", "bluetooth", address.description, "--json-out", jsonPath,
                                                "--close-margin-s", "2", "--client-wait-s", "20", "--advertise", "--adapter", "hci1"],
                                   environment: environment)
        // The air: once the suite advertises, the node's adapter hears it.
        try await run.waitForOutput(containing: "waiting for the implementation to connect", timeout: .seconds(30))
        #expect(try await mock.calls("/org/bluez/hci1", "RegisterAdvertisement").count == 1)
        let heard = try await mock.addDevice(suiteAddress.description, adapter: "hci0")
        try await mock.updateProperties(heard, interface: "org.bluez.Device1", [
            ("RSSI", .int16(-50)),
            ("ServiceData", serviceData(ThaliAdvertisement.serviceUUIDString,
                                        ThaliAdvertisement(payload: .bluetoothAddress(suiteAddress)).serviceDataValue)),
        ])
        let status = try await run.waitForExit(timeout: .seconds(60))
        #expect(status == 0, "\(run.output)\n--- node:\n\(node.output.suffix(4000))")
        let object = try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: jsonPath))) as? [String: Any]
        let results = try #require(object?["results"] as? [[String: Any]])
        var verdicts: [String: String] = [:]
        for result in results { if let id = result["id"] as? String { verdicts[id] = result["verdict"] as? String } }
        #expect(Set(verdicts.keys) == Set(BluetoothConformance.Cases.all.map(\.id)))
        for (id, verdict) in verdicts { #expect(verdict == "PASS", "\(id)\n\(run.output)") }
        #expect(run.output.split(separator: "\n").filter { $0.hasPrefix("PASS ") }.count == BluetoothConformance.Cases.all.count,
                "\(run.output)")
    }

    @Test("against scripted servers: the right one passes every case, each fault fails exactly its cases")
    func againstScriptedServers() async throws {
        let group = MultiThreadedEventLoopGroup.singleton
        let scope = "scripted-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        let cases = BluetoothConformance.Cases.self
        let expectations: [(ScriptedBluetoothServer.Faults, failing: Set<String>)] = [
            (.init(), []),
            (.init(acknowledgement: 0x01), [cases.helloWithBeacons.id, cases.helloWithoutBeacons.id]),
            (.init(answersBadHello: true), [cases.badHelloClosed.id]),
            (.init(closesSilentStream: false), [cases.silentClosed.id]),
            (.init(fetchesOnSurprise: false), [cases.surpriseFetch.id]),
            (.init(closesStreams: false), [cases.appCloseEndsStream.id, cases.suiteCloseEndsStream.id]),
        ]
        let catalog = try RequirementCatalog.load(from: RequirementCatalog.defaultPath)
        let suiteAddress = try #require(BluetoothAddress("02:00:00:00:C0:DE"))
        // All at once: each run is mostly waiting, on a server of its own.
        let reports = try await withThrowingTaskGroup(of: (ScriptedBluetoothServer.Faults, ConformanceReport).self) { runs in
            for (index, (faults, _)) in expectations.enumerated() {
                let serverAddress = try #require(BluetoothAddress(octets: [2, 0, 0, 0, 0x50, UInt8(index)]))
                runs.addTask {
                    let server = try await ScriptedBluetoothServer.start(
                        transport: CrossProcessBluetoothTransport(scope: scope, localAddress: serverAddress), faults: faults, group: group)
                    defer { server.stop() }
                    var configuration = BluetoothConformanceConfiguration(address: serverAddress)
                    // Longer than the scripted server's own handshake timeout (``ScriptedBluetoothServer/handshakeTimeout``).
                    configuration.handshakeTimeout = .milliseconds(400)
                    configuration.closeMargin = .milliseconds(300)
                    configuration.stepTimeout = .seconds(1)
                    let suite = BluetoothConformance(configuration: configuration,
                                                     transport: CrossProcessBluetoothTransport(scope: scope, localAddress: suiteAddress),
                                                     group: group)
                    let run = ConformanceRun(target: "scripted \(faults)", catalog: catalog)
                    await suite.run(run)
                    return (faults, run.report)
                }
            }
            return try await runs.reduce(into: [String: ConformanceReport]()) { $0[$1.0.description] = $1.1 }
        }
        for (faults, failing) in expectations {
            let report = try #require(reports[faults.description])
            #expect(Set(report.results.map(\.testCase.id)) == Set(cases.server.map(\.id)), "\(faults)")
            let failed = Set(report.results.filter { $0.verdict == .fail }.map(\.testCase.id))
            #expect(failed == failing, "\(faults):\n\(report.table)")
            // Nothing else goes wrong: what a fault does not fail passes, or cannot be decided after it (the
            // cases behind a handshake that failed).
            let undecidable = faults.acknowledgement == 0 ? [] : Set([cases.yamuxServed, cases.appCloseEndsStream, cases.suiteCloseEndsStream,
                                                                       cases.surpriseFetch].map(\.id))
            for result in report.results where !failing.contains(result.testCase.id) {
                #expect(result.verdict == (undecidable.contains(result.testCase.id) ? .inconclusive : .pass),
                        "\(faults): \(result.testCase.id)\n\(report.table)")
            }
        }
    }

    @Test("against nothing: the 01 hello's case fails and the rest cannot pass, so silence is not conformance")
    func againstNothing() async throws {
        let scope = "nothing-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        let nobody = try #require(BluetoothAddress("02:00:00:00:00:01"))
        let suiteAddress = try #require(BluetoothAddress("02:00:00:00:C0:DE"))
        let suite = BluetoothConformance(configuration: BluetoothConformanceConfiguration(address: nobody),
                                         transport: CrossProcessBluetoothTransport(scope: scope, localAddress: suiteAddress),
                                         group: MultiThreadedEventLoopGroup.singleton)
        let run = ConformanceRun(target: "nothing", catalog: try RequirementCatalog.load(from: RequirementCatalog.defaultPath))
        await suite.run(run)
        let report = run.report
        let succeeded = report.succeeded
        #expect(!succeeded, "\(report.table)")
        #expect(report.result(BluetoothConformance.Cases.helloWithoutBeacons.id)?.verdict == .fail, "\(report.table)")
        for testCase in BluetoothConformance.Cases.server where testCase != BluetoothConformance.Cases.helloWithoutBeacons {
            #expect(report.result(testCase.id)?.verdict == .inconclusive, "\(testCase.id)")
        }
    }

    @Test("without Bluetooth here (no stand-in, a kernel without RFCOMM) the command says so and grades nothing",
          .enabled(if: (try? RFCOMMTransport().checkAvailable()) == nil))
    func withoutBluetoothHere() async throws {
        let executable = try #require(PackagePaths.thaliNode(), "thali-node is not built")
        let (status, output) = try ChildProcess.run(executable, ["conformance", "bluetooth", "00:11:22:33:44:55"])
        #expect(status == 64, "\(output)")
        #expect(output.contains("error: cannot open Bluetooth streams here: this kernel has no Bluetooth sockets"), "\(output)")
        #expect(!output.contains("FAIL"), "\(output)")
    }

    @Test("against scripted clients: the right one passes, a bad hello and staying after a bad answer fail their case")
    func againstScriptedClients() async throws {
        let group = MultiThreadedEventLoopGroup.singleton
        let scope = "clients-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        let cases = BluetoothConformance.Cases.self
        let expectations: [(ScriptedBluetoothClient, failing: Set<String>)] = [
            (.init(hello: 0x01, closesOnBadAnswer: true), []),
            (.init(hello: 0x00, closesOnBadAnswer: true), []),
            (.init(hello: 0x02, closesOnBadAnswer: true), [cases.clientHelloFirst.id]),
            (.init(hello: 0x01, closesOnBadAnswer: false), [cases.clientBadAnswerClosed.id]),
        ]
        let catalog = try RequirementCatalog.load(from: RequirementCatalog.defaultPath)
        let clientAddress = try #require(BluetoothAddress("02:00:00:00:C1:1E"))
        let reports = try await withThrowingTaskGroup(of: (Int, ConformanceReport).self) { runs in
            for (index, (client, _)) in expectations.enumerated() {
                let suiteAddress = try #require(BluetoothAddress(octets: [2, 0, 0, 0, 0x51, UInt8(index)]))
                runs.addTask {
                    let transport = CrossProcessBluetoothTransport(scope: scope, localAddress: suiteAddress)
                    let listener = try await transport.listen(channel: BluetoothConformanceConfiguration.defaultChannel)
                    var configuration = BluetoothConformanceConfiguration(address: clientAddress)
                    configuration.stepTimeout = .seconds(1)
                    let suite = BluetoothConformance(configuration: configuration, transport: transport, group: group)
                    let connected = Task {
                        try await client.connect(CrossProcessBluetoothTransport(scope: scope, localAddress: clientAddress), to: suiteAddress,
                                                 group: group)
                    }
                    let run = ConformanceRun(target: "scripted client \(index)", catalog: catalog)
                    await suite.runClientCases(run, on: listener, waitingUpTo: .seconds(10))
                    try? await connected.value.close()
                    return (index, run.report)
                }
            }
            return try await runs.reduce(into: [Int: ConformanceReport]()) { $0[$1.0] = $1.1 }
        }
        for (index, (client, failing)) in expectations.enumerated() {
            let report = try #require(reports[index])
            #expect(Set(report.results.map(\.testCase.id)) == Set(cases.client.map(\.id)), "\(client)")
            #expect(Set(report.results.filter { $0.verdict == .fail }.map(\.testCase.id)) == failing, "\(client):\n\(report.table)")
            for result in report.results where !failing.contains(result.testCase.id) {
                // Behind a bad hello there is nothing to answer.
                let expected: ConformanceVerdict = client.hello > 1 ? .inconclusive : .pass
                #expect(result.verdict == expected, "\(client): \(result.testCase.id)\n\(report.table)")
            }
        }
    }
}

/// A Bluetooth client of the Thali binding written for this test: sends `hello` and, unless told not to,
/// closes when the answer is not 00.
private struct ScriptedBluetoothClient: Sendable, CustomStringConvertible {
    var hello: UInt8
    var closesOnBadAnswer: Bool

    var description: String { "client sending \(hello)" + (closesOnBadAnswer ? "" : ", staying after a bad answer") }

    func connect(_ transport: any BluetoothTransport, to address: BluetoothAddress, group: any EventLoopGroup) async throws -> any Channel {
        let socket = try await transport.connect(to: address, channel: BluetoothConformanceConfiguration.defaultChannel)
        let closes = closesOnBadAnswer
        let channel = try await socket.makeChannel(on: group.next()) { channel in
            channel.eventLoop.makeCompletedFuture {
                try channel.pipeline.syncOperations.addHandler(ScriptedClientHandler(closesOnBadAnswer: closes))
            }
        }
        try await channel.writeAndFlush(channel.allocator.buffer(bytes: [hello]))
        return channel
    }
}

/// Closes on a first octet other than 00 (if told to).
private final class ScriptedClientHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    private let closesOnBadAnswer: Bool
    private var answered = false

    init(closesOnBadAnswer: Bool) { self.closesOnBadAnswer = closesOnBadAnswer }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !answered, let answer = unwrapInboundIn(data).getInteger(at: unwrapInboundIn(data).readerIndex, as: UInt8.self) else { return }
        answered = true
        if answer != 0 && closesOnBadAnswer { context.close(promise: nil) }
    }
}

/// A Bluetooth server of the Thali binding written for this test: the handshake, a yamux server session
/// whose streams answer an HTTP request and close, and after a `00` hello a beacon request of its own over
/// the link. ``Faults`` breaks one rule at a time.
private final class ScriptedBluetoothServer: Sendable {
    struct Faults: Sendable, CustomStringConvertible {
        /// The octet it answers a valid hello with (right: 00).
        var acknowledgement: UInt8 = 0
        /// Whether it answers 00 to any other first octet too (right: it closes).
        var answersBadHello = false
        /// Whether it closes a stream that sends no hello (right: after its handshake timeout).
        var closesSilentStream = true
        /// Whether a 00 hello makes it fetch the client's beacons over the link.
        var fetchesOnSurprise = true
        /// Whether its streams close after their answer and on the client's FIN.
        var closesStreams = true

        var description: String {
            var faults: [String] = []
            if acknowledgement != 0 { faults.append("acknowledges with \(acknowledgement)") }
            if answersBadHello { faults.append("answers a bad hello") }
            if !closesSilentStream { faults.append("keeps a silent stream") }
            if !fetchesOnSurprise { faults.append("fetches nothing on a 00 hello") }
            if !closesStreams { faults.append("never closes a stream") }
            return faults.isEmpty ? "right" : faults.joined(separator: ", ")
        }
    }

    /// Shorter than the suite's 400 ms + 300 ms in the test.
    static let handshakeTimeout = TimeAmount.milliseconds(200)

    private let listener: any BluetoothListener
    private let acceptor: Task<Void, Never>

    private init(listener: any BluetoothListener, acceptor: Task<Void, Never>) {
        self.listener = listener
        self.acceptor = acceptor
    }

    static func start(transport: any BluetoothTransport, faults: Faults, group: any EventLoopGroup) async throws -> ScriptedBluetoothServer {
        let listener = try await transport.listen(channel: BluetoothConformanceConfiguration.defaultChannel)
        let acceptor = Task {
            while let socket = try? await listener.accept() {
                _ = try? await socket.makeChannel(on: group.next()) { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(ScriptedHandshakeHandler(faults: faults))
                    }
                }
            }
        }
        return ScriptedBluetoothServer(listener: listener, acceptor: acceptor)
    }

    func stop() {
        listener.close()
        acceptor.cancel()
    }
}

/// The server's handshake, then a yamux session on the stream.
private final class ScriptedHandshakeHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    private let faults: ScriptedBluetoothServer.Faults
    private var timer: Scheduled<Void>?
    private var answered = false

    init(faults: ScriptedBluetoothServer.Faults) { self.faults = faults }

    func channelActive(context: ChannelHandlerContext) {
        if faults.closesSilentStream {
            let channel = context.channel
            timer = context.eventLoop.scheduleTask(in: ScriptedBluetoothServer.handshakeTimeout) { channel.close(promise: nil) }
        }
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var bytes = unwrapInboundIn(data)
        guard !answered, let hello = bytes.readInteger(as: UInt8.self) else { return }
        answered = true
        timer?.cancel()
        guard hello <= 1 else {
            if faults.answersBadHello {
                context.writeAndFlush(NIOAny(context.channel.allocator.buffer(bytes: [0])), promise: nil)
            } else {
                context.close(promise: nil)
            }
            return
        }
        context.writeAndFlush(NIOAny(context.channel.allocator.buffer(bytes: [faults.acknowledgement])), promise: nil)
        let closesStreams = faults.closesStreams
        let channel = context.channel
        let session = MultiplexerSession.configure(on: channel, role: .server) { stream in
            stream.eventLoop.makeCompletedFuture {
                if !closesStreams { try stream.syncOptions?.setOption(ChannelOptions.allowRemoteHalfClosure, value: true) }
                try stream.pipeline.syncOperations.addHandler(ScriptedAnswerHandler(closes: closesStreams))
            }
        }
        if bytes.readableBytes > 0 { context.fireChannelRead(wrapInboundOut(bytes)) }
        context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
        guard hello == 0, faults.fetchesOnSurprise else { return }
        session.whenSuccess { session in
            session.openStream().whenSuccess { stream in
                stream.writeAndFlush(stream.allocator.buffer(bytes: BluetoothStreamTranscript.beaconRequest), promise: nil)
            }
        }
    }
}

/// Answers a request head with an empty `200` and (unless told not to) closes.
private final class ScriptedAnswerHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    private let closes: Bool
    private var head: [UInt8] = []

    init(closes: Bool) { self.closes = closes }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        head += unwrapInboundIn(data).readableBytesView
        guard head.firstRange(of: Array("\r\n\r\n".utf8)) != nil else { return }
        head = []
        context.writeAndFlush(wrapOutboundOut(context.channel.allocator.buffer(string: "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")),
                              promise: nil)
        // FIN after the answer; the client's FIN then closes the stream (half-closure is off).
        if closes { context.close(mode: .output, promise: nil) }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        // Half-closure is on only to keep the stream open: the client's FIN is ignored.
        if closes { context.fireUserInboundEventTriggered(event) }
    }
}
