import NIOCore

/// Runs `BluetoothHandshake` on a freshly connected Bluetooth stream, then steps aside.
///
/// On success it installs `successor` right behind itself, hands it any octets that arrived after the
/// handshake octet, succeeds `outcome` and removes itself. On a violation, a timeout or an early close it
/// fails `outcome` with the `BluetoothHandshake.Violation` and closes the channel. It only moves octets.
public final class BluetoothHandshakeHandler: ChannelInboundHandler, RemovableChannelHandler {
    public typealias InboundIn = ByteBuffer
    public typealias InboundOut = ByteBuffer
    public typealias OutboundOut = ByteBuffer

    /// Which side of the handshake this handler plays.
    public enum Role: Sendable {
        /// The Bluetooth client; sends this hello.
        case client(BluetoothHandshake.ClientHello)
        /// The Bluetooth server.
        case server
    }

    private enum State {
        case client(BluetoothHandshake.ClientState, BluetoothHandshake.ClientHello)
        case server(BluetoothHandshake.ServerState)
    }

    private var state: State
    private let timeout: TimeAmount
    private let outcome: EventLoopPromise<BluetoothHandshake.Outcome>
    private var successor: (any ChannelHandler)?
    private var timer: Scheduled<Void>?
    private var started = false
    private var finished = false

    /// - Parameters:
    ///   - role: client (with its hello) or server.
    ///   - timeout: how long to wait for the peer's handshake octet.
    ///   - outcome: completed when the handshake succeeds or fails.
    ///   - successor: the handler that takes over the stream afterwards (the relay).
    public init(role: Role, timeout: TimeAmount, outcome: EventLoopPromise<BluetoothHandshake.Outcome>,
                successor: (any ChannelHandler)? = nil)
    {
        switch role {
        case .client(let hello): self.state = .client(.idle, hello)
        case .server: self.state = .server(.awaitingHello)
        }
        self.timeout = timeout
        self.outcome = outcome
        self.successor = successor
    }

    public func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { start(context: context) }
    }

    public func channelActive(context: ChannelHandlerContext) {
        start(context: context)
        context.fireChannelActive()
    }

    private func start(context: ChannelHandlerContext) {
        guard !started else { return }
        started = true
        let loopBoundContext = NIOLoopBound(context, eventLoop: context.eventLoop)
        let loopBoundSelf = NIOLoopBound(self, eventLoop: context.eventLoop)
        timer = context.eventLoop.scheduleTask(in: timeout) {
            loopBoundSelf.value.fail(.timedOut, context: loopBoundContext.value)
        }
        if case .client(var machine, let hello) = state {
            let action = machine.start(hello)
            state = .client(machine, hello)
            if case .send(let hello) = action {
                context.writeAndFlush(wrapOutboundOut(context.channel.allocator.buffer(bytes: [hello.rawValue])),
                                      promise: nil)
            }
        }
        context.read()
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !finished else { return }
        var buffer = unwrapInboundIn(data)
        guard let octet = buffer.readInteger(as: UInt8.self) else {
            context.read()
            return
        }
        switch state {
        case .server(var machine):
            let action = machine.receive(octet)
            state = .server(machine)
            switch action {
            case .acknowledge(let hello):
                context.writeAndFlush(
                    wrapOutboundOut(context.channel.allocator.buffer(bytes: [BluetoothHandshake.serverAcknowledgement])),
                    promise: nil)
                succeed(.serverReceived(hello), leftover: buffer, context: context)
            case .close(let violation):
                fail(violation, context: context)
            case .none:
                break
            }
        case .client(var machine, let hello):
            let action = machine.receive(octet)
            state = .client(machine, hello)
            switch action {
            case .completed:
                succeed(.clientAcknowledged, leftover: buffer, context: context)
            case .close(let violation):
                fail(violation, context: context)
            case .send, .none:
                break
            }
        }
    }

    public func channelInactive(context: ChannelHandlerContext) {
        fail(.closedBeforeHandshake, context: context)
        context.fireChannelInactive()
    }

    public func errorCaught(context: ChannelHandlerContext, error: any Error) {
        guard !finished else { return context.fireErrorCaught(error) }
        // A reset (a peer that refused us closes with our hello unread) is the stream ending too.
        fail(.closedBeforeHandshake, context: context)
    }

    private func succeed(_ result: BluetoothHandshake.Outcome, leftover: ByteBuffer, context: ChannelHandlerContext) {
        finished = true
        timer?.cancel()
        timer = nil
        if let successor {
            self.successor = nil
            do {
                try context.pipeline.syncOperations.addHandler(successor, position: .after(self))
            } catch {
                outcome.fail(error)
                context.close(promise: nil)
                return
            }
        }
        outcome.succeed(result)
        if leftover.readableBytes > 0 {
            context.fireChannelRead(wrapInboundOut(leftover))
            context.fireChannelReadComplete()
        }
        context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
    }

    private func fail(_ violation: BluetoothHandshake.Violation, context: ChannelHandlerContext) {
        guard !finished else { return }
        switch state {
        case .server(var machine):
            _ = machine.fail(violation)
            state = .server(machine)
        case .client(var machine, let hello):
            _ = machine.fail(violation)
            state = .client(machine, hello)
        }
        finished = true
        timer?.cancel()
        timer = nil
        outcome.fail(violation)
        context.close(promise: nil)
    }
}
