// A yamux bridge, as a Thali binding uses TCPMultiplexer: one connection between two devices carries
// many TCP connections. The "remote" side turns each stream into a connection to a local service (an
// uppercasing echo here); the "local" side listens on a port whose every connection becomes a stream.
import NIOCore
import NIOPosix

import TCPMultiplexer

let group = MultiThreadedEventLoopGroup.singleton

/// The app on the remote device: answers each connection with its input in capitals.
final class UppercaseHandler: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let text = String(buffer: unwrapInboundIn(data)).uppercased()
        context.writeAndFlush(wrapOutboundOut(ByteBuffer(string: text)), promise: nil)
    }
}

let service = try await ServerBootstrap(group: group)
    .childChannelInitializer { $0.pipeline.addHandler(UppercaseHandler()) }
    .bind(host: "127.0.0.1", port: 0).get()
let servicePort = service.localAddress?.port ?? 0

// The relayed stream between the devices (a TCP connection here; RFCOMM or a TLS session in Thali).
let link = try await ServerBootstrap(group: group)
    .childChannelInitializer { channel in
        MultiplexerSession.configure(on: channel, role: .server,
                                     inboundStreamInitializer: MultiplexerBridge.connectingInitializer(
                                         host: "127.0.0.1", port: servicePort))
            .map { _ in }
    }
    .bind(host: "127.0.0.1", port: 0).get()
let linkConnection = try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: link.localAddress?.port ?? 0).get()
let localSession = try await MultiplexerSession.configure(on: linkConnection, role: .client).get()
let entrance = try await MultiplexerBridge.listen(forwardingTo: localSession).get()
let entrancePort = entrance.localAddress?.port ?? 0
print("yamux bridge: connections to 127.0.0.1:\(entrancePort) reach the service on 127.0.0.1:\(servicePort)")

/// One app connection through the bridge: sends `text`, returns the first reply.
func ask(_ text: String) async throws -> String {
    let promise = group.next().makePromise(of: String.self)
    final class FirstReply: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        let promise: EventLoopPromise<String>
        init(_ promise: EventLoopPromise<String>) { self.promise = promise }
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            promise.succeed(String(buffer: unwrapInboundIn(data)))
            context.close(promise: nil)
        }
        func channelInactive(context: ChannelHandlerContext) { promise.fail(ChannelError.eof) }
    }
    let connection = try await ClientBootstrap(group: promise.futureResult.eventLoop)
        .channelInitializer { $0.pipeline.addHandler(FirstReply(promise)) }
        .connect(host: "127.0.0.1", port: entrancePort).get()
    try await connection.writeAndFlush(ByteBuffer(string: text))
    return try await promise.futureResult.get()
}

// Several connections at once, all over the one link.
let answers = try await withThrowingTaskGroup(of: (String, String).self) { tasks in
    for word in ["alpha", "bravo", "charlie", "delta"] {
        tasks.addTask { (word, try await ask(word)) }
    }
    var answers: [String: String] = [:]
    for try await (word, answer) in tasks { answers[word] = answer }
    return answers
}
for (word, answer) in answers.sorted(by: { $0.key < $1.key }) {
    guard answer == word.uppercased() else { fatalError("\(word) came back as \(answer)") }
    print("\(word) -> \(answer)")
}
let metrics = try await localSession.metrics().get()
print("streams opened over the one link: \(metrics.streamsOpenedLocally)")
try await entrance.close().get()
try await localSession.close().get()
try await link.close().get()
try await service.close().get()
