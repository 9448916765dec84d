import Foundation

/// Sizes and waits in words, as refusals and deferrals print them ("50.0 MiB", "offered again in 30 s").
public enum ByteWords {
    /// `bytes` in binary units with one decimal ("19 bytes", "1.0 KiB", "50.0 MiB", "1.5 GiB").
    public static func size(_ bytes: UInt64) -> String {
        if bytes == 1 { return "1 byte" }
        if bytes < 1024 { return "\(bytes) bytes" }
        var value = Double(bytes) / 1024
        for unit in ["KiB", "MiB", "GiB", "TiB"] {
            if value < 1024 || unit == "TiB" { return String(format: "%.1f %@", value, unit) }
            value /= 1024
        }
        return "\(bytes) bytes"
    }

    /// A wait rounded for people: "0.5 s", "30 s", "2 min", "1 min 30 s", "2 h 5 min".
    public static func duration(_ duration: Duration) -> String {
        let seconds = max(0, duration.timeInterval)
        if seconds < 10 { return String(format: "%.1f s", seconds) }
        let whole = Int(seconds.rounded())
        if whole < 60 { return "\(whole) s" }
        if whole < 3600 {
            let (minutes, rest) = whole.quotientAndRemainder(dividingBy: 60)
            return rest == 0 ? "\(minutes) min" : "\(minutes) min \(rest) s"
        }
        let (hours, rest) = whole.quotientAndRemainder(dividingBy: 3600)
        return rest / 60 == 0 ? "\(hours) h" : "\(hours) h \(rest / 60) min"
    }
}
