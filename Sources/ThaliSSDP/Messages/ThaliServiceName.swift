import struct Foundation.UUID
import ThaliMutants

/// Thali's SSDP identifiers: the notification type and the two USN forms a Thali peer may send.
public enum ThaliServiceName {
    /// The `NT` (and `ST`) of every Thali announcement and search.
    public static let notificationType = "http://www.thaliproject.org/ssdp"

    /// A fresh `uuid:<UUID>` USN, as this implementation sends (one per beacon change).
    public static func makeUniqueServiceName() -> String {
        "uuid:" + (Mutant.ssdpUppercaseUSN.isActive ? UUID().uuidString : UUID().uuidString.lowercased())
    }

    /// Whether `usn` is a Thali USN: ours (`uuid:<UUID>`) or the deployed node-ssdp form
    /// (`data:<UUID>:<generation>`).
    public static func isThaliServiceName(_ usn: String) -> Bool {
        if usn.hasPrefix("uuid:") {
            return UUID(uuidString: String(usn.dropFirst(5))) != nil
        }
        if usn.hasPrefix("data:") {
            let parts = usn.dropFirst(5).split(separator: ":", omittingEmptySubsequences: false)
            return parts.count == 2 && UUID(uuidString: String(parts[0])) != nil
                && SSDPValue.decimal(parts[1], maxDigits: 18) != nil
        }
        return false
    }
}
