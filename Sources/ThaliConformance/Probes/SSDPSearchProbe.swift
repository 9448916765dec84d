import NIOCore
import NIOPosix
import ThaliSSDP

/// `M-SEARCH` datagrams for the Thali service, sent at once from a unicast socket of the suite's own, and
/// the answers that come back to it: an answer read here was sent to the searcher's source address and
/// port [SSDP-2.7], and how long each took shows how the answers are delayed [SSDP-4.3].
package struct SSDPSearchProbe: Sendable {
    /// Our IPv4 address: the socket binds to it and multicasts from it.
    var address: String
    /// The SSDP group and port the implementation listens on.
    var group: String
    var port: Int
    /// `MX` of the search: answers come within min(MX, 5) s [SSDP-4.3].
    var maxWaitSeconds = 1
    /// Longest wait for the answer, beyond `MX`.
    var slack: TimeAmount = .seconds(2)
    /// Most datagrams read before giving up (a busy network must not keep the case going).
    var maxDatagrams = 64
    /// How many identical searches go out at once; the search ends when each has its answer.
    var searches = 1

    /// What came back.
    package struct Outcome: Sendable {
        /// The first answer with `usn` (or the expected LOCATION), and who sent it.
        package var answer: (SSDPSearchResponse, SocketAddress)?
        /// How long after the searches went out each such answer came, in order.
        package var answerDelays: [TimeAmount] = []
        /// Datagrams read, and the last parse error among them.
        package var datagrams = 0
        package var lastError: SSDPParseError?

        package init() {}

        /// Reads one datagram from `sender`, which came `delay` after the searches: an answer carrying
        /// `usn`, or `location` when given (an implementation whose beacons changed since we found it answers
        /// under a new USN from the same LOCATION), is one of the `answersWanted`. Returns whether the
        /// search is over (that many answers came, or `maxDatagrams` were read).
        package mutating func consider(_ datagram: ByteBufferView, from sender: SocketAddress, expecting usn: String,
                                       orLocation location: String? = nil, maxDatagrams: Int, delay: TimeAmount = .zero,
                                       answersWanted: Int = 1) -> Bool {
            datagrams += 1
            do {
                if case .searchResponse(let response) = try SSDPMessage.parse(datagram), response.uniqueServiceName == usn || response.location == location {
                    if answer == nil { answer = (response, sender) }
                    answerDelays.append(delay)
                    if answerDelays.count >= answersWanted { return true }
                }
            } catch {
                lastError = error
            }
            return datagrams >= maxDatagrams
        }
    }

    /// Sends ``searches`` searches at once and waits for as many answers carrying `usn` (or `location`,
    /// when given), or the deadline.
    func search(expecting usn: String, orLocation location: String? = nil, on eventLoopGroup: EventLoopGroup) async throws -> Outcome {
        guard case .v4(let source) = try SocketAddress(ipAddress: address, port: 0) else {
            throw SocketAddressError.failedToParseIPString(address)
        }
        let (datagrams, sink) = AsyncStream.makeStream(of: AddressedEnvelope<ByteBuffer>.self,
                                                       bufferingPolicy: .bufferingOldest(maxDatagrams))
        let channel = try await DatagramBootstrap(group: eventLoopGroup)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(DatagramSink(sink)) }
            }
            .bind(host: address, port: 0).get()
        defer {
            sink.finish()
            channel.close(promise: nil)
        }
        if let options = channel as? SocketOptionProvider {
            try await options.setIPMulticastIF(source.address.sin_addr).get()
            try await options.setIPMulticastLoop(1).get()
        }
        let request = SSDPMessage.search(SSDPSearchRequest(host: "\(group):\(port)", maxWaitSeconds: maxWaitSeconds,
                                                           searchTarget: ThaliServiceName.notificationType)).serialize()
        let destination = try SocketAddress(ipAddress: group, port: port)
        let sent = NIODeadline.now()
        for _ in 0..<max(1, searches) {
            try await channel.writeAndFlush(AddressedEnvelope(remoteAddress: destination, data: channel.allocator.buffer(bytes: request)))
        }
        // The stream ends at the deadline, so the loop below never waits longer.
        let deadline = channel.eventLoop.scheduleTask(in: .seconds(Int64(min(maxWaitSeconds, 5))) + slack) { sink.finish() }
        defer { deadline.cancel() }
        var outcome = Outcome()
        for await envelope in datagrams {
            if outcome.consider(envelope.data.readableBytesView, from: envelope.remoteAddress, expecting: usn, orLocation: location,
                                maxDatagrams: maxDatagrams, delay: .now() - sent, answersWanted: max(1, searches)) { break }
        }
        return outcome
    }
}

/// Hands every datagram to a stream; only moves bytes.
private final class DatagramSink: ChannelInboundHandler {
    typealias InboundIn = AddressedEnvelope<ByteBuffer>
    private let sink: AsyncStream<AddressedEnvelope<ByteBuffer>>.Continuation

    init(_ sink: AsyncStream<AddressedEnvelope<ByteBuffer>>.Continuation) { self.sink = sink }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        sink.yield(unwrapInboundIn(data))
    }
}

/// How the delays of the answers to searches sent at once bear out SSDP-4.3: each drawn at random within
/// [0, min(MX, 5)) s. Timing on a loaded machine is loose, so the judgement asks only what a fixed or absent
/// delay cannot fake: every answer inside the window (with `tolerance` for the network and scheduling),
/// and the answers spread over more than `minimumSpread`.
package struct SearchAnswerDelays: Sendable {
    /// Fewest answers judged: fewer say little about a distribution.
    package static let minimumAnswers = 4
    /// The smallest spread (latest answer less earliest) taken for random draws: eight draws uniform over
    /// one second fall within 50 ms of each other with a probability of about 10⁻⁸.
    package static let minimumSpread: TimeAmount = .milliseconds(50)

    /// The `MX` the searches carried.
    var maxWaitSeconds: Int
    /// How many searches went out.
    var sent: Int
    /// Lateness forgiven beyond the window.
    var tolerance: TimeAmount

    /// The window the spec allows: min(MX, 5) seconds.
    var window: TimeAmount { .seconds(Int64(min(maxWaitSeconds, 5))) }

    /// The verdict on `delays` and what was seen.
    package func judge(_ delays: [TimeAmount]) -> (ConformanceVerdict, String) {
        func ms(_ amount: TimeAmount) -> Int64 { amount.nanoseconds / 1_000_000 }
        guard delays.count >= Self.minimumAnswers, let earliest = delays.min(), let latest = delays.max() else {
            return (.inconclusive, "\(delays.count) of \(sent) searches answered: too few to judge their delays")
        }
        let seen = "\(delays.count) of \(sent) answered after \(ms(earliest))-\(ms(latest)) ms"
        if latest >= window + tolerance {
            return (.warn, "\(seen): later than min(MX, 5) = \(ms(window)) ms (and \(ms(tolerance)) ms forgiven)")
        }
        if latest - earliest < Self.minimumSpread {
            return (.warn, "\(seen): all within \(ms(Self.minimumSpread)) ms of each other, not drawn at random over \(ms(window)) ms")
        }
        return (.pass, seen)
    }
}
