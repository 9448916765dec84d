// A PSK-TLS echo server and client, as an app would use ThaliPSKTLS: the server looks PSKs up by the
// identity the client presents (in Thali, the identity a beacon carried); the client connects with the
// identity and PSK it derived. Both ends speak TLS 1.2 DHE-PSK-AES256-GCM-SHA384 through OpenSSL.
import NIOCore
import NIOPosix
import ThaliPSKTLS

let identity = "example-client"
let psk: [UInt8] = Array(0..<32)

let server = try await PSKTLSServer.serve(host: "127.0.0.1", port: 0) { presented in
    presented == identity ? psk : nil  // unknown identities fail the handshake (unknown_psk_identity)
}
print("echo server listening on 127.0.0.1:\(server.port)")

let echo = Task {
    for await connection in server.connections {
        try? await connection.executeThenClose { inbound, outbound in
            for try await buffer in inbound { try await outbound.write(buffer) }
        }
        return
    }
}

let client = try await PSKTLSClient.connect(host: "127.0.0.1", port: server.port, identity: identity, psk: psk)
print("connected: \(client.parameters.protocolVersion) \(client.parameters.cipherSuite), DH \(client.parameters.dhGroupBits) bits")
let message = "hello over PSK-TLS"
let reply = try await client.executeThenClose { inbound, outbound in
    try await outbound.write(ByteBuffer(string: message))
    outbound.finish()  // close_notify after the message; the server echoes, then closes
    var received = ByteBuffer()
    for try await buffer in inbound { received.writeImmutableBuffer(buffer) }
    return String(buffer: received)
}
_ = await echo.result
await server.close()
guard reply == message else { fatalError("echo differs: \(reply)") }
print("echoed: \(reply)")
