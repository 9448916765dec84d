import Foundation

/// Waits in words, as deferrals print them ("offered again in 30 s"); sizes are ``ByteCount``'s.
public enum ByteWords {

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
