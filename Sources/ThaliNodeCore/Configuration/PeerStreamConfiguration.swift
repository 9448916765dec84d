import NIOCore
import ThaliPSKTLS

/// How a ``ThaliPeer`` marks the streams of its sessions (spec/node.md, "Stream marking").
public struct PeerStreamConfiguration: Sendable, Hashable {
    /// Whether this peer offers (connecting) and accepts (accepting) the ALPN protocol
    /// ``StreamHeader/alpnProtocol`` in its PSK-TLS handshakes. With it agreed, every stream starts
    /// with a ``StreamHeader`` naming what it carries, so one session carries delivery, a relay and
    /// app protocols side by side; without it (false here, or a peer from before marking on the other
    /// side) the session behaves as before: the node's mode decides (relay mode: every stream is
    /// relayed; otherwise: delivery). Default: true; false makes the peer behave as one from before
    /// marking (its streams carry what the node's mode says).
    public var marking = true
    /// How long the accepting side waits for a stream's whole header once the stream is open, and the
    /// opener for the answer to it; then the stream is refused (``StreamRefusal/Code/badHeader``) or
    /// fails (``StreamHeaderError/statusTimedOut(milliseconds:)``). The answer to a relay stream comes
    /// after the app port took the connection, so this also bounds that connect. Default: 10 s.
    public var headerTimeout: Duration = .seconds(10)
    /// How long ``ThaliPeer/openStream(to:protocol:timeout:)`` waits, by default, for a session with the contact
    /// when none is up. Default: 30 s.
    public var openTimeout: Duration = .seconds(30)
    /// How long an app stream closed while the other side may still send waits for that side's end
    /// before it is reset: a close first ends our output (what was written is delivered, then the end),
    /// as TCP's close does, and the stream goes once the other side ends too. Default: 10 s.
    public var closeLinger: Duration = .seconds(10)

    /// The defaults.
    public init() {}

    /// `tls` with ``StreamHeader/alpnProtocol`` offered and accepted first when ``marking`` is on.
    func tlsConfiguration(_ tls: PSKTLSConfiguration) -> PSKTLSConfiguration {
        guard marking, !tls.applicationProtocols.contains(StreamHeader.alpnProtocol) else { return tls }
        var marked = tls
        marked.applicationProtocols.insert(StreamHeader.alpnProtocol, at: 0)
        return marked
    }
}
