import NIOCore
import ThaliMutants

/// A channel handler that runs TLS 1.2 with `DHE-PSK-AES256-GCM-SHA384` over the bytes of a channel:
/// ciphertext below it, plaintext above it. It only moves bytes between the channel and OpenSSL (through
/// a BIO over NIO's buffers); `PSKTLSStateMachine` decides what each event means.
///
/// - The handshake starts when the channel becomes active and must finish within
///   `PSKTLSConfiguration.handshakeTimeout`; then `PSKTLSEvent.handshakeCompleted` is fired and the
///   optional handshake promise succeeds. Writes made earlier are held (up to a limit) and sent then.
/// - Every failure is fired as a `PSKTLSError` through `errorCaught` (and fails the handshake promise
///   while handshaking); any alert OpenSSL produced is sent first, then the channel is closed.
/// - `close(mode: .all)` sends close_notify, then closes; `close(mode: .output)` sends close_notify and
///   shuts down the TCP output (half-closure). A received close_notify fires `ChannelEvent.inputClosed`
///   when half-closure is allowed (`PSKTLSConfiguration.allowRemoteHalfClosure` and the channel's
///   `ChannelOptions.allowRemoteHalfClosure`); otherwise it is answered at once with our close_notify
///   and the channel is closed (RFC 5246 §7.2.1).
/// - Backpressure: the handler never reads from the network on its own once the handshake is done;
///   each network read is decrypted and delivered entirely, so nothing is buffered between reads,
///   and the application's `read()` calls (or their absence) pace the network.
public final class PSKTLSHandler: ChannelDuplexHandler {
    public typealias InboundIn = ByteBuffer
    public typealias InboundOut = ByteBuffer
    public typealias OutboundIn = ByteBuffer
    public typealias OutboundOut = ByteBuffer

    let connection: SSLConnection
    private let configuration: PSKTLSConfiguration
    private var stateMachine = PSKTLSStateMachine()
    private var handshakePromise: EventLoopPromise<PSKTLSNegotiatedParameters>?
    private var handshakeTimeout: Scheduled<Void>?

    /// The write of our close_notify, once sent: a full close waits for it.
    private var lastWriteBeforeClose: EventLoopFuture<Void>?

    /// Plaintext written by the application and not yet encrypted.
    private var pendingWrites = MarkedCircularBuffer<(data: ByteBuffer, promise: EventLoopPromise<Void>?)>(initialCapacity: 8)
    private var pendingWriteBytes = 0
    /// Promises of the writes whose ciphertext is in the output buffer being filled.
    private var promisesOfOutput: [EventLoopPromise<Void>] = []
    /// Small writes of the flush being encrypted, copied together to become one record (empty between
    /// flushes), and their promises.
    private var gathered = ByteBuffer()
    private var promisesOfGathered: [EventLoopPromise<Void>] = []
    /// The application asked for a read that no plaintext has answered yet.
    private var applicationReadPending = false
    /// Plaintext was delivered during the current read burst.
    private var deliveredInBurst = false
    /// A renegotiation asked for through `PSKTLSRenegotiation.Request` has not been answered yet.
    private var renegotiationRequested = false

    /// A client handler that authenticates with `identity` and `psk`.
    ///
    /// Throws `invalidCredentials` if the identity is empty, longer than
    /// `PSKTLSProfile.maximumIdentityLength` bytes of UTF-8 or contains NUL, or if the PSK is empty or
    /// longer than `PSKTLSProfile.maximumPSKLength`.
    public init(clientContext: PSKTLSContext, identity: String, psk: [UInt8],
                handshakePromise: EventLoopPromise<PSKTLSNegotiatedParameters>? = nil) throws(PSKTLSError) {
        guard clientContext.role == .client else {
            throw PSKTLSError(.invalidConfiguration, role: .client, detail: "a client handler needs a client context")
        }
        let credentials = try Self.clientCredentials(identity: identity, psk: psk)
        connection = try SSLConnection(context: clientContext, credentials: credentials)
        configuration = clientContext.configuration
        self.handshakePromise = handshakePromise
    }

    /// Checks a client's identity and PSK against what OpenSSL can send (see the client initialiser).
    static func clientCredentials(identity: String, psk: [UInt8]) throws(PSKTLSError) -> SSLConnection.Credentials {
        let identityBytes = Array(identity.utf8)
        guard !identityBytes.isEmpty, identityBytes.count <= PSKTLSProfile.maximumIdentityLength,
              !identityBytes.contains(0), !psk.isEmpty, psk.count <= PSKTLSProfile.maximumPSKLength
        else {
            throw PSKTLSError(.invalidCredentials, role: .client,
                              detail: "identity \(identityBytes.count) bytes, PSK \(psk.count) bytes")
        }
        return .client(identity: identityBytes.map { CChar(bitPattern: $0) } + [0], psk: psk)
    }

    /// A server handler that asks `lookup` for the PSK of the identity each client sends.
    public init(serverContext: PSKTLSContext, lookup: @escaping PSKLookup,
                handshakePromise: EventLoopPromise<PSKTLSNegotiatedParameters>? = nil) throws(PSKTLSError) {
        guard serverContext.role == .server else {
            throw PSKTLSError(.invalidConfiguration, role: .server, detail: "a server handler needs a server context")
        }
        connection = try SSLConnection(context: serverContext, credentials: .server(lookup: lookup))
        configuration = serverContext.configuration
        self.handshakePromise = handshakePromise
    }

    private var role: PSKTLSRole { connection.role }

    // MARK: Lifecycle

    public func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { startHandshake(context: context) }
    }

    public func handlerRemoved(context: ChannelHandlerContext) {
        handshakeTimeout?.cancel()
        failPendingWrites(PSKTLSError(.connectionClosed, role: role))
        handshakePromise?.fail(PSKTLSError(.connectionClosed, role: role, detail: "handler removed"))
        handshakePromise = nil
    }

    public func channelActive(context: ChannelHandlerContext) {
        startHandshake(context: context)
        context.fireChannelActive()
    }

    public func channelInactive(context: ChannelHandlerContext) {
        if let reason = stateMachine.endOfInput(channelInactive: true), stateMachine.failed() {
            report(PSKTLSError(reason, role: role), context: context)
        }
        handshakeTimeout?.cancel()
        failPendingWrites(PSKTLSError(.connectionClosed, role: role))
        context.fireChannelInactive()
    }

    public func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard let channelEvent = event as? ChannelEvent, channelEvent == .inputClosed else {
            return context.fireUserInboundEventTriggered(event)
        }
        // The TCP input ended. After the peer's close_notify that is expected (and already announced).
        if let reason = stateMachine.endOfInput(channelInactive: false) {
            fail(PSKTLSError(reason, role: role), context: context)
        }
    }

    private func startHandshake(context: ChannelHandlerContext) {
        guard stateMachine.channelActive() else { return }
        let timeout = TimeAmount(configuration.handshakeTimeout)
        handshakeTimeout = context.eventLoop.assumeIsolated().scheduleTask(in: timeout) { [self] in
            fail(PSKTLSError(.handshakeTimedOut, role: role, detail: "after \(timeout)"), context: context)
        }
        continueHandshake(context: context)
    }

    // MARK: Inbound

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let ciphertext = unwrapInboundIn(data)
        switch stateMachine.state {
        case .handshaking:
            connection.receive(ciphertext)
            continueHandshake(context: context)
        case .active, .outputClosed:
            connection.receive(ciphertext)
            deliverPlaintext(context: context)
        case .idle, .inputClosed, .closed:
            break  // nothing may follow close_notify or a failure; drop it
        }
    }

    public func channelReadComplete(context: ChannelHandlerContext) {
        let delivered = deliveredInBurst
        deliveredInBurst = false
        if delivered { context.fireChannelReadComplete() }
        // A read that produced no plaintext (half a record) has not answered the application: ask again.
        if stateMachine.deliversInput && applicationReadPending && !delivered { context.read() }
    }

    private func continueHandshake(context: ChannelHandlerContext) {
        let result = connection.handshake()
        sendPendingCiphertext(context: context, flush: true)
        switch result {
        case .wantsInput:
            context.read()  // the handshake drives its own reads, whatever the application asked
        case .failed(let error):
            fail(error, context: context)
        case .completed(let parameters):
            stateMachine.handshakeCompleted()
            handshakeTimeout?.cancel()
            handshakeTimeout = nil
            context.fireUserInboundEventTriggered(PSKTLSEvent.handshakeCompleted(parameters))
            handshakePromise?.succeed(parameters)
            handshakePromise = nil
            encryptPendingWrites(context: context)
            // Application data may have arrived in the same read as the server's Finished.
            deliverPlaintext(context: context)
        }
    }

    /// Decrypts everything buffered and fires it in chunks of at most `plaintextReadChunkSize`. Buffers
    /// are sized to the ciphertext at hand (plaintext is never longer), so small messages do not each
    /// hold a full chunk of memory while they wait for the application.
    private func deliverPlaintext(context: ChannelHandlerContext) {
        let chunkSize = configuration.plaintextReadChunkSize
        var plaintext = ByteBuffer()
        func fire() {
            guard plaintext.readableBytes > 0 else { return }
            applicationReadPending = false
            deliveredInBurst = true
            context.fireChannelRead(wrapInboundOut(plaintext))
            plaintext = ByteBuffer()
        }
        while stateMachine.deliversInput {
            if plaintext.readableBytes >= chunkSize { fire() }
            let room = min(chunkSize - plaintext.readableBytes, connection.bufferedInput)
            let result: SSLConnection.ReadResult = room > 0 ? connection.read(into: &plaintext, maximum: room) : .wantsInput
            switch result {
            case .read:
                continue
            case .wantsInput:
                fire()
                sendPendingCiphertext(context: context, flush: true)  // e.g. an alert OpenSSL queued
                reportRenegotiation(context: context)
                return
            case .closeNotify:
                fire()
                reportRenegotiation(context: context)
                closeNotifyReceived(context: context)
                return
            case .failed(let error):
                fire()
                reportRenegotiation(context: context)
                fail(error, context: context)
                return
            }
        }
    }

    /// Answers the peer's close_notify at once unless both the configuration and the channel allow
    /// half-closure. A channel without `ChannelOptions.allowRemoteHalfClosure` closes when its input ends
    /// (NIO's rule for TCP), so nothing above it waits for an end of input that it would ignore: a
    /// pipeline that never acts on `inputClosed` (a multiplexer session, say) would otherwise keep the
    /// connection, and the peer waiting for our answer, open until some timeout.
    private func closeNotifyReceived(context: ChannelHandlerContext) {
        let channelAllows = (try? context.channel.syncOptions?.getOption(ChannelOptions.allowRemoteHalfClosure)) ?? false
        switch stateMachine.closeNotifyReceived(allowHalfClosure: configuration.allowRemoteHalfClosure && channelAllows) {
        case .fireInputClosed:
            context.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
        case .replyAndClose:
            connection.sendCloseNotify()
            sendThenClose(context: context, mode: .all, promise: nil)
        case .close:
            context.close(promise: nil)
        case .ignore:
            break
        }
    }

    // MARK: Renegotiation (the conformance hook)

    public func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        guard event is PSKTLSRenegotiation.Request else { return context.triggerUserOutboundEvent(event, promise: promise) }
        guard role == .client, stateMachine.state == .active, !renegotiationRequested else {
            promise?.fail(PSKTLSError(.failed, role: role, detail: "renegotiation needs an established client session"))
            return
        }
        if let error = connection.requestRenegotiation() {
            promise?.fail(error)
            fail(error, context: context)
            return
        }
        renegotiationRequested = true
        sendPendingCiphertext(context: context, flush: true)
        context.read()  // the answer is read whatever the application asked
        promise?.succeed(())
    }

    /// Fires the server's answer to a renegotiation we asked for, once it has come.
    private func reportRenegotiation(context: ChannelHandlerContext) {
        guard renegotiationRequested else { return }
        let outcome: PSKTLSRenegotiation.Outcome
        if let alert = connection.warningAlertReceived {
            outcome = .warned(alert)
        } else if !connection.renegotiationPending {
            outcome = .renegotiated
        } else {
            context.read()
            return
        }
        renegotiationRequested = false
        context.fireUserInboundEventTriggered(outcome)
    }

    // MARK: Outbound

    public func read(context: ChannelHandlerContext) {
        applicationReadPending = true
        context.read()
    }

    public func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let plaintext = unwrapOutboundIn(data)
        if stateMachine.holdsOutput {
            guard pendingWriteBytes + plaintext.readableBytes <= configuration.maximumBufferedPlaintextBeforeHandshake else {
                promise?.fail(PSKTLSError(.writeBufferLimitExceeded, role: role,
                                          detail: "limit \(configuration.maximumBufferedPlaintextBeforeHandshake) bytes"))
                return
            }
        } else if !stateMachine.acceptsOutput {
            promise?.fail(PSKTLSError(.connectionClosed, role: role))
            return
        }
        pendingWriteBytes += plaintext.readableBytes
        pendingWrites.append((plaintext, promise))
    }

    public func flush(context: ChannelHandlerContext) {
        pendingWrites.mark()
        if stateMachine.acceptsOutput { encryptPendingWrites(context: context) }
    }

    /// Encrypts the flushed writes together into buffers of at most `ciphertextBufferSize` (OpenSSL
    /// writes the records straight into them) and writes each buffer with the promises of the writes that
    /// ended in it. One buffer per flush, not one per write: a multiplexer's frame header and its payload
    /// share a buffer, and a write larger than a buffer is cut at record boundaries so that buffers stay of
    /// a size the BIO can reuse. Writes smaller than `coalescedWriteLimit` are copied together and
    /// encrypted as one record (a relayed 64-byte message and its frame header: one record, not two).
    private func encryptPendingWrites(context: ChannelHandlerContext) {
        let bufferSize = max(configuration.ciphertextBufferSize, Self.smallestCiphertextBuffer)
        let coalescedLimit = min(configuration.coalescedWriteLimit, SSLConnection.maximumRecordPlaintext)
        var wroteAny = false
        while pendingWrites.hasMark, let write = pendingWrites.popFirst() {
            var plaintext = write.data
            pendingWriteBytes -= plaintext.readableBytes
            if plaintext.readableBytes < coalescedLimit {
                if gathered.readableBytes + plaintext.readableBytes > SSLConnection.maximumRecordPlaintext {
                    guard encryptGathered(before: plaintext.readableBytes, bufferSize: bufferSize, context: context,
                                          wroteAny: &wroteAny) else { return }
                }
                gathered.writeBuffer(&plaintext)
                if let promise = write.promise { promisesOfGathered.append(promise) }
                continue
            }
            guard encryptGathered(before: plaintext.readableBytes, bufferSize: bufferSize, context: context,
                                  wroteAny: &wroteAny) else { return }
            if let failure = encrypt(&plaintext, before: 0, bufferSize: bufferSize, context: context, wroteAny: &wroteAny) {
                write.promise?.fail(failure)
                fail(failure, context: context)
                return
            }
            if let promise = write.promise { promisesOfOutput.append(promise) }
        }
        guard encryptGathered(before: 0, bufferSize: bufferSize, context: context, wroteAny: &wroteAny) else { return }
        if connection.pendingOutput > 0 || !promisesOfOutput.isEmpty {
            emitOutput(context: context)
            wroteAny = true
        }
        if wroteAny { context.flush() }
    }

    /// Encrypts the small writes gathered so far as one record, before `upcoming` bytes of a write already
    /// taken from the queue. Returns false when the connection failed.
    private func encryptGathered(before upcoming: Int, bufferSize: Int, context: ChannelHandlerContext,
                                 wroteAny: inout Bool) -> Bool {
        if gathered.readableBytes > 0 {
            let failure = encrypt(&gathered, before: upcoming, bufferSize: bufferSize, context: context, wroteAny: &wroteAny)
            gathered.clear()
            if let failure {
                fail(failure, context: context)
                return false
            }
        }
        promisesOfOutput.append(contentsOf: promisesOfGathered)
        promisesOfGathered.removeAll(keepingCapacity: true)
        return true
    }

    /// Encrypts all of `plaintext` into the output buffer, writing out a buffer whenever the next record
    /// would not fit in it. `upcoming`: bytes of this flush that follow it and are no longer counted in
    /// `pendingWriteBytes`, so that a new buffer is sized for them too.
    private func encrypt(_ plaintext: inout ByteBuffer, before upcoming: Int, bufferSize: Int,
                         context: ChannelHandlerContext, wroteAny: inout Bool) -> PSKTLSError? {
        while plaintext.readableBytes > 0 {
            let room = Self.plaintextFitting(bufferSize - connection.pendingOutput)
            // Less than a record's room left: start a new buffer rather than cut a small record.
            if room < min(plaintext.readableBytes, SSLConnection.maximumRecordPlaintext) {
                emitOutput(context: context)
                wroteAny = true
                continue
            }
            let piece = plaintext.readSlice(length: min(room, plaintext.readableBytes)) ?? ByteBuffer()
            // A new buffer is sized for what this flush may still put in it, so it grows at most once.
            let expected = connection.pendingOutput == 0
                ? min(room, piece.readableBytes + plaintext.readableBytes + upcoming + pendingWriteBytes)
                : piece.readableBytes
            connection.reserveOutput(Self.ciphertextLength(ofPlaintext: expected))
            if let failure = piece.withUnsafeReadableBytes({ connection.write($0) }) { return failure }
        }
        return nil
    }

    /// Writes the ciphertext encrypted so far, completing the promises of the writes it finishes.
    private func emitOutput(context: ChannelHandlerContext) {
        let promise: EventLoopPromise<Void>?
        switch promisesOfOutput.count {
        case 0:
            promise = nil
        case 1:
            promise = promisesOfOutput[0]
        default:
            let combined = context.eventLoop.makePromise(of: Void.self)
            for each in promisesOfOutput { combined.futureResult.cascade(to: each) }
            promise = combined
        }
        promisesOfOutput.removeAll(keepingCapacity: true)
        context.write(wrapOutboundOut(connection.takeOutput()), promise: promise)
    }

    /// The smallest ciphertext buffer the handler uses whatever the configuration says: room for a full
    /// record and more.
    static let smallestCiphertextBuffer = 32 << 10

    /// Bytes each record adds: a 5-byte header, the 8-byte explicit nonce and the 16-byte GCM tag.
    static let recordOverhead = 29

    /// The ciphertext `length` bytes of plaintext become (at most).
    static func ciphertextLength(ofPlaintext length: Int) -> Int {
        length + (length / SSLConnection.maximumRecordPlaintext + 1) * recordOverhead
    }

    /// The most plaintext whose ciphertext fits in `bytes`.
    static func plaintextFitting(_ bytes: Int) -> Int {
        max(0, bytes - (bytes / SSLConnection.maximumRecordPlaintext + 1) * recordOverhead)
    }

    public func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        switch stateMachine.closeRequested(mode: mode) {
        case .passOn:
            context.close(mode: mode, promise: promise)
        case .closeAfterCloseNotify:
            if let lastWriteBeforeClose {
                close(context: context, after: lastWriteBeforeClose, mode: mode, promise: promise)
            } else {
                context.close(mode: mode, promise: promise)
            }
        case .refuse:
            promise?.fail(ChannelError.operationUnsupported)
        case .closeImmediately:
            handshakeTimeout?.cancel()
            let error = PSKTLSError(.connectionClosed, role: role, detail: "closed during the handshake")
            handshakePromise?.fail(error)
            handshakePromise = nil
            failPendingWrites(error)
            context.close(mode: .all, promise: promise)
        case .sendCloseNotifyThenClose:
            encryptPendingWrites(context: context)
            failPendingWrites(PSKTLSError(.connectionClosed, role: role, detail: "closed before flush"))
            if !Mutant.tlsCloseWithoutCloseNotify.isActive { connection.sendCloseNotify() }
            sendThenClose(context: context, mode: .all, promise: promise)
        case .sendCloseNotifyThenCloseOutput:
            encryptPendingWrites(context: context)
            failPendingWrites(PSKTLSError(.connectionClosed, role: role, detail: "output closed before flush"))
            connection.sendCloseNotify()
            sendThenClose(context: context, mode: .output, promise: promise)
        }
    }

    // MARK: Helpers

    /// Writes whatever OpenSSL queued for the network (handshake messages, alerts, close_notify).
    private func sendPendingCiphertext(context: ChannelHandlerContext, flush: Bool) {
        guard connection.pendingOutput > 0 else { return }
        context.write(wrapOutboundOut(connection.takeOutput()), promise: nil)
        if flush { context.flush() }
    }

    /// Sends the queued ciphertext (an alert or close_notify) and closes once it is on the wire (after
    /// all earlier writes), because closing a channel discards what it has not written yet. If the peer
    /// does not read for `closeTimeout`, the channel is closed anyway.
    private func sendThenClose(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        let written = context.writeAndFlush(wrapOutboundOut(connection.takeOutput()))
        lastWriteBeforeClose = written
        close(context: context, after: written, mode: mode, promise: promise)
    }

    private func close(context: ChannelHandlerContext, after written: EventLoopFuture<Void>, mode: CloseMode,
                       promise: EventLoopPromise<Void>?) {
        var closed = false
        let deadline = context.eventLoop.assumeIsolated().scheduleTask(in: TimeAmount(configuration.closeTimeout)) {
            guard !closed else { return }
            closed = true
            context.close(mode: .all, promise: promise)
        }
        written.assumeIsolated().whenComplete { _ in
            deadline.cancel()
            guard !closed else { return }
            closed = true
            context.close(mode: mode, promise: promise)
        }
    }

    /// Ends the connection with `error`: sends any alert, reports the error once, closes.
    private func fail(_ error: PSKTLSError, context: ChannelHandlerContext) {
        guard stateMachine.failed() else { return }
        report(error, context: context)
        failPendingWrites(error)
        sendThenClose(context: context, mode: .all, promise: nil)
    }

    /// Fails the handshake promise (if still pending) and fires the error.
    private func report(_ error: PSKTLSError, context: ChannelHandlerContext) {
        handshakeTimeout?.cancel()
        handshakeTimeout = nil
        handshakePromise?.fail(error)
        handshakePromise = nil
        context.fireErrorCaught(error)
    }

    private func failPendingWrites(_ error: PSKTLSError) {
        for promise in promisesOfOutput + promisesOfGathered { promise.fail(error) }
        promisesOfOutput.removeAll()
        promisesOfGathered.removeAll()
        gathered.clear()
        while let write = pendingWrites.popFirst() { write.promise?.fail(error) }
        pendingWriteBytes = 0
    }
}

@available(*, unavailable)
extension PSKTLSHandler: Sendable {}
