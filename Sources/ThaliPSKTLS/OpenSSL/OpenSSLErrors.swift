import COpenSSL

/// Reads and clears OpenSSL's per-thread error queue.
enum OpenSSLErrors {
    /// Empties the queue, so the next call's errors are its own.
    static func clear() { ERR_clear_error() }

    /// The queued errors as text (`error:0A000086:SSL routines::...; ...`), emptying the queue.
    static func drain() -> String {
        var messages: [String] = []
        while true {
            let code = ERR_get_error()
            if code == 0 { break }
            var buffer = [CChar](repeating: 0, count: 256)
            ERR_error_string_n(code, &buffer, buffer.count)
            messages.append(String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        }
        return messages.joined(separator: "; ")
    }
}
