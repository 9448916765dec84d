import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import ThaliSSDP

/// What the implementation multicast on the SSDP group, as far as its searches go [SSDP-2.6]: each
/// `M-SEARCH` for the Thali NT, with the USN the same address announced last (its current one, unless a
/// byebye withdrew it), and the USNs it announced. Datagrams of the suite's own senders are ignored.
package struct ImplementationSearches: Sendable {
    /// One `M-SEARCH` for the Thali NT.
    package struct Search: Sendable {
        /// The parsed request, or the grammar error (spec/ssdp.md §3) that kept it from parsing.
        var request: Result<SSDPSearchRequest, SSDPParseError>
        /// Who sent it (IP address).
        var source: String
        /// The USN that address advertised when the search came.
        var currentUSN: String?
        var heard: NIODeadline
    }

    /// Most searches kept, and most USNs kept per address: a chatty network cannot grow them.
    package static let maxSearches = 64
    package static let maxUSNsPerSource = 64
    /// Most addresses whose announcements are followed: spoofed sources cannot grow the tables.
    package static let maxSources = 256

    /// The `HOST` a search must carry: the group and port it was sent to.
    let host: String
    private(set) var searches: [Search] = []
    /// Per address, the USN it advertises now.
    private var current: [String: String] = [:]
    /// Per address, each USN it announced and when it was first heard.
    private var announced: [String: [(usn: String, heard: NIODeadline)]] = [:]
    /// `ip:port` of the suite's own senders.
    private var ignoredSenders: Set<String> = []

    /// Judges searches sent to `host` (`group:port`).
    package init(host: String) { self.host = host }

    /// Ignores what `address` sends from now on (a sender of the suite's own).
    package mutating func ignore(_ address: SocketAddress) {
        if let ip = address.ipAddress, let port = address.port { ignoredSenders.insert("\(ip):\(port)") }
    }

    /// Reads one datagram from `sender`, heard at `now`.
    package mutating func consider(_ datagram: some Collection<UInt8>, from sender: SocketAddress, at now: NIODeadline = .now()) {
        guard let source = sender.ipAddress, !ignoredSenders.contains("\(source):\(sender.port ?? 0)") else { return }
        let message: SSDPMessage
        do {
            message = try SSDPMessage.parse(datagram)
        } catch {
            // A broken M-SEARCH counts only when it names the Thali NT: on a LAN other UPnP stacks search too.
            let text = String(decoding: datagram.prefix(SSDPParserLimits().maxDatagramBytes), as: UTF8.self)
            if text.hasPrefix("M-SEARCH "), text.contains(ThaliServiceName.notificationType) {
                append(Search(request: .failure(error), source: source, currentUSN: current[source], heard: now))
            }
            return
        }
        switch message {
        case .notification(let notification) where notification.notificationType == ThaliServiceName.notificationType:
            let usn = notification.uniqueServiceName
            switch notification.subtype {
            case .alive:
                guard announced[source] != nil || announced.count < Self.maxSources else { return }
                current[source] = usn
                var usns = announced[source] ?? []
                if !usns.contains(where: { $0.usn == usn }), usns.count < Self.maxUSNsPerSource { usns.append((usn, now)) }
                announced[source] = usns
            case .byebye:
                if current[source] == usn { current[source] = nil }
            }
        case .search(let search) where search.searchTarget == ThaliServiceName.notificationType:
            append(Search(request: .success(search), source: source, currentUSN: current[source], heard: now))
        default:
            break
        }
    }

    private mutating func append(_ search: Search) {
        if searches.count < Self.maxSearches { searches.append(search) }
    }

    /// Whether an M-SEARCH for the Thali NT was heard.
    package var heardAny: Bool { !searches.isEmpty }

    /// Whether a search carries an `S` that no announcement has shown yet: an implementation may search
    /// just before it announces the USN it searches under, so the judgement waits a little for it.
    package var awaitsAnnouncement: Bool {
        searches.contains { search in
            guard case .success(let request) = search.request, search.currentUSN == nil, let searcher = request.searcherServiceName else {
                return false
            }
            return !(announced[search.source] ?? []).contains { $0.usn == searcher }
        }
    }

    /// The judgement of what was heard: nil when no M-SEARCH for the Thali NT came; otherwise whether every
    /// one is well formed (§3), carries `HOST` group:port, and carries `S` with its current USN while it
    /// advertises one (and no `S` naming a USN it never announced), with what was seen or the first problem.
    package func judge() -> (holds: Bool, actual: String)? {
        guard let first = searches.first else { return nil }
        for search in searches {
            if let problem = problem(with: search) { return (false, "\(searches.count) M-SEARCH(es); \(problem)") }
        }
        var seen = "\(searches.count) M-SEARCH(es) for the Thali NT, well formed, HOST \(host)"
        if searches.contains(where: { $0.currentUSN != nil }) {
            seen += ", S its current USN while it advertised one"
        }
        if searches.contains(where: { $0.currentUSN == nil }) {
            seen += ", none with S while it advertised nothing"
            if let firstAlive = (announced[first.source] ?? []).first(where: { $0.heard >= first.heard }), first.currentUSN == nil {
                seen += " (its first alive came \((firstAlive.heard - first.heard).nanoseconds / 1_000_000) ms after its first search)"
            }
        }
        return (true, seen)
    }

    private func problem(with search: Search) -> String? {
        let request: SSDPSearchRequest
        switch search.request {
        case .failure(let error): return "one breaks the grammar of spec/ssdp.md §3: \(error)"
        case .success(let parsed): request = parsed
        }
        guard request.host == host else { return "HOST \(request.host.prefix(80)), not \(host)" }
        let searcher = request.searcherServiceName
        if let usn = search.currentUSN {
            guard let searcher else { return "no S while it advertised \(usn.prefix(80))" }
            if searcher != usn { return "S \(searcher.prefix(80)) while it advertised \(usn.prefix(80))" }
        } else if let searcher, !(announced[search.source] ?? []).contains(where: { $0.usn == searcher }) {
            return "S \(searcher.prefix(80)) names no USN it announced"
        }
        return nil
    }
}

/// A socket on the SSDP group and port, joined on our address as a peer's receiving socket is (spec/ssdp.md
/// §1): collects the implementation's searches, and wakes a waiter when what it heard meets a condition.
final class SearchListener: Sendable {
    private let channel: Channel
    private let state: NIOLockedValueBox<(heard: ImplementationSearches, waiter: Waiter?)>

    typealias Waiter = (condition: @Sendable (ImplementationSearches) -> Bool, promise: EventLoopPromise<Void>)

    private init(channel: Channel, state: NIOLockedValueBox<(heard: ImplementationSearches, waiter: Waiter?)>) {
        self.channel = channel
        self.state = state
    }

    /// What it heard so far.
    var heard: ImplementationSearches { state.withLockedValue { $0.heard } }

    /// Binds to `group:port` (SO_REUSEADDR, beside the implementation's own socket when both run on one
    /// host) and joins the group on `interface`.
    static func start(group groupAddress: String, port: Int, interface: String, on eventLoopGroup: EventLoopGroup) async throws -> SearchListener {
        guard case .v4(let groupSocket) = try SocketAddress(ipAddress: groupAddress, port: port),
              case .v4(let interfaceSocket) = try SocketAddress(ipAddress: interface, port: 0)
        else { throw SocketAddressError.failedToParseIPString("\(groupAddress) or \(interface)") }
        let state = NIOLockedValueBox((heard: ImplementationSearches(host: "\(groupAddress):\(port)"), waiter: Waiter?.none))
        let channel = try await DatagramBootstrap(group: eventLoopGroup)
            .channelOption(.socketOption(.so_reuseaddr), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(Recorder(state)) }
            }
            .bind(host: groupAddress, port: port).get()
        // IP_ADD_MEMBERSHIP by hand, as ThaliSSDP does: NIO's joinGroup refuses `lo`, which has no MULTICAST flag.
        let request = ip_mreq(imr_multiaddr: groupSocket.address.sin_addr, imr_interface: interfaceSocket.address.sin_addr)
        do {
            guard let options = channel as? SocketOptionProvider else { throw ChannelError.operationUnsupported }
            try await options.unsafeSetSocketOption(level: .ip, name: .ip_add_membership, value: request).get()
        } catch {
            try? await channel.close()
            throw error
        }
        return SearchListener(channel: channel, state: state)
    }

    /// Ignores what `address` sends from now on.
    func ignore(_ address: SocketAddress?) {
        guard let address else { return }
        state.withLockedValue { $0.heard.ignore(address) }
    }

    /// Returns once what it heard meets `condition`, or after `timeout`.
    func wait(until condition: @escaping @Sendable (ImplementationSearches) -> Bool, within timeout: TimeAmount) async {
        let promise = channel.eventLoop.makePromise(of: Void.self)
        let met = state.withLockedValue { state -> Bool in
            if condition(state.heard) { return true }
            state.waiter?.promise.succeed(())
            state.waiter = (condition, promise)
            return false
        }
        guard !met else { return promise.succeed(()) }
        let deadline = channel.eventLoop.scheduleTask(in: timeout) { promise.succeed(()) }
        try? await promise.futureResult.get()
        deadline.cancel()
        state.withLockedValue { if $0.waiter?.promise.futureResult === promise.futureResult { $0.waiter = nil } }
    }

    func close() { channel.close(promise: nil) }

    /// Feeds every datagram to the record and wakes the waiter whose condition it meets; only reads.
    private final class Recorder: ChannelInboundHandler, Sendable {
        typealias InboundIn = AddressedEnvelope<ByteBuffer>
        private let state: NIOLockedValueBox<(heard: ImplementationSearches, waiter: Waiter?)>

        init(_ state: NIOLockedValueBox<(heard: ImplementationSearches, waiter: Waiter?)>) { self.state = state }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let envelope = unwrapInboundIn(data)
            let woken = state.withLockedValue { state -> EventLoopPromise<Void>? in
                state.heard.consider(envelope.data.readableBytesView, from: envelope.remoteAddress)
                guard let waiter = state.waiter, waiter.condition(state.heard) else { return nil }
                state.waiter = nil
                return waiter.promise
            }
            woken?.succeed(())
        }
    }
}
