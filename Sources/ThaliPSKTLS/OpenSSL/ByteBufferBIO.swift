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
    /// Output buffers already handed to the channel, kept so that the next large output is written into
    /// the memory of one the channel has finished with. A fresh buffer of 64 KiB or more per write cost
    /// the relay about a tenth of its CPU time in page faults (the allocator maps such buffers anew and the
    /// kernel zeroes every page); see spec/psk-tls.md, "Performance".
    private var spareOutputs: [ByteBuffer] = []
    /// How many times output went into a kept buffer instead of fresh memory (for tests).
    private(set) var reusedOutputBuffers = 0
    /// How many output buffers are kept for reuse (`PSKTLSConfiguration.recycledCiphertextBuffers`).
    private let keptOutputBuffers: Int

    /// Output buffers smaller than this are not kept: the allocator serves them from memory it keeps.
    static let smallestKeptOutputBuffer = 64 << 10

    init(keptOutputBuffers: Int = 0) throws(PSKTLSError) {
        self.keptOutputBuffers = max(0, keptOutputBuffers)
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

    /// Makes room for `bytes` more of output, so a large write lands in one allocation: a large one in a
    /// kept buffer the channel has finished with, if there is one.
    func reserveOutput(_ bytes: Int) {
        guard outbound.writableBytes < bytes else { return }
        let needed = outbound.readableBytes + bytes
        if needed * 2 > Self.smallestKeptOutputBuffer { adoptSpareOutput(minimumCapacity: needed) }
        outbound.reserveCapacity(minimumWritableBytes: bytes)
    }

    /// Makes a kept buffer that nobody else holds any more (the channel has written it) the output buffer,
    /// with the output written so far.
    private func adoptSpareOutput(minimumCapacity: Int) {
        for index in spareOutputs.indices where spareOutputs[index].capacity >= minimumCapacity {
            let free = spareOutputs[index].modifyIfUniquelyOwned { buffer in buffer.clear() } != nil
            guard free else { continue }
            var spare = spareOutputs.remove(at: index)
            reusedOutputBuffers += 1
            spare.writeBuffer(&outbound)
            outbound = spare
            return
        }
    }

    /// Everything OpenSSL has written for the network, handed over without a copy (a large buffer is
    /// also kept, to be written into again once the channel is done with it).
    func takeOutput() -> ByteBuffer {
        let output = outbound
        outbound = ByteBuffer()
        if keptOutputBuffers > 0, output.capacity >= Self.smallestKeptOutputBuffer {
            if spareOutputs.count >= keptOutputBuffers { spareOutputs.removeFirst() }
            spareOutputs.append(output)
        }
        return output
    }
}
