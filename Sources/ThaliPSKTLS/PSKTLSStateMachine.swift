import NIOCore
import ThaliMutants

/// The life of one PSK-TLS connection. The handler asks it what to do for each event and does only
/// that; every transition is spelled out here.
///
/// ```
/// idle ──channelActive──▶ handshaking ──completed──▶ active ──close_notify in──▶ inputClosed ─┐
///                              │                       │                                      │
///                              │                       └──close(.output)──▶ outputClosed ─────┤
///                              └──failure / timeout / close──────────────────────────────▶ closed
/// ```
struct PSKTLSStateMachine {
    enum State: Equatable {
        /// The handler is in a pipeline whose channel is not connected yet.
        case idle
        /// Handshake messages are being exchanged; application writes are held.
        case handshaking
        /// Application data flows both ways.
        case active
        /// The peer sent close_notify: no more input, output still open (half-closure).
        case inputClosed
        /// We sent close_notify and shut down our output: input still open.
        case outputClosed
        /// Finished, by failure or by close.
        case closed
    }

    private(set) var state: State = .idle

    /// Whether application data may be decrypted and delivered now.
    var deliversInput: Bool { state == .active || state == .outputClosed }
    /// Whether application writes are encrypted and sent now (rather than held or refused).
    var acceptsOutput: Bool { state == .active || state == .inputClosed }
    /// Whether application writes are held until the handshake ends.
    var holdsOutput: Bool { state == .idle || state == .handshaking }

    /// The channel is connected: start the handshake once.
    mutating func channelActive() -> Bool {
        guard state == .idle else { return false }
        state = .handshaking
        return true
    }

    mutating func handshakeCompleted() {
        precondition(state == .handshaking, "handshake completed in state \(state)")
        state = .active
    }

    /// A fatal error (or a timeout): returns false if already closed, so it is reported once.
    mutating func failed() -> Bool {
        guard state != .closed else { return false }
        state = .closed
        return true
    }

    enum CloseNotifyAction {
        /// Tell the pipeline the input ended (`ChannelEvent.inputClosed`); keep writing.
        case fireInputClosed
        /// Answer with our close_notify and close the channel.
        case replyAndClose
        /// Both directions are now closed: close the channel.
        case close
        case ignore
    }

    mutating func closeNotifyReceived(allowHalfClosure: Bool) -> CloseNotifyAction {
        switch state {
        case .active where allowHalfClosure:
            state = .inputClosed
            return .fireInputClosed
        case .active:
            state = .closed
            return .replyAndClose
        case .outputClosed:
            state = .closed
            return .close
        case .idle, .handshaking, .inputClosed, .closed:
            return .ignore
        }
    }

    enum CloseAction {
        /// Close the TCP connection at once (no TLS session to end cleanly).
        case closeImmediately
        /// Send close_notify, then close the channel entirely.
        case sendCloseNotifyThenClose
        /// Send close_notify, then shut down the TCP output only.
        case sendCloseNotifyThenCloseOutput
        /// Our close_notify is on its way: close the channel once it is written.
        case closeAfterCloseNotify
        /// Nothing of ours to do: pass the close on.
        case passOn
        /// A half-closure that is not possible now.
        case refuse
    }

    mutating func closeRequested(mode: CloseMode) -> CloseAction {
        switch (state, mode) {
        case (_, .input):
            return .passOn
        case (.idle, _), (.handshaking, .all):
            state = .closed
            return .closeImmediately
        case (.handshaking, .output):
            return .refuse
        case (.active, .all), (.inputClosed, _):
            state = .closed
            return .sendCloseNotifyThenClose
        case (.active, .output):
            state = .outputClosed
            return .sendCloseNotifyThenCloseOutput
        case (.outputClosed, .all):
            state = .closed
            return .closeAfterCloseNotify
        case (.outputClosed, .output):
            return .refuse
        case (.closed, _):
            return .passOn
        }
    }

    /// The TCP input ended: a FIN (`channelInactive` false) or the channel went away (true).
    /// Returns the failure this means, if any; the caller then reports it through `failed()`.
    mutating func endOfInput(channelInactive: Bool) -> PSKTLSError.Reason? {
        switch state {
        case .handshaking:
            return .closedDuringHandshake
        case .active, .outputClosed:
            return Mutant.tlsUncleanCloseAsClean.isActive ? nil : .uncleanShutdown
        case .inputClosed where !channelInactive:
            return nil  // the peer's close_notify came first: a clean half-closure
        case .idle, .inputClosed, .closed:
            if channelInactive { state = .closed }
            return nil
        }
    }
}
