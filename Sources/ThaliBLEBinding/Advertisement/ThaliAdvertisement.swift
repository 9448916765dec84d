import ThaliMutants

/// What a Thali peer says about itself in a BLE advertisement: either "connect to me over Bluetooth at
/// this address" or "I am an iOS device" (reachable another way).
///
/// Encoded by this suite as Flags + Service Data (128-bit UUID, AD type 0x21) of the Thali service UUID
/// with the value `00 ‖ BD_ADDR` or `01`: 3 + 25 = 28 octets, which fits the 31-octet legacy payload
/// (the seed's layout with a separate UUID list needs 32). Decoding also accepts the two forms deployed
/// Android Thali sent; see `spec/ble-binding.md`.
public struct ThaliAdvertisement: Hashable, Sendable {
    /// The peer's claim.
    public enum Payload: Hashable, Sendable {
        /// Reachable over Bluetooth (RFCOMM) at this address.
        case bluetoothAddress(BluetoothAddress)
        /// An iOS device; it has no Bluetooth address to offer.
        case iOSDevice
    }

    /// Where in the advertisement the claim was found.
    public enum Encoding: Hashable, Sendable {
        /// Service data of the Thali service UUID (this suite's form, and deployed Android's later form).
        case serviceData
        /// Manufacturer data of company `ThaliAdvertisement.androidCompanyIdentifier` (deployed Android's
        /// iBeacon-like form).
        case manufacturerData
    }

    /// The peer's claim.
    public var payload: Payload
    /// The octet in front of the address. This suite always writes 0 (the seed's `BluetoothFlag`);
    /// deployed Android Thali put a generation counter there that changed with every beacon change, so
    /// a new value means "fetch the beacons again".
    public var generation: UInt8
    /// Where the claim was found.
    public var encoding: Encoding

    /// Creates an advertisement in this suite's own form.
    public init(payload: Payload) {
        self.payload = payload
        self.generation = 0
        self.encoding = .serviceData
    }

    /// Creates an advertisement with every field given (what the decoder produces).
    public init(payload: Payload, generation: UInt8, encoding: Encoding) {
        self.payload = payload
        self.generation = generation
        self.encoding = encoding
    }

    /// The Bluetooth address the peer can be reached at, if any.
    public var bluetoothAddress: BluetoothAddress? {
        if case .bluetoothAddress(let address) = payload { return address }
        return nil
    }

    // MARK: Constants

    /// The Thali BLE service UUID `b6a44ad1-d319-4b3a-815d-8b805a47fb51`, big-endian (as written).
    public static let serviceUUID: [UInt8] = [
        0xB6, 0xA4, 0x4A, 0xD1, 0xD3, 0x19, 0x4B, 0x3A, 0x81, 0x5D, 0x8B, 0x80, 0x5A, 0x47, 0xFB, 0x51,
    ]
    /// The Thali BLE service UUID as text, lower case, as BlueZ reports it in `ServiceData` keys.
    public static let serviceUUIDString = "b6a44ad1-d319-4b3a-815d-8b805a47fb51"
    /// The company identifier deployed Android Thali used for its manufacturer-data form.
    public static let androidCompanyIdentifier: UInt16 = 7413
    /// The Flags value this suite puts into its payload: LE General Discoverable, BR/EDR not supported.
    /// (BlueZ sets Flags itself when it advertises; the codec needs one for a complete payload.)
    public static let defaultFlags: UInt8 = 0x06

    /// The service-data flag octet for "a Bluetooth address follows".
    static let bluetoothAddressFlag: UInt8 = 0
    /// The service-data flag octet for "an iOS device".
    static let iOSDeviceFlag: UInt8 = 1
    /// The `02 15` prefix of the manufacturer-data form (iBeacon's length/type octets, copied by Android Thali).
    static let manufacturerPrefix: [UInt8] = [0x02, 0x15]
    /// Length of the manufacturer-data form: prefix 2 + UUID 16 + generation 1 + address 6.
    static let manufacturerDataLength = 25

    // MARK: Encoding

    /// The service-data value of this advertisement (what goes after the UUID): `00 ‖ BD_ADDR` or `01`.
    public var serviceDataValue: [UInt8] {
        switch payload {
        case .bluetoothAddress(let address): return [Self.bluetoothAddressFlag] + address.octets
        case .iOSDevice: return [Self.iOSDeviceFlag]
        }
    }

    /// The full advertising payload in this suite's form: Flags, then Service Data (128-bit UUID).
    /// 28 octets for a Bluetooth address, 22 for an iOS device.
    public func advertisingData(flags: UInt8 = ThaliAdvertisement.defaultFlags) -> [UInt8] {
        AdvertisingData.serialize([
            ADStructure(type: ADStructure.flagsType, data: [flags]),
            ADStructure(type: ADStructure.serviceData128Type, data: Self.serviceUUID.reversed() + serviceDataValue),
        ])
    }

    // MARK: Decoding

    /// Finds and decodes the Thali claim in a complete advertising payload: service data (AD type 0x21)
    /// of the Thali UUID, else manufacturer data of company 7413. Other structures are ignored; a
    /// malformed payload or a malformed Thali structure is an error.
    public static func decode(advertisingData bytes: some Collection<UInt8>,
                              maximumLength: Int = AdvertisingData.legacyMaximumLength)
        throws(AdvertisingDataError) -> ThaliAdvertisement
    {
        let structures = try AdvertisingData.parse(bytes, maximumLength: maximumLength)
        let uuidLE = Array(serviceUUID.reversed())
        let ours = structures.filter { $0.type == ADStructure.serviceData128Type && $0.data.starts(with: uuidLE) }
        guard ours.count <= 1 else { throw AdvertisingDataError(.duplicateStructure(type: ADStructure.serviceData128Type)) }
        if let serviceData = ours.first {
            return try decode(serviceData: serviceData.data.dropFirst(16))
        }
        let companyLE: [UInt8] = [UInt8(androidCompanyIdentifier & 0xFF), UInt8(androidCompanyIdentifier >> 8)]
        let manufacturer = structures.filter { $0.type == ADStructure.manufacturerDataType && $0.data.starts(with: companyLE) }
        guard manufacturer.count <= 1 else { throw AdvertisingDataError(.duplicateStructure(type: ADStructure.manufacturerDataType)) }
        if let data = manufacturer.first, !Mutant.advdataIgnoresManufacturerData.isActive {
            return try decode(manufacturerData: data.data.dropFirst(2))
        }
        throw AdvertisingDataError(.notThali)
    }

    /// Decodes the value of Thali service data (the octets after the UUID; BlueZ's `ServiceData[uuid]`):
    /// `01` is an iOS device; seven octets are `flag-or-generation ‖ BD_ADDR`.
    public static func decode(serviceData value: some Collection<UInt8>) throws(AdvertisingDataError) -> ThaliAdvertisement {
        let value = Array(value)
        switch value.count {
        case 1:
            guard value[0] == iOSDeviceFlag else { throw AdvertisingDataError(.unknownServiceDataFlag(value[0])) }
            return ThaliAdvertisement(payload: .iOSDevice, generation: 0, encoding: .serviceData)
        case 1 + BluetoothAddress.octetCount:
            // Our flag 0, or Android's generation counter: both are followed by the address.
            guard let address = BluetoothAddress(octets: value[1...]) else {
                throw AdvertisingDataError(.badServiceDataLength(value.count))
            }
            return ThaliAdvertisement(payload: .bluetoothAddress(address), generation: value[0], encoding: .serviceData)
        default:
            throw AdvertisingDataError(.badServiceDataLength(value.count))
        }
    }

    /// Decodes deployed Android Thali's manufacturer data (the octets after the company identifier;
    /// BlueZ's `ManufacturerData[7413]`): `02 15 ‖ UUID(16, big-endian) ‖ generation ‖ BD_ADDR`.
    public static func decode(manufacturerData value: some Collection<UInt8>) throws(AdvertisingDataError) -> ThaliAdvertisement {
        let value = Array(value)
        guard value.count == manufacturerDataLength else {
            throw AdvertisingDataError(.badManufacturerData("length \(value.count), expected \(manufacturerDataLength)"))
        }
        guard value.starts(with: manufacturerPrefix) else {
            throw AdvertisingDataError(.badManufacturerData("prefix is not 02 15"))
        }
        guard Array(value[2..<18]) == serviceUUID else {
            throw AdvertisingDataError(.badManufacturerData("UUID is not the Thali service UUID"))
        }
        guard let address = BluetoothAddress(octets: value[19...]) else {
            throw AdvertisingDataError(.badManufacturerData("address"))
        }
        return ThaliAdvertisement(payload: .bluetoothAddress(address), generation: value[18], encoding: .manufacturerData)
    }
}
