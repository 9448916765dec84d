import NIOCore
import NIOPosix
import ThaliSSDP

/// One `M-SEARCH` for the Thali service from a unicast socket of the suite's own, and the answers that
/// come back to it: an answer read here was sent to the searcher's source address and port [SSDP-2.7].
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

    /// What came back.
    package struct Outcome: Sendable {
        /// The first answer with `usn` (or the expected LOCATION), and who sent it.
        package var answer: (SSDPSearchResponse, SocketAddress)?
        /// Datagrams read, and the last parse error among them.
        package var datagrams = 0
        package var lastError: SSDPParseError?

        package init() {}

        /// Reads one datagram from `sender`: an answer carrying `usn`, or `location` when given, ends the
        /// search (an implementation whose beacons changed since we found it answers under a new USN from
        /// the same LOCATION). Returns whether the search is over (that answer came, or `maxDatagrams` were
        /// read).
        package mutating func consider(_ datagram: ByteBufferView, from sender: SocketAddress, expecting usn: String,
                                       orLocation location: String? = nil, maxDatagrams: Int) -> Bool {
            datagrams += 1
            do {
                if case .searchResponse(let response) = try SSDPMessage.parse(datagram), response.uniqueServiceName == usn || response.location == location {
                    answer = (response, sender)
                    return true
                }
            } catch {
                lastError = error
            }
            return datagrams >= maxDatagrams
        }
    }

    /// Searches once and waits for an answer carrying `usn` (or `location`, when given).
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
        try await channel.writeAndFlush(AddressedEnvelope(remoteAddress: try SocketAddress(ipAddress: group, port: port),
                                                          data: channel.allocator.buffer(bytes: request)))
        // The stream ends at the deadline, so the loop below never waits longer.
        let deadline = channel.eventLoop.scheduleTask(in: .seconds(Int64(min(maxWaitSeconds, 5))) + slack) { sink.finish() }
        defer { deadline.cancel() }
        var outcome = Outcome()
        for await envelope in datagrams {
            if outcome.consider(envelope.data.readableBytesView, from: envelope.remoteAddress, expecting: usn, orLocation: location,
                                maxDatagrams: maxDatagrams) { break }
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
