import NIOCore
import NIOPosix

/// What a TCP connect from a chosen source address came to.
public enum ConnectOutcome: Equatable, Sendable {
    case connected
    /// No answer within the timeout: what a listener whose kernel filter drops the source shows.
    case timedOut
    case failed(String)
}

/// A TCP connect from `source` (a loopback address of the test's choice) to `host:port`, waiting at
/// most `timeout`, closed at once: how the source-filter tests play a refused or a welcome host.
public func connect(from source: String, to host: String = "127.0.0.1", port: Int,
                    timeout: TimeAmount = .milliseconds(400)) async -> ConnectOutcome {
    do {
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .bind(to: try SocketAddress(ipAddress: source, port: 0))
            .connectTimeout(timeout)
            .connect(host: host, port: port).get()
        try? await channel.close()
        return .connected
    } catch ChannelError.connectTimeout {
        return .timedOut
    } catch {
        return .failed("\(error)")
    }
}
