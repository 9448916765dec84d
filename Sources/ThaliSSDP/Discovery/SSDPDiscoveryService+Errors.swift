#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

extension SSDPDiscoveryService {
    /// Errors raised by `start`.
    public enum StartError: Error, Hashable, Sendable {
        /// No interface carries `interfaceAddress`.
        case noInterface(address: String)
        /// `interfaceAddress` or `groupAddress` is not an IPv4 address of the right kind.
        case invalidAddress(String)
        /// `start` was called twice.
        case alreadyStarted
        /// The datagram channel does not expose socket options (not a POSIX socket).
        case socketOptionsUnavailable
        /// A timer or limit of the configuration is zero or negative where it must be positive.
        case invalidConfiguration(String)
    }

    /// Errors of ``move(to:port:)``.
    public enum MoveError: Error, Hashable, Sendable {
        /// The service serves its beacons itself (``SSDPDiscoveryConfiguration/BeaconServer/builtIn``),
        /// whose server stays on the old address: only an app serving them moves (it rebinds its port).
        case builtInServer
        /// The service is not running.
        case notRunning
    }

    /// RFC 1123 date for the DATE header.
    static func httpDate() -> String {
        var now = time(nil)
        var parts = tm()
        gmtime_r(&now, &parts)
        var buffer = [CChar](repeating: 0, count: 64)
        let length = strftime(&buffer, buffer.count, "%a, %d %b %Y %H:%M:%S GMT", &parts)
        return String(decoding: buffer.prefix(length).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
