import NIOConcurrencyHelpers
import NIOCore
import TCPMultiplexer
import ThaliBLEBinding
import ThaliBeacons
import ThaliSupport

/// What Bluetooth mode needs to know and every bound it keeps (spec/conformance.md, "Bluetooth mode").
public struct BluetoothConformanceConfiguration: Sendable {
    /// The RFCOMM channel Thali nodes listen on unless told otherwise (ours: `BluetoothPeerConfiguration.defaultChannel`).
    public static let defaultChannel: UInt8 = 9

    /// The Bluetooth address of the implementation under test.
    public var address: BluetoothAddress
    /// The RFCOMM channel it listens on.
    public var channel: UInt8 = BluetoothConformanceConfiguration.defaultChannel
    /// The handshake timeout of spec/ble-binding.md §3 (BLE-3.3): a stream that sends no hello must be
    /// closed within it.
    public var handshakeTimeout: TimeAmount = .seconds(5)
    /// How much longer than `handshakeTimeout` the suite waits for a silent stream to be closed before
    /// it FAILs (timers, scheduling, the radio).
    public var closeMargin: TimeAmount = .seconds(1)
    /// The longest wait for any other answer: the handshake octet, a close, an HTTP answer, a beacon request.
    public var stepTimeout: TimeAmount = .seconds(5)
    /// The most bytes read from one stream before the suite closes it, so that no answer grows without bound.
    public var maxBytesPerStream = 64 * 1024
    /// The first octet of the bad-hello case: neither `00` nor `01`.
    public var badHello: UInt8 = 0x02
    /// What the suite answers the implementation's hello with in the client cases: not `00`.
    public var badAnswer: UInt8 = 0x01

    /// A run against `address`.
    public init(address: BluetoothAddress) {
        self.address = address
    }
}

/// Bluetooth mode (spec/conformance.md, "Bluetooth mode"): raw Bluetooth streams to the implementation
/// under test, as its Bluetooth server, through any `BluetoothTransport` (ThaliBLEBinding) (RFCOMM on a radio, a stand-in
/// without one). Grades the handshake (BLE-3.1, BLE-3.3), the surprise connection's beacon fetch (BLE-3.4)
/// and the multiplexed relay behind it (BLE-4.2, BLE-4.3). The silent stream's wait overlaps the others, so
/// a run takes about `handshakeTimeout` + `closeMargin`; it opens four streams. With a listener, it also
/// grades the implementation as a client (BLE-3.1, BLE-3.2: ``runClientCases(_:on:waitingUpTo:)``).
public struct BluetoothConformance: Sendable {
    /// The cases of Bluetooth mode.
    public enum Cases {
        /// A `00` hello is answered `00`.
        public static let helloWithBeacons = ConformanceCase(
            "bluetooth/handshake/hello-00-answered", "a 00 hello is answered 00", ["BLE-3.1"])
        /// A `01` hello is answered `00`.
        public static let helloWithoutBeacons = ConformanceCase(
            "bluetooth/handshake/hello-01-answered", "a 01 hello is answered 00", ["BLE-3.1"])
        /// Another first octet closes the stream unanswered.
        public static let badHelloClosed = ConformanceCase(
            "bluetooth/handshake/bad-hello-closed", "another first octet closes the stream without an answer", ["BLE-3.1"])
        /// A stream that sends no hello is closed in time.
        public static let silentClosed = ConformanceCase(
            "bluetooth/handshake/silent-closed", "a stream without a hello is closed within the handshake timeout", ["BLE-3.3"])
        /// A `00` hello makes the server fetch the client's beacons.
        public static let surpriseFetch = ConformanceCase(
            "bluetooth/handshake/surprise-fetch", "a 00 hello makes the server fetch our beacons over the link", ["BLE-3.4"])
        /// A yamux stream over the handshaken stream reaches the node's port.
        public static let yamuxServed = ConformanceCase(
            "bluetooth/relay/yamux-stream-served", "a yamux stream over the link is served as a TCP connection is", ["BLE-4.3"])
        /// The app's close ends the relayed stream after what it sent.
        public static let appCloseEndsStream = ConformanceCase(
            "bluetooth/relay/app-close-ends-stream", "the app's close ends the stream once its answer is through", ["BLE-4.2"])
        /// The suite's close reaches the app, whose close comes back.
        public static let suiteCloseEndsStream = ConformanceCase(
            "bluetooth/relay/suite-close-ends-stream", "our end of a stream ends the implementation's end", ["BLE-4.2"])

        /// The client sends its hello first.
        public static let clientHelloFirst = ConformanceCase(
            "bluetooth/client/hello-first", "as the client, it sends 00 or 01 first", ["BLE-3.1"])
        /// The client closes on an answer other than `00`.
        public static let clientBadAnswerClosed = ConformanceCase(
            "bluetooth/client/bad-answer-closed", "as the client, it closes the stream on an answer other than 00", ["BLE-3.2"])

        /// The cases with the implementation as the Bluetooth server (``BluetoothConformance/run(_:)``).
        public static let server = [helloWithBeacons, helloWithoutBeacons, badHelloClosed, silentClosed, surpriseFetch,
                                    yamuxServed, appCloseEndsStream, suiteCloseEndsStream]
        /// The cases with the implementation as the client (``BluetoothConformance/runClientCases(_:on:waitingUpTo:)``).
        public static let client = [clientHelloFirst, clientBadAnswerClosed]
        /// Every case of the mode.
        public static let all = server + client
    }

    private let configuration: BluetoothConformanceConfiguration
    private let transport: any BluetoothTransport
    private let group: any EventLoopGroup

    /// A run of the mode through `transport` (whose local address is the suite's) on `group`.
    public init(configuration: BluetoothConformanceConfiguration, transport: any BluetoothTransport, group: any EventLoopGroup) {
        self.configuration = configuration
        self.transport = transport
        self.group = group
    }

    /// Runs the cases with the implementation as the server and records them in `run`.
    public func run(_ run: ConformanceRun) async {
        // The first stream tells whether the implementation can be reached at all. A server that cannot be
        // reached answers no hello: the 01 hello's case fails (silence is not conformance), the rest cannot
        // be decided.
        do {
            try transport.checkAvailable()
        } catch {
            // Our side, not the implementation's: nothing can be decided.
            run.note("this machine cannot open Bluetooth streams: \(error)")
            run.recordRemaining(Cases.server, .inconclusive, because: "no Bluetooth here: \(error)")
            return
        }
        let silent: BluetoothStreamProbe
        do {
            silent = try await open()
        } catch {
            run.note("no Bluetooth stream to \(configuration.address) channel \(configuration.channel): \(error)")
            run.grade(Cases.helloWithoutBeacons, holds: false, expected: "answered 00", actual: "no Bluetooth stream: \(error)")
            run.recordRemaining(Cases.server, .inconclusive, because: "no Bluetooth stream: \(error)")
            return
        }
        async let silentGraded: Void = gradeSilent(run, silent)
        await gradeBadHello(run)
        await gradeRelay(run)
        await gradeSurprise(run)
        await silentGraded
    }

    private func open() async throws -> BluetoothStreamProbe {
        let socket = try await transport.connect(to: configuration.address, channel: configuration.channel)
        return try await BluetoothStreamProbe.start(socket, on: group.next(), maxBytes: configuration.maxBytesPerStream)
    }

    /// Runs the cases with the implementation as the Bluetooth client: waits up to `wait` for it to
    /// connect to `listener` (which it must have found, by the suite's advertisement or otherwise), then
    /// grades its hello (BLE-3.1) and, answering it with `badAnswer`, that it closes (BLE-3.2). Closes
    /// `listener` when done; the implementation's later connects are refused.
    public func runClientCases(_ run: ConformanceRun, on listener: any BluetoothListener, waitingUpTo wait: TimeAmount) async {
        let started = NIODeadline.now()
        // The one way to end a pending accept: close the listener.
        let deadline = Task {
            try await Task.sleep(nanoseconds: UInt64(max(0, wait.nanoseconds)))
            listener.close()
        }
        let socket = try? await listener.accept()
        deadline.cancel()
        listener.close()
        guard let socket, let probe = try? await BluetoothStreamProbe.start(socket, on: group.next(), maxBytes: configuration.maxBytesPerStream) else {
            run.recordRemaining(Cases.client, .inconclusive, because: "the implementation did not connect in \(text(wait))")
            return
        }
        let hello = await probe.firstOctet(within: configuration.stepTimeout)
        let actual = switch hello {
        case .closed: "closed without a hello"
        case .octet(let octet): "sent \(hex(octet))"
        case .timedOut: "sent nothing in \(text(configuration.stepTimeout))"
        }
        let valid = if case .octet(let octet) = hello { octet <= 1 } else { false }
        run.grade(Cases.clientHelloFirst, holds: valid, expected: "00 or 01 first, before any answer", actual: actual, started: started)
        guard valid else {
            run.recordRemaining([Cases.clientBadAnswerClosed], .inconclusive, because: "no valid hello to answer")
            await probe.close()
            return
        }
        let answered = NIODeadline.now()
        probe.send([configuration.badAnswer])
        let closed = await probe.closed(within: configuration.stepTimeout)
        run.grade(Cases.clientBadAnswerClosed, holds: closed, expected: "the stream closed after our \(hex(configuration.badAnswer))",
                  actual: closed ? "closed after \(text(.now() - answered))" : "still open after \(text(configuration.stepTimeout))",
                  started: answered)
        await probe.close()
    }

    /// Opens a stream and sends `hello`; nil (and `cases` INCONCLUSIVE) if it cannot be opened.
    private func open(_ run: ConformanceRun, for cases: [ConformanceCase], hello: UInt8) async -> BluetoothStreamProbe? {
        do {
            let probe = try await open()
            probe.send([hello])
            return probe
        } catch {
            run.recordRemaining(cases, .inconclusive, because: "no Bluetooth stream: \(error)")
            return nil
        }
    }

    // MARK: Handshake

    private func gradeSilent(_ run: ConformanceRun, _ probe: BluetoothStreamProbe) async {
        let started = NIODeadline.now()
        let bound = configuration.handshakeTimeout + configuration.closeMargin
        let answer = await probe.firstOctet(within: bound)
        // Speaking first is not the server's part, but the case grades only the close.
        var closed = answer == .closed
        if !closed { closed = await probe.closed(within: bound - (.now() - started)) }
        let spoke = if case .octet(let octet) = answer { ", after sending \(hex(octet)) unasked" } else { "" }
        run.grade(Cases.silentClosed, holds: closed,
                  expected: "closed within \(text(configuration.handshakeTimeout)) (+ \(text(configuration.closeMargin)))",
                  actual: (closed ? "closed after \(text(.now() - started))" : "still open after \(text(bound))") + spoke,
                  started: started)
        await probe.close()
    }

    private func gradeBadHello(_ run: ConformanceRun) async {
        let started = NIODeadline.now()
        guard let probe = await open(run, for: [Cases.badHelloClosed], hello: configuration.badHello) else { return }
        let answer = await probe.firstOctet(within: configuration.stepTimeout)
        let actual = switch answer {
        case .closed: "closed unanswered"
        case .octet(let octet): "answered \(hex(octet))"
        case .timedOut: "still open after \(text(configuration.stepTimeout))"
        }
        run.grade(Cases.badHelloClosed, holds: answer == .closed,
                  expected: "\(hex(configuration.badHello)) closes the stream without an answer", actual: actual, started: started)
        await probe.close()
    }

    /// Sends `hello` on a new stream and grades the answer under `testCase`; the probe when it was `00`.
    private func handshake(_ run: ConformanceRun, _ testCase: ConformanceCase, hello: UInt8,
                           then dependents: [ConformanceCase]) async -> BluetoothStreamProbe? {
        let started = NIODeadline.now()
        guard let probe = await open(run, for: [testCase] + dependents, hello: hello) else { return nil }
        let answer = await probe.firstOctet(within: configuration.stepTimeout)
        let actual = switch answer {
        case .closed: "closed unanswered"
        case .octet(let octet): "answered \(hex(octet))"
        case .timedOut: "no answer in \(text(configuration.stepTimeout))"
        }
        let acknowledged = answer == .octet(BluetoothHandshake.serverAcknowledgement)
        run.grade(testCase, holds: acknowledged, expected: "answered 00", actual: actual, started: started)
        guard acknowledged else {
            run.recordRemaining(dependents, .inconclusive, because: "the \(hex(hello)) hello was not answered 00")
            await probe.close()
            return nil
        }
        return probe
    }

    // MARK: The relay

    private func gradeRelay(_ run: ConformanceRun) async {
        let dependents = [Cases.yamuxServed, Cases.appCloseEndsStream, Cases.suiteCloseEndsStream]
        guard let probe = await handshake(run, Cases.helloWithoutBeacons, hello: BluetoothHandshake.ClientHello.hasNoNotifications.rawValue,
                                          then: dependents) else { return }
        await gradeRelay(run, over: probe, dependents)
        await probe.close()
    }

    private func gradeRelay(_ run: ConformanceRun, over probe: BluetoothStreamProbe, _ dependents: [ConformanceCase]) async {
        let session: MultiplexerSession
        do {
            session = try await probe.startMultiplexer(inbound: nil)
        } catch {
            run.recordRemaining(dependents, .inconclusive, because: "no yamux session: \(error)")
            return
        }
        let maxBytes = configuration.maxBytesPerStream
        var started = NIODeadline.now()
        let request = BluetoothStreamTranscript.beaconRequest
        guard let served = try? await BluetoothStreamTranscript.open(on: session, sending: request, maxBytes: maxBytes) else {
            run.recordRemaining(dependents, .inconclusive, because: "the yamux stream could not be opened")
            return
        }
        let ended = await served.ended(within: configuration.stepTimeout)
        let answer = served.received
        let statusLine = BluetoothStreamTranscript.firstLine(answer)
        let isHTTP = answer.starts(with: Array("HTTP/1.".utf8))
        run.grade(Cases.yamuxServed, holds: isHTTP, expected: "an HTTP answer to GET /NotificationBeacons on a yamux stream",
                  actual: isHTTP ? "answered \(statusLine ?? "")"
                      : answer.isEmpty ? "nothing in \(text(configuration.stepTimeout))" : "answered \(statusLine ?? "") (not HTTP)",
                  started: started)
        if isHTTP {
            let complete = BluetoothStreamTranscript.isCompleteResponse(answer)
            run.grade(Cases.appCloseEndsStream, holds: ended && complete,
                      expected: "the whole answer (Connection: close), then the end of the stream",
                      actual: ended ? (complete ? "the answer (\(answer.count) bytes), then the end"
                                       : "the stream ended after \(answer.count) bytes, short of the answer's Content-Length")
                          : "the answer (\(answer.count) bytes), but the stream still open after \(text(configuration.stepTimeout))",
                      started: started)
        } else {
            run.recordRemaining([Cases.appCloseEndsStream], .inconclusive, because: "no HTTP answer to close after")
        }

        started = .now()
        guard let quiet = try? await BluetoothStreamTranscript.open(on: session, sending: [], maxBytes: maxBytes) else {
            run.recordRemaining([Cases.suiteCloseEndsStream], .inconclusive, because: "a second yamux stream could not be opened")
            return
        }
        quiet.closeOutput()
        let quietEnded = await quiet.ended(within: configuration.stepTimeout)
        run.grade(Cases.suiteCloseEndsStream, holds: quietEnded, expected: "after our FIN on a new stream, its end from the implementation",
                  actual: quietEnded ? "ended after \(text(.now() - started))"
                      : "still open \(text(configuration.stepTimeout)) after our FIN", started: started)
        try? await session.close().get()
    }

    // MARK: The surprise connection

    private func gradeSurprise(_ run: ConformanceRun) async {
        guard let probe = await handshake(run, Cases.helloWithBeacons, hello: BluetoothHandshake.ClientHello.hasNotifications.rawValue,
                                          then: [Cases.surpriseFetch]) else { return }
        await gradeSurprise(run, over: probe)
        await probe.close()
    }

    private func gradeSurprise(_ run: ConformanceRun, over probe: BluetoothStreamProbe) async {
        let started = NIODeadline.now()
        let requests = BluetoothBeaconRequests(loop: probe.channel.eventLoop)
        // Well formed, and for nobody: one beacon for a key nobody holds.
        let body: [UInt8]
        do {
            body = try BeaconGenerator(identity: PrivateKey()).makeAnnouncement(for: [PrivateKey().publicKey], validity: .seconds(600)).stream
        } catch {
            run.recordRemaining([Cases.surpriseFetch], .inconclusive, because: "no beacon stream to serve: \(error)")
            return
        }
        let maxBytes = configuration.maxBytesPerStream
        let session: MultiplexerSession
        do {
            session = try await probe.startMultiplexer { stream in
                stream.eventLoop.makeCompletedFuture {
                    try stream.pipeline.syncOperations.addHandler(BluetoothBeaconServerHandler(body: body, maxBytes: maxBytes, requests: requests))
                }
            }
        } catch {
            run.recordRemaining([Cases.surpriseFetch], .inconclusive, because: "no yamux session: \(error)")
            return
        }
        // Bytes from us, so that a server that waits for its client's first bytes keeps the link.
        _ = session.ping()
        let requestLine = await requests.first(within: configuration.stepTimeout)
        let fetched = requestLine?.hasPrefix("GET /NotificationBeacons ") == true
        run.grade(Cases.surpriseFetch, holds: fetched, expected: "GET /NotificationBeacons on a stream it opens over the link",
                  actual: requestLine.map { "\($0) after \(text(.now() - started))" }
                      ?? "no stream with a request in \(text(configuration.stepTimeout))",
                  started: started)
        try? await session.close().get()
    }

    private func hex(_ octet: UInt8) -> String { Hex.encode([octet]) }

    private func text(_ amount: TimeAmount) -> String { PeerConformance.text(amount) }
}
