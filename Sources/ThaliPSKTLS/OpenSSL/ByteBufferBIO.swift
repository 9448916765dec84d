import COpenSSL
import NIOCore

/// The BIO between OpenSSL and the channel: OpenSSL reads ciphertext straight out of the `ByteBuffer`s
/// the channel received and writes its records straight into a `ByteBuffer` the handler sends. A pair
/// of memory BIOs would copy every byte once more in each direction.
///
/// The `BIO` itself is owned by the `SSL` it is attached to; this object holds the buffers and must
/// outlive the `SSL` (its owner, `SSLConnection`, frees the `SSL` first).
final class ByteBufferBIO {
    /// The one `BIO_METHOD`, made on first use and kept for the life of the process.
    private struct Method: @unchecked Sendable {  // immutable after creation, as OpenSSL requires
        let pointer: OpaquePointer
    }

    private static let method: Method? = {
        guard let method = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "thali-bytebuffer") else { return nil }
        BIO_meth_set_write(method) { bio, data, length in
            guard let bio, let data, length >= 0, let buffers = ByteBufferBIO.owner(of: bio) else { return -1 }
            thali_BIO_clear_retry_flags(bio)
            buffers.outbound.writeBytes(UnsafeRawBufferPointer(start: data, count: Int(length)))
            return length
        }
        BIO_meth_set_read(method) { bio, target, length in
            guard let bio, let target, length >= 0, let buffers = ByteBufferBIO.owner(of: bio) else { return -1 }
            thali_BIO_clear_retry_flags(bio)
            let count = buffers.readInbound(into: UnsafeMutableRawBufferPointer(start: target, count: Int(length)))
            guard count > 0 else {
                thali_BIO_set_retry_read(bio)  // "no data yet": OpenSSL reports SSL_ERROR_WANT_READ
                return -1
            }
            return Int32(count)
        }
        BIO_meth_set_ctrl(method) { bio, command, _, _ in
            guard let bio, let buffers = ByteBufferBIO.owner(of: bio) else { return 0 }
            switch command {
            case BIO_CTRL_FLUSH: return 1
            case BIO_CTRL_PENDING: return buffers.inboundBytes
            case BIO_CTRL_WPENDING: return buffers.outbound.readableBytes
            default: return 0
            }
        }
        BIO_meth_set_destroy(method) { bio in
            guard let bio else { return 0 }
            BIO_set_data(bio, nil)
            BIO_set_init(bio, 0)
            return 1
        }
        return Method(pointer: method)
    }()

    /// The `BIO *`, to be handed to `SSL_set_bio` (which takes ownership).
    let bio: OpaquePointer
    private var inbound = CircularBuffer<ByteBuffer>()
    private(set) var inboundBytes = 0
    private var outbound = ByteBuffer()

    init() throws(PSKTLSError) {
        guard let method = Self.method?.pointer, let bio = BIO_new(method) else {
            throw PSKTLSError(.failed, role: .client, detail: "BIO_new: \(OpenSSLErrors.drain())")
        }
        self.bio = bio
        BIO_set_data(bio, Unmanaged.passUnretained(self).toOpaque())
        BIO_set_init(bio, 1)
    }

    private static func owner(of bio: OpaquePointer) -> ByteBufferBIO? {
        guard let data = BIO_get_data(bio) else { return nil }
        return Unmanaged<ByteBufferBIO>.fromOpaque(data).takeUnretainedValue()
    }

    /// Queues ciphertext from the network (no copy: the buffer is kept until OpenSSL has read it).
    func appendInbound(_ buffer: ByteBuffer) {
        guard buffer.readableBytes > 0 else { return }
        inbound.append(buffer)
        inboundBytes += buffer.readableBytes
    }

    private func readInbound(into target: UnsafeMutableRawBufferPointer) -> Int {
        var copied = 0
        while copied < target.count, var first = inbound.first {
            let count = min(first.readableBytes, target.count - copied)
            first.withUnsafeReadableBytes { source in
                UnsafeMutableRawBufferPointer(rebasing: target[copied..<(copied + count)])
                    .copyMemory(from: UnsafeRawBufferPointer(rebasing: source[0..<count]))
            }
            first.moveReaderIndex(forwardBy: count)
            copied += count
            if first.readableBytes == 0 {
                inbound.removeFirst()
            } else {
                inbound[inbound.startIndex] = first
            }
        }
        inboundBytes -= copied
        return copied
    }

    /// Bytes OpenSSL has written for the network and nobody has taken yet.
    var pendingOutput: Int { outbound.readableBytes }

    /// Makes room for `bytes` more of output, so a large write lands in one allocation.
    func reserveOutput(_ bytes: Int) {
        outbound.reserveCapacity(minimumWritableBytes: bytes)
    }

    /// Everything OpenSSL has written for the network, handed over without a copy.
    func takeOutput() -> ByteBuffer {
        let output = outbound
        outbound = ByteBuffer()
        return output
    }
}
