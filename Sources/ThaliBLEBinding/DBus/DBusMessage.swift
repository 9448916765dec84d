import CDBus

/// D-Bus type codes (libdbus spells them as character-cast macros Swift does not import).
enum DBusTypeCode {
    static let invalid: Int32 = 0
    static let byte = code("y"), boolean = code("b"), int16 = code("n"), uint16 = code("q")
    static let int32 = code("i"), uint32 = code("u"), int64 = code("x"), uint64 = code("t")
    static let double = code("d"), string = code("s"), objectPath = code("o"), signature = code("g")
    static let unixFD = code("h"), array = code("a"), variant = code("v"), structure = code("r")
    static let dictEntry = code("e")

    private static func code(_ character: Unicode.Scalar) -> Int32 { Int32(character.value) }
}

/// Why a D-Bus operation failed.
public enum DBusClientError: Error, Hashable, Sendable, CustomStringConvertible {
    /// Could not connect to or register on the bus.
    case connectionFailed(address: String, reason: String)
    /// The bus connection is gone (the daemon exited or closed it).
    case disconnected
    /// No reply within the configured time.
    case timedOut(method: String, seconds: Double)
    /// The peer (or the bus) answered with an error.
    case remote(name: String, message: String)
    /// A message could not be built (a value libdbus would refuse).
    case invalidArgument(String)
    /// A reply did not have the expected shape.
    case unexpectedReply(String)
    /// libdbus ran out of memory.
    case outOfMemory

    public var description: String {
        switch self {
        case .connectionFailed(let address, let reason): return "cannot connect to D-Bus at \(address): \(reason)"
        case .disconnected: return "the D-Bus connection is closed"
        case .timedOut(let method, let seconds): return "D-Bus call \(method) got no reply within \(seconds) s"
        case .remote(let name, let message): return "D-Bus error \(name): \(message)"
        case .invalidArgument(let what): return "invalid D-Bus argument: \(what)"
        case .unexpectedReply(let what): return "unexpected D-Bus reply: \(what)"
        case .outOfMemory: return "libdbus is out of memory"
        }
    }
}

/// Owns one `DBusMessage*` and unrefs it on deinit.
package final class DBusMessageRef {
    let pointer: OpaquePointer

    /// Takes over a reference the caller owns.
    package init(owning pointer: OpaquePointer) {
        self.pointer = pointer
    }

    deinit { dbus_message_unref(pointer) }

    package static func methodCall(destination: String?, path: String, interface: String?, member: String) throws(DBusClientError)
        -> DBusMessageRef
    {
        guard DBusNames.isValidObjectPath(path) else { throw .invalidArgument("object path \(path)") }
        guard let message = dbus_message_new_method_call(destination, path, interface, member) else { throw .outOfMemory }
        return DBusMessageRef(owning: message)
    }

    func makeReturn() throws(DBusClientError) -> DBusMessageRef {
        guard let reply = dbus_message_new_method_return(pointer) else { throw .outOfMemory }
        return DBusMessageRef(owning: reply)
    }

    func makeError(name: String, text: String) throws(DBusClientError) -> DBusMessageRef {
        guard let reply = dbus_message_new_error(pointer, name, text) else { throw .outOfMemory }
        return DBusMessageRef(owning: reply)
    }

    var type: Int32 { dbus_message_get_type(pointer) }
    var replySerial: UInt32 { dbus_message_get_reply_serial(pointer) }
    var path: String? { dbus_message_get_path(pointer).map { String(cString: $0) } }
    var interface: String? { dbus_message_get_interface(pointer).map { String(cString: $0) } }
    var member: String? { dbus_message_get_member(pointer).map { String(cString: $0) } }
    var sender: String? { dbus_message_get_sender(pointer).map { String(cString: $0) } }
    var errorName: String? { dbus_message_get_error_name(pointer).map { String(cString: $0) } }
    var noReply: Bool { dbus_message_get_no_reply(pointer) != 0 }

    // MARK: Wire form

    /// Parses one message in D-Bus wire format; libdbus validates the header, the signature and the
    /// body against it (UTF-8, nesting depth, lengths) before anything reads it.
    package static func demarshal(_ bytes: [UInt8]) throws(DBusClientError) -> DBusMessageRef {
        guard !bytes.isEmpty, bytes.count <= Int(Int32.max) else { throw .unexpectedReply("a message of \(bytes.count) bytes") }
        var error = DBusError()
        dbus_error_init(&error)
        defer { dbus_error_free(&error) }
        let message = bytes.withUnsafeBufferPointer { buffer in
            buffer.withMemoryRebound(to: CChar.self) { dbus_message_demarshal($0.baseAddress, Int32($0.count), &error) }
        }
        guard let message else {
            throw .unexpectedReply(error.message.map { String(cString: $0) } ?? "not a D-Bus message")
        }
        return DBusMessageRef(owning: message)
    }

    /// The message in D-Bus wire format.
    package func marshal() throws(DBusClientError) -> [UInt8] {
        var raw: UnsafeMutablePointer<CChar>?
        var length: Int32 = 0
        guard dbus_message_marshal(pointer, &raw, &length) != 0, let raw else { throw .outOfMemory }
        defer { dbus_free(raw) }
        return Array(UnsafeRawBufferPointer(start: raw, count: Int(length)))
    }

    // MARK: Writing

    package func append(_ values: [DBusValue]) throws(DBusClientError) {
        var iter = DBusMessageIter()
        dbus_message_iter_init_append(pointer, &iter)
        for value in values { try Self.append(value, to: &iter) }
    }

    private static func append(_ value: DBusValue, to iter: inout DBusMessageIter) throws(DBusClientError) {
        func basic<T: BitwiseCopyable>(_ type: Int32, _ v: T) throws(DBusClientError) {
            var v = v
            guard dbus_message_iter_append_basic(&iter, type, &v) != 0 else { throw .outOfMemory }
        }
        func text(_ type: Int32, _ s: String) throws(DBusClientError) {
            guard !s.utf8.contains(0) else { throw .invalidArgument("string with a NUL octet") }
            let ok = s.withCString { cString -> Bool in
                var pointer: UnsafePointer<CChar>? = cString
                return dbus_message_iter_append_basic(&iter, type, &pointer) != 0
            }
            guard ok else { throw .outOfMemory }
        }
        func container(_ type: Int32, _ signature: String?, _ body: (inout DBusMessageIter) throws(DBusClientError) -> Void)
            throws(DBusClientError)
        {
            var sub = DBusMessageIter()
            guard dbus_message_iter_open_container(&iter, type, signature, &sub) != 0 else { throw .outOfMemory }
            do {
                try body(&sub)
            } catch {
                dbus_message_iter_abandon_container(&iter, &sub)
                throw error
            }
            guard dbus_message_iter_close_container(&iter, &sub) != 0 else { throw .outOfMemory }
        }

        switch value {
        case .byte(let v): try basic(DBusTypeCode.byte, v)
        case .boolean(let v): try basic(DBusTypeCode.boolean, dbus_bool_t(v ? 1 : 0))
        case .int16(let v): try basic(DBusTypeCode.int16, v)
        case .uint16(let v): try basic(DBusTypeCode.uint16, v)
        case .int32(let v): try basic(DBusTypeCode.int32, v)
        case .uint32(let v): try basic(DBusTypeCode.uint32, v)
        case .int64(let v): try basic(DBusTypeCode.int64, v)
        case .uint64(let v): try basic(DBusTypeCode.uint64, v)
        case .double(let v): try basic(DBusTypeCode.double, v)
        case .unixFD(let fd): try basic(DBusTypeCode.unixFD, fd)
        case .string(let s): try text(DBusTypeCode.string, s)
        case .objectPath(let s):
            guard DBusNames.isValidObjectPath(s) else { throw .invalidArgument("object path \(s)") }
            try text(DBusTypeCode.objectPath, s)
        case .signature(let s):
            guard dbus_signature_validate(s, nil) != 0 else { throw .invalidArgument("signature \(s)") }
            try text(DBusTypeCode.signature, s)
        case .array(let element, let values):
            guard dbus_signature_validate_single(element, nil) != 0 else { throw .invalidArgument("signature \(element)") }
            for v in values where v.signature != element {
                throw .invalidArgument("array of \(element) holds a \(v.signature)")
            }
            try container(DBusTypeCode.array, element) { (sub: inout DBusMessageIter) throws(DBusClientError) in
                for v in values { try append(v, to: &sub) }
            }
        case .dictionary(let key, let valueSignature, let entries):
            let entrySignature = "{" + key + valueSignature + "}"
            guard dbus_signature_validate_single("a" + entrySignature, nil) != 0 else {
                throw .invalidArgument("dictionary signature \(entrySignature)")
            }
            try container(DBusTypeCode.array, entrySignature) { (sub: inout DBusMessageIter) throws(DBusClientError) in
                for entry in entries {
                    guard entry.key.signature == key, entry.value.signature == valueSignature else {
                        throw .invalidArgument("dictionary entry types \(entry.key.signature)/\(entry.value.signature)")
                    }
                    var entryIter = DBusMessageIter()
                    guard dbus_message_iter_open_container(&sub, DBusTypeCode.dictEntry, nil, &entryIter) != 0 else {
                        throw .outOfMemory
                    }
                    try append(entry.key, to: &entryIter)
                    try append(entry.value, to: &entryIter)
                    guard dbus_message_iter_close_container(&sub, &entryIter) != 0 else { throw .outOfMemory }
                }
            }
        case .structure(let fields):
            try container(DBusTypeCode.structure, nil) { (sub: inout DBusMessageIter) throws(DBusClientError) in
                for v in fields { try append(v, to: &sub) }
            }
        case .variant(let inner):
            try container(DBusTypeCode.variant, inner.signature) { (sub: inout DBusMessageIter) throws(DBusClientError) in
                try append(inner, to: &sub)
            }
        }
    }

    // MARK: Reading

    /// The body's values. Unix file descriptors in it are new descriptors the caller owns.
    package func arguments() throws(DBusClientError) -> [DBusValue] {
        var iter = DBusMessageIter()
        guard dbus_message_iter_init(pointer, &iter) != 0 else { return [] }  // empty body
        var values: [DBusValue] = []
        repeat {
            guard dbus_message_iter_get_arg_type(&iter) != DBusTypeCode.invalid else { break }
            values.append(try Self.read(&iter))
        } while dbus_message_iter_next(&iter) != 0
        return values
    }

    private static func read(_ iter: inout DBusMessageIter) throws(DBusClientError) -> DBusValue {
        func basic<T: BitwiseCopyable>(_ initial: T) -> T {
            var v = initial
            dbus_message_iter_get_basic(&iter, &v)
            return v
        }
        func text() -> String {
            var pointer: UnsafePointer<CChar>?
            dbus_message_iter_get_basic(&iter, &pointer)
            return pointer.map { String(cString: $0) } ?? ""
        }
        let type = dbus_message_iter_get_arg_type(&iter)
        switch type {
        case DBusTypeCode.byte: return .byte(basic(UInt8(0)))
        case DBusTypeCode.boolean: return .boolean(basic(dbus_bool_t(0)) != 0)
        case DBusTypeCode.int16: return .int16(basic(Int16(0)))
        case DBusTypeCode.uint16: return .uint16(basic(UInt16(0)))
        case DBusTypeCode.int32: return .int32(basic(Int32(0)))
        case DBusTypeCode.uint32: return .uint32(basic(UInt32(0)))
        case DBusTypeCode.int64: return .int64(basic(Int64(0)))
        case DBusTypeCode.uint64: return .uint64(basic(UInt64(0)))
        case DBusTypeCode.double: return .double(basic(Double(0)))
        case DBusTypeCode.unixFD: return .unixFD(basic(Int32(-1)))
        case DBusTypeCode.string: return .string(text())
        case DBusTypeCode.objectPath: return .objectPath(text())
        case DBusTypeCode.signature: return .signature(text())
        case DBusTypeCode.variant:
            var sub = DBusMessageIter()
            dbus_message_iter_recurse(&iter, &sub)
            return .variant(try read(&sub))
        case DBusTypeCode.structure:
            var sub = DBusMessageIter()
            dbus_message_iter_recurse(&iter, &sub)
            var fields: [DBusValue] = []
            while dbus_message_iter_get_arg_type(&sub) != DBusTypeCode.invalid {
                fields.append(try read(&sub))
                dbus_message_iter_next(&sub)
            }
            return .structure(fields)
        case DBusTypeCode.array:
            guard let raw = dbus_message_iter_get_signature(&iter) else { throw .outOfMemory }
            let signature = String(cString: raw)
            dbus_free(raw)
            let element = String(signature.dropFirst())
            var sub = DBusMessageIter()
            dbus_message_iter_recurse(&iter, &sub)
            if dbus_message_iter_get_element_type(&iter) == DBusTypeCode.dictEntry {
                // element is "{kv}"
                let inner = element.dropFirst().dropLast()
                guard let keySignature = inner.first.map({ String($0) }) else { throw .unexpectedReply("signature \(signature)") }
                let valueSignature = String(inner.dropFirst())
                var entries: [DBusDictionaryEntry] = []
                while dbus_message_iter_get_arg_type(&sub) == DBusTypeCode.dictEntry {
                    var entryIter = DBusMessageIter()
                    dbus_message_iter_recurse(&sub, &entryIter)
                    let key = try read(&entryIter)
                    dbus_message_iter_next(&entryIter)
                    let value = try read(&entryIter)
                    entries.append(DBusDictionaryEntry(key: key, value: value))
                    dbus_message_iter_next(&sub)
                }
                return .dictionary(keySignature: keySignature, valueSignature: valueSignature, entries)
            }
            var elements: [DBusValue] = []
            while dbus_message_iter_get_arg_type(&sub) != DBusTypeCode.invalid {
                elements.append(try read(&sub))
                dbus_message_iter_next(&sub)
            }
            return .array(elementSignature: element, elements)
        default:
            throw .unexpectedReply("unknown type code \(type)")
        }
    }
}

/// Syntax checks for names libdbus would abort on.
enum DBusNames {
    /// `/` or `/a/b_c/d1`: elements of `[A-Za-z0-9_]`, no empty element, no trailing slash.
    static func isValidObjectPath(_ path: String) -> Bool {
        guard path.first == "/" else { return false }
        if path == "/" { return true }
        let elements = path.dropFirst().split(separator: "/", omittingEmptySubsequences: false)
        return elements.allSatisfy { element in
            !element.isEmpty && element.utf8.allSatisfy { byte in
                (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A) || byte == 0x5F
            }
        }
    }
}
