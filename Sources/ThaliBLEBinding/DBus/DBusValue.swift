/// A D-Bus value with its type, as carried in message bodies. Containers carry the signatures of their
/// elements so that empty arrays and dictionaries still have a type.
public indirect enum DBusValue: Hashable, Sendable {
    /// `y`
    case byte(UInt8)
    /// `b`
    case boolean(Bool)
    /// `n`
    case int16(Int16)
    /// `q`
    case uint16(UInt16)
    /// `i`
    case int32(Int32)
    /// `u`
    case uint32(UInt32)
    /// `x`
    case int64(Int64)
    /// `t`
    case uint64(UInt64)
    /// `d`
    case double(Double)
    /// `s` (UTF-8 without NUL)
    case string(String)
    /// `o`
    case objectPath(String)
    /// `g`
    case signature(String)
    /// A file descriptor passed over the bus. A received one belongs to the receiver, who must close it.
    case unixFD(Int32)
    /// An array of values, all of type `elementSignature`.
    case array(elementSignature: String, [DBusValue])
    /// A dictionary (`a{kv}`); keys are basic types.
    case dictionary(keySignature: String, valueSignature: String, [DBusDictionaryEntry])
    /// A struct (`(...)`).
    case structure([DBusValue])
    /// A variant: a value carrying its own type.
    case variant(DBusValue)

    /// The value's D-Bus type signature.
    public var signature: String {
        switch self {
        case .byte: return "y"
        case .boolean: return "b"
        case .int16: return "n"
        case .uint16: return "q"
        case .int32: return "i"
        case .uint32: return "u"
        case .int64: return "x"
        case .uint64: return "t"
        case .double: return "d"
        case .string: return "s"
        case .objectPath: return "o"
        case .signature: return "g"
        case .unixFD: return "h"
        case .array(let element, _): return "a" + element
        case .dictionary(let key, let value, _): return "a{" + key + value + "}"
        case .structure(let fields): return "(" + fields.map(\.signature).joined() + ")"
        case .variant: return "v"
        }
    }

    // MARK: Builders

    /// An array of bytes (`ay`).
    public static func bytes(_ bytes: [UInt8]) -> DBusValue { .array(elementSignature: "y", bytes.map { .byte($0) }) }

    /// An array of strings (`as`).
    public static func strings(_ strings: [String]) -> DBusValue { .array(elementSignature: "s", strings.map { .string($0) }) }

    /// A property dictionary (`a{sv}`), each value wrapped in a variant.
    public static func properties(_ properties: [(String, DBusValue)]) -> DBusValue {
        .dictionary(keySignature: "s", valueSignature: "v",
                    properties.map { DBusDictionaryEntry(key: .string($0.0), value: .variant($0.1)) })
    }

    // MARK: Accessors (nil when the value has another type)

    /// The value inside a variant (or the value itself when it is not one).
    public var unwrapped: DBusValue {
        if case .variant(let inner) = self { return inner.unwrapped }
        return self
    }

    /// A string, object path or signature.
    public var string: String? {
        switch unwrapped {
        case .string(let s), .objectPath(let s), .signature(let s): return s
        default: return nil
        }
    }

    /// A boolean.
    public var bool: Bool? {
        if case .boolean(let b) = unwrapped { return b }
        return nil
    }

    /// The bytes of an `ay`.
    public var byteArray: [UInt8]? {
        guard case .array("y", let elements) = unwrapped else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(elements.count)
        for element in elements {
            guard case .byte(let b) = element else { return nil }
            bytes.append(b)
        }
        return bytes
    }

    /// The strings of an `as` (or `ao`).
    public var stringArray: [String]? {
        guard case .array(_, let elements) = unwrapped else { return nil }
        let strings = elements.compactMap(\.string)
        return strings.count == elements.count ? strings : nil
    }

    /// The entries of a dictionary.
    public var entries: [DBusDictionaryEntry]? {
        if case .dictionary(_, _, let entries) = unwrapped { return entries }
        return nil
    }

    /// A dictionary with string keys (`a{s*}`) as a Swift dictionary; later duplicates win.
    public var stringKeyedDictionary: [String: DBusValue]? {
        guard let entries else { return nil }
        var result: [String: DBusValue] = [:]
        for entry in entries {
            guard let key = entry.key.string else { return nil }
            result[key] = entry.value
        }
        return result
    }
}

/// One entry of a D-Bus dictionary.
public struct DBusDictionaryEntry: Hashable, Sendable {
    /// The key (a basic type).
    public var key: DBusValue
    /// The value.
    public var value: DBusValue

    /// Creates an entry.
    public init(key: DBusValue, value: DBusValue) {
        self.key = key
        self.value = value
    }
}
