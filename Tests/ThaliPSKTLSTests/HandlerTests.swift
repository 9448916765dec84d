import NIOCore
import NIOEmbedded
import Testing
@testable import ThaliPSKTLS

/// Records what reaches the end of the pipeline: plaintext, user events, errors.
final class Recorder: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    var received: [UInt8] = []
    var capacities: [Int] = []
    var events: [Any] = []
    var errors: [any Error] = []

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        received += buffer.readableBytesView
        capacities.append(buffer.capacity)
    }
    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) { events.append(event) }
    func errorCaught(context: ChannelHandlerContext, error: any Error) { errors.append(error) }

    var pskErrors: [PSKTLSError] { errors.compactMap { $0 as? PSKTLSError } }
    var handshakeCompleted: PSKTLSNegotiatedParameters? {
        for case .handshakeCompleted(let parameters) as PSKTLSEvent in events { return parameters }
        return nil
    }
    var inputClosed: Bool { events.contains { ($0 as? ChannelEvent) == .inputClosed } }
}

/// Stands for the network side of the pipeline: counts `read()` calls that go out towards the
/// network, and performs an output half-closure the way TCP does (EmbeddedChannel would close fully).
final class NetworkSide: ChannelOutboundHandler {
    typealias OutboundIn = ByteBuffer
    var reads = 0
    var outputClosed = false
    func read(context: ChannelHandlerContext) {
        reads += 1
        context.read()
    }
    func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        guard mode == .output else { return context.close(mode: mode, promise: promise) }
        outputClosed = true
        promise?.succeed(())
    }
}

/// A client and a server handler in two EmbeddedChannels, with the bytes moved by hand.
struct EmbeddedPair {
    let client = EmbeddedChannel()
    let server = EmbeddedChannel()
    let clientRecorder = Recorder()
    let serverRecorder = Recorder()
    let clientReads = NetworkSide()
    let serverReads = NetworkSide()

    /// `serverHalfClosure`: whether the server's channel allows remote half-closure (as a TCP channel of
    /// `PSKTLSServer` does); the client's always does.
    init(clientPSK: [UInt8] = Fixtures.psk, identity: String = Fixtures.identity192, group: DHGroup = .ffdhe2048,
         serverHalfClosure: Bool = true,
         configure: (inout PSKTLSConfiguration) -> Void = { _ in },
         lookup: @escaping PSKLookup = { $0 == Fixtures.identity192 ? Fixtures.psk : nil }) throws {
        client.allowRemoteHalfClosure = true
        server.allowRemoteHalfClosure = serverHalfClosure
        var configuration = PSKTLSConfiguration(dhGroup: group)
        configure(&configuration)
        let clientContext = try PSKTLSContext(role: .client, configuration: configuration)
        let serverContext = try PSKTLSContext(role: .server, configuration: configuration)
        try client.pipeline.syncOperations.addHandlers([
            clientReads, try PSKTLSHandler(clientContext: clientContext, identity: identity, psk: clientPSK), clientRecorder,
        ])
        try server.pipeline.syncOperations.addHandlers([
            serverReads, try PSKTLSHandler(serverContext: serverContext, lookup: lookup), serverRecorder,
        ])
    }

    func activate() throws {
        let address = try SocketAddress(ipAddress: "127.0.0.1", port: 1)
        try server.connect(to: address).wait()
        try client.connect(to: address).wait()
    }

    /// Moves everything one side has written to the other, `chunk` bytes per read (to split records and
    /// handshake messages at awkward places). Returns the number of bytes moved.
    @discardableResult
    func move(from source: EmbeddedChannel, to target: EmbeddedChannel, chunk: Int = .max) throws -> Int {
        var moved = 0
        while var buffer = try source.readOutbound(as: ByteBuffer.self) {
            while buffer.readableBytes > 0 {
                let piece = buffer.readSlice(length: min(chunk, buffer.readableBytes))!
                moved += piece.readableBytes
                try target.writeInbound(piece)  // also fires channelReadComplete
            }
        }
        return moved
    }

    /// Moves bytes both ways until neither side has anything to say.
    func exchange(chunk: Int = .max) throws {
        while try move(from: client, to: server, chunk: chunk) + move(from: server, to: client, chunk: chunk) > 0 {}
    }

    func finish() {
        _ = try? client.finish(acceptAlreadyClosed: true)
        _ = try? server.finish(acceptAlreadyClosed: true)
    }
}

extension PSKTLSTests {
    @Suite struct HandlerTests {
        @Test func handshakeAndDataWithRecordsSplitAtEveryByte() throws {
            try expectNoLeaksNow {
                let pair = try EmbeddedPair()
                defer { pair.finish() }
                try pair.activate()
                try pair.exchange(chunk: 1)
                let client = try #require(pair.clientRecorder.handshakeCompleted)
                let server = try #require(pair.serverRecorder.handshakeCompleted)
                #expect(client.protocolVersion == "TLSv1.2" && server.protocolVersion == "TLSv1.2")
                #expect(client.cipherSuite == "DHE-PSK-AES256-GCM-SHA384" && server.cipherSuite == client.cipherSuite)
                #expect(client.dhGroupBits == 2048 && server.dhGroupBits == 2048)
                #expect(server.pskIdentity == Fixtures.identity192)
                #expect(!client.serverSentIdentityHint)

                let message = Array("a message that crosses several reads".utf8)
                try pair.client.writeOutbound(ByteBuffer(bytes: message))
                try pair.move(from: pair.client, to: pair.server, chunk: 3)
                #expect(pair.serverRecorder.received == message)
                try pair.server.writeOutbound(ByteBuffer(bytes: message.reversed()))
                try pair.move(from: pair.server, to: pair.client, chunk: 7)
                #expect(pair.clientRecorder.received == message.reversed())
            }
        }

        @Test func writesBeforeTheHandshakeAreHeldThenSent() throws {
            try expectNoLeaksNow {
                let pair = try EmbeddedPair { $0.maximumBufferedPlaintextBeforeHandshake = 10 }
                defer { pair.finish() }
                try pair.activate()
                let held = pair.client.writeAndFlush(ByteBuffer(string: "early"))
                let tooMuch = pair.client.writeAndFlush(ByteBuffer(string: "far too much"))
                #expect(throws: PSKTLSError.self) { try tooMuch.wait() }
                try pair.exchange()
                try held.wait()
                #expect(pair.serverRecorder.received == Array("early".utf8))
            }
        }

        @Test func wrongPSKFailsWithBadRecordMACOnBothSides() throws {
            try expectNoLeaksNow {
                let pair = try EmbeddedPair(clientPSK: Fixtures.otherPSK)
                defer { pair.finish() }
                try pair.activate()
                try pair.exchange()
                #expect(pair.serverRecorder.pskErrors.map(\.reason) == [.alertSent(.badRecordMAC)])
                #expect(pair.clientRecorder.pskErrors.map(\.reason) == [.alertReceived(.badRecordMAC)])
                #expect(!pair.client.isActive && !pair.server.isActive)
            }
        }

        @Test func unknownIdentityFailsWithUnknownPSKIdentity() throws {
            try expectNoLeaksNow {
                let pair = try EmbeddedPair(lookup: { _ in nil })
                defer { pair.finish() }
                try pair.activate()
                try pair.exchange()
                #expect(pair.serverRecorder.pskErrors.map(\.reason) == [.alertSent(.unknownPSKIdentity)])
                #expect(pair.clientRecorder.pskErrors.map(\.reason) == [.alertReceived(.unknownPSKIdentity)])
            }
        }

        @Test func closeSendsCloseNotifyAndThePeerSeesACleanEnd() throws {
            try expectNoLeaksNow {
                let pair = try EmbeddedPair()
                defer { pair.finish() }
                try pair.activate()
                try pair.exchange()
                let closed = pair.client.close()
                try pair.move(from: pair.client, to: pair.server)
                try closed.wait()
                #expect(pair.serverRecorder.inputClosed)
                #expect(pair.serverRecorder.errors.isEmpty && pair.clientRecorder.errors.isEmpty)
            }
        }

        @Test func halfCloseLetsThePeerAnswer() throws {
            try expectNoLeaksNow {
                let pair = try EmbeddedPair()
                defer { pair.finish() }
                try pair.activate()
                try pair.exchange()
                try pair.client.writeOutbound(ByteBuffer(string: "question"))
                let halfClosed = pair.client.close(mode: .output)
                try pair.move(from: pair.client, to: pair.server)
                try halfClosed.wait()
                #expect(pair.clientReads.outputClosed)  // TCP output shut down after close_notify
                #expect(pair.serverRecorder.received == Array("question".utf8))
                #expect(pair.serverRecorder.inputClosed)
                // The server can still write, and the client can still read.
                try pair.server.writeOutbound(ByteBuffer(string: "answer"))
                try pair.move(from: pair.server, to: pair.client)
                #expect(pair.clientRecorder.received == Array("answer".utf8))
                // Writing after our own close_notify is refused.
                #expect(throws: PSKTLSError.self) { try pair.client.writeAndFlush(ByteBuffer(string: "late")).wait() }
                #expect(pair.serverRecorder.errors.isEmpty && pair.clientRecorder.errors.isEmpty,
                        "\(pair.serverRecorder.errors) \(pair.clientRecorder.errors)")
            }
        }

        /// A channel that does not allow remote half-closure (the node's: its multiplexer never acts on
        /// the end of its input) answers close_notify at once with its own and closes, so a peer that
        /// sent close_notify and kept TCP open is not left waiting (issue 23: it waited 59.5 s for the
        /// multiplexer's keepalive).
        @Test func closeNotifyIsAnsweredAtOnceWithoutHalfClosure() throws {
            try expectNoLeaksNow {
                let pair = try EmbeddedPair(serverHalfClosure: false)
                defer { pair.finish() }
                try pair.activate()
                try pair.exchange()
                try pair.client.writeOutbound(ByteBuffer(string: "last words"))
                let halfClosed = pair.client.close(mode: .output)  // close_notify; TCP stays open (NetworkSide)
                try pair.move(from: pair.client, to: pair.server)
                try halfClosed.wait()
                #expect(pair.serverRecorder.received == Array("last words".utf8), "data before close_notify is delivered")
                #expect(!pair.server.isActive, "the server closed at once")
                // Its answer reaches the client: a clean end on both sides.
                try pair.move(from: pair.server, to: pair.client)
                #expect(!pair.client.isActive)
                #expect(pair.serverRecorder.errors.isEmpty && pair.clientRecorder.errors.isEmpty,
                        "\(pair.serverRecorder.errors) \(pair.clientRecorder.errors)")
            }
        }

        /// Half-closure switched off in the configuration: answered and closed, whatever the channel allows.
        @Test func closeNotifyIsAnsweredWhenTheConfigurationForbidsHalfClosure() throws {
            try expectNoLeaksNow {
                let pair = try EmbeddedPair(configure: { $0.allowRemoteHalfClosure = false })
                defer { pair.finish() }
                try pair.activate()
                try pair.exchange()
                let halfClosed = pair.client.close(mode: .output)
                try pair.move(from: pair.client, to: pair.server)
                try halfClosed.wait()
                #expect(!pair.server.isActive)
                #expect(!pair.serverRecorder.inputClosed)
            }
        }

        @Test func endOfInputWithoutCloseNotifyIsAnUncleanShutdown() throws {
            try expectNoLeaksNow {
                let pair = try EmbeddedPair()
                defer { pair.finish() }
                try pair.activate()
                try pair.exchange()
                pair.server.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
                #expect(pair.serverRecorder.pskErrors.map(\.reason) == [.uncleanShutdown], "\(pair.serverRecorder.errors) \(pair.serverRecorder.events)")
                #expect(!pair.server.isActive)
            }
        }

        @Test func aStalledHandshakeTimesOut() throws {
            try expectNoLeaksNow {
                let pair = try EmbeddedPair { $0.handshakeTimeout = .seconds(5) }
                defer { pair.finish() }
                try pair.activate()
                try pair.move(from: pair.client, to: pair.server)  // ClientHello, and the server's answer is never delivered
                pair.client.embeddedEventLoop.advanceTime(by: .seconds(4))
                #expect(pair.clientRecorder.errors.isEmpty)
                pair.client.embeddedEventLoop.advanceTime(by: .seconds(1))
                pair.server.embeddedEventLoop.advanceTime(by: .seconds(5))
                #expect(pair.clientRecorder.pskErrors.map(\.reason) == [.handshakeTimedOut])
                #expect(pair.serverRecorder.pskErrors.map(\.reason) == [.handshakeTimedOut])
                #expect(!pair.client.isActive && !pair.server.isActive)
            }
        }

        @Test func garbageInsteadOfAClientHelloFailsTheHandshake() throws {
            try expectNoLeaksNow {
                let pair = try EmbeddedPair()
                defer { pair.finish() }
                try pair.activate()
                try pair.server.writeInbound(ByteBuffer(string: "GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
                let errors = pair.serverRecorder.pskErrors
                #expect(errors.count == 1)
                #expect(errors.first?.detail.isEmpty == false)
                #expect(!pair.server.isActive)
            }
        }

        @Test func afterTheHandshakeOnlyTheApplicationsReadsReachTheNetwork() throws {
            try expectNoLeaksNow {
                let pair = try EmbeddedPair()
                defer { pair.finish() }
                try pair.activate()
                try pair.exchange()
                let readsAfterHandshake = pair.serverReads.reads
                // Data arrives; the handler delivers it and does not ask the network for more by itself.
                try pair.client.writeOutbound(ByteBuffer(repeating: 1, count: 100_000))
                try pair.move(from: pair.client, to: pair.server)
                #expect(pair.serverRecorder.received.count == 100_000)
                #expect(pair.serverReads.reads == readsAfterHandshake)
                // An application read that half a record cannot satisfy is passed on again.
                pair.server.read()
                #expect(pair.serverReads.reads == readsAfterHandshake + 1)
                try pair.client.writeOutbound(ByteBuffer(repeating: 2, count: 1000))
                var ciphertext = try #require(try pair.client.readOutbound(as: ByteBuffer.self))
                try pair.server.writeInbound(ciphertext.readSlice(length: 100)!)
                #expect(pair.serverReads.reads == readsAfterHandshake + 2)
                try pair.server.writeInbound(ciphertext)
                #expect(pair.serverRecorder.received.count == 101_000)
                #expect(pair.serverReads.reads == readsAfterHandshake + 2)
            }
        }

        @Test func smallMessagesGetSmallBuffersAndLargeOnesChunks() throws {
            try expectNoLeaksNow {
                let pair = try EmbeddedPair()
                defer { pair.finish() }
                try pair.activate()
                try pair.exchange()
                try pair.client.writeOutbound(ByteBuffer(string: "tiny"))
                try pair.move(from: pair.client, to: pair.server)
                #expect(pair.serverRecorder.received == Array("tiny".utf8))
                #expect(pair.serverRecorder.capacities.allSatisfy { $0 <= 64 }, "\(pair.serverRecorder.capacities)")
                // 200 KB arrive as chunks of at most plaintextReadChunkSize (64 KiB), even split at odd places.
                try pair.client.writeOutbound(ByteBuffer(repeating: 7, count: 200_000))
                try pair.move(from: pair.client, to: pair.server, chunk: 10_007)
                #expect(pair.serverRecorder.received.count == 200_004)
                #expect(pair.serverRecorder.capacities.dropFirst().allSatisfy { $0 <= 64 << 10 })
            }
        }

        @Test func credentialsAreCheckedBeforeAnyTraffic() throws {
            let context = try PSKTLSContext(role: .client)
            let tooLong = String(repeating: "A", count: PSKTLSProfile.maximumIdentityLength + 1)
            for (identity, psk) in [("", Fixtures.psk), (tooLong, Fixtures.psk), ("a\u{0}b", Fixtures.psk), ("id", [])] {
                #expect(throws: PSKTLSError.self) {
                    _ = try PSKTLSHandler(clientContext: context, identity: identity, psk: psk)
                }
            }
            let longest = String(repeating: "A", count: PSKTLSProfile.maximumIdentityLength)
            _ = try PSKTLSHandler(clientContext: context, identity: longest, psk: Fixtures.psk)
        }

        @Test func theLongestIdentityOpenSSLAllowsWorksEndToEnd() throws {
            try expectNoLeaksNow {
                let identity = String(repeating: "B", count: PSKTLSProfile.maximumIdentityLength)
                let pair = try EmbeddedPair(identity: identity, lookup: { $0 == identity ? Fixtures.psk : nil })
                defer { pair.finish() }
                try pair.activate()
                try pair.exchange()
                #expect(pair.serverRecorder.handshakeCompleted?.pskIdentity == identity)
            }
        }
    }

    @Suite struct StateMachineTests {
        @Test func halfClosuresCombineIntoAFullClose() {
            var machine = PSKTLSStateMachine()
            let first = machine.channelActive()
            let second = machine.channelActive()
            #expect(first && !second)
            machine.handshakeCompleted()
            guard case .sendCloseNotifyThenCloseOutput = machine.closeRequested(mode: .output) else {
                Issue.record("expected an output half-closure"); return
            }
            #expect(machine.state == .outputClosed)
            guard case .close = machine.closeNotifyReceived(allowHalfClosure: true) else {
                Issue.record("expected a close"); return
            }
            #expect(machine.state == .closed)
        }

        @Test func endOfInputMeansDifferentThingsInDifferentStates() {
            var handshaking = PSKTLSStateMachine()
            _ = handshaking.channelActive()
            #expect(handshaking.endOfInput(channelInactive: false) == .closedDuringHandshake)

            var active = PSKTLSStateMachine()
            _ = active.channelActive()
            active.handshakeCompleted()
            #expect(active.endOfInput(channelInactive: true) == .uncleanShutdown)

            var halfClosed = PSKTLSStateMachine()
            _ = halfClosed.channelActive()
            halfClosed.handshakeCompleted()
            _ = halfClosed.closeNotifyReceived(allowHalfClosure: true)
            #expect(halfClosed.endOfInput(channelInactive: false) == nil)
            #expect(halfClosed.state == .inputClosed)
            #expect(halfClosed.acceptsOutput)
        }

        @Test func failureIsReportedOnce() {
            var machine = PSKTLSStateMachine()
            _ = machine.channelActive()
            let first = machine.failed()
            let second = machine.failed()
            #expect(first && !second)
        }
    }

    @Suite struct AlertTests {
        @Test func alertsHaveTheirRFCNames() {
            #expect(TLSAlert.unknownPSKIdentity.description == "unknown_psk_identity")
            #expect(TLSAlert(rawValue: 51) == .decryptError)
            #expect(TLSAlert(rawValue: 200).description == "alert(200)")
        }
    }
}
