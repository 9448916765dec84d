/// One AD structure of a BLE advertisement: `length ‖ type ‖ data`, where `length` counts type and data.
public struct ADStructure: Hashable, Sendable {
    /// The AD type (Bluetooth "Assigned Numbers", section "Common Data Types").
    public var type: UInt8
    /// The AD data (without the length and type octets).
    public var data: [UInt8]

    /// AD type Flags.
    public static let flagsType: UInt8 = 0x01
    /// AD type "Incomplete list of 128-bit service UUIDs" (the seed's `ServiceUUIDType`).
    public static let incompleteServiceUUIDs128Type: UInt8 = 0x06
    /// AD type "Complete list of 128-bit service UUIDs".
    public static let completeServiceUUIDs128Type: UInt8 = 0x07
    /// AD type "Service Data - 16-bit UUID" (the seed's `ServiceDataType`).
    public static let serviceData16Type: UInt8 = 0x16
    /// AD type "Service Data - 128-bit UUID" (what this suite advertises).
    public static let serviceData128Type: UInt8 = 0x21
    /// AD type "Manufacturer Specific Data" (company identifier, little-endian, then data).
    public static let manufacturerDataType: UInt8 = 0xFF

    /// Creates an AD structure.
    public init(type: UInt8, data: [UInt8]) {
        self.type = type
        self.data = data
    }

    /// The structure's size on the wire: length, type and data.
    public var encodedCount: Int { 2 + data.count }
}

/// Why a byte string is not a well-formed advertisement payload (or not a Thali one).
public struct AdvertisingDataError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What was wrong.
    public enum Reason: Hashable, Sendable {
        /// The payload is longer than the advertising PDU allows.
        case tooLong(length: Int, limit: Int)
        /// An AD structure's length octet reaches past the end of the payload.
        case truncatedStructure(declaredLength: Int, available: Int)
        /// After a zero length octet (the end of the significant part) a non-zero octet follows.
        case nonZeroPadding
        /// A structure with type Flags does not hold exactly one octet.
        case badFlagsLength(Int)
        /// Two structures of a type that may appear once (Flags, our service data) were found.
        case duplicateStructure(type: UInt8)
        /// A 128-bit service UUID list's length is not a multiple of 16.
        case badUUIDListLength(Int)
        /// No Thali service data or Thali manufacturer data in the payload.
        case notThali
        /// Thali service data of a length this suite does not know (expects 1 or 7 octets).
        case badServiceDataLength(Int)
        /// Thali service data that starts with an unknown flag octet.
        case unknownServiceDataFlag(UInt8)
        /// Thali manufacturer data whose length, `02 15` prefix or UUID is wrong.
        case badManufacturerData(String)
    }

    /// What was wrong.
    public let reason: Reason
    /// The offset in the payload where the problem was found (0 when it concerns the whole payload).
    public let offset: Int

    /// Creates an error.
    public init(_ reason: Reason, offset: Int = 0) {
        self.reason = reason
        self.offset = offset
    }

    public var description: String { "invalid advertising data at offset \(offset): \(reason)" }
}

/// Splitting and joining the AD structures of an advertising payload (AdvData / ScanRspData).
public enum AdvertisingData {
    /// The size of a legacy advertising payload (`ADV_IND` / `ADV_NONCONN_IND` AdvData).
    public static let legacyMaximumLength = 31
    /// The size of an extended advertising payload, the largest any controller sends in one PDU.
    public static let extendedMaximumLength = 251

    /// Parses a payload into its AD structures, strictly: every length must fit, a zero length octet ends
    /// the significant part and must be followed only by zeros, Flags must hold one octet and appear once.
    /// - Parameters:
    ///   - bytes: the AdvData payload as received.
    ///   - maximumLength: the longest payload accepted (31 for legacy advertising).
    public static func parse(_ bytes: some Collection<UInt8>, maximumLength: Int = legacyMaximumLength)
        throws(AdvertisingDataError) -> [ADStructure]
    {
        let bytes = Array(bytes)
        guard bytes.count <= maximumLength else {
            throw AdvertisingDataError(.tooLong(length: bytes.count, limit: maximumLength))
        }
        var structures: [ADStructure] = []
        var offset = 0
        var sawFlags = false
        while offset < bytes.count {
            let length = Int(bytes[offset])
            if length == 0 {
                // The rest is the non-significant part: zeros only.
                if let bad = bytes[offset...].firstIndex(where: { $0 != 0 }) {
                    throw AdvertisingDataError(.nonZeroPadding, offset: bad)
                }
                break
            }
            let available = bytes.count - offset - 1
            guard length <= available else {
                throw AdvertisingDataError(.truncatedStructure(declaredLength: length, available: available), offset: offset)
            }
            let type = bytes[offset + 1]
            let data = Array(bytes[(offset + 2)..<(offset + 1 + length)])
            if type == ADStructure.flagsType {
                guard data.count == 1 else { throw AdvertisingDataError(.badFlagsLength(data.count), offset: offset) }
                guard !sawFlags else { throw AdvertisingDataError(.duplicateStructure(type: type), offset: offset) }
                sawFlags = true
            }
            if type == ADStructure.incompleteServiceUUIDs128Type || type == ADStructure.completeServiceUUIDs128Type,
               data.count % 16 != 0
            {
                throw AdvertisingDataError(.badUUIDListLength(data.count), offset: offset)
            }
            structures.append(ADStructure(type: type, data: data))
            offset += 1 + length
        }
        return structures
    }

    /// Joins AD structures into a payload.
    public static func serialize(_ structures: [ADStructure]) -> [UInt8] {
        var bytes: [UInt8] = []
        for structure in structures {
            precondition(structure.data.count <= 254, "an AD structure holds at most 254 octets of data")
            bytes.append(UInt8(structure.data.count + 1))
            bytes.append(structure.type)
            bytes.append(contentsOf: structure.data)
        }
        return bytes
    }
}
