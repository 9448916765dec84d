import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// One process as `/proc/<pid>/stat` shows it: what the benchmarks and their tests read of the processes
/// they start (who is whose child, whether it ended, what CPU it used).
public struct ProcessStat: Sendable, Hashable {
    /// The command name (field 2, without its parentheses; it may hold spaces and parentheses itself).
    public var name: String
    /// The state letter (field 3): `R`, `S`, `Z` for a zombie, ...
    public var state: Character
    /// The parent's id (field 4).
    public var parent: pid_t
    /// User and system CPU of the process itself (fields 14 and 15), in clock ticks.
    public var ownTicks: UInt64
    /// User and system CPU of the children it reaped (fields 16 and 17), in clock ticks.
    public var reapedChildrenTicks: UInt64
    /// When the process started (field 22), in clock ticks after boot: with the id, it names the process
    /// even once the id is used again.
    public var startTime: UInt64

    /// Clock ticks per second, the unit of the CPU and start-time fields.
    public static var ticksPerSecond: Double { Double(sysconf(Int32(_SC_CLK_TCK))) }

    /// Parses the text of a `/proc/<pid>/stat` file; nil when it is not one.
    public init?(parsing text: String) {
        // The name is in parentheses and may hold spaces and ')': the fields start after the last ')'.
        guard let open = text.firstIndex(of: "("), let close = text.lastIndex(of: ")"), open < close else { return nil }
        let fields = text[text.index(after: close)...].split(separator: " ")
        // fields[0] is field 3 (the state), so field N is fields[N - 3].
        guard fields.count > 19, let state = fields[0].first, let parent = pid_t(fields[1]),
              let utime = UInt64(fields[11]), let stime = UInt64(fields[12]),
              let cutime = UInt64(fields[13]), let cstime = UInt64(fields[14]), let start = UInt64(fields[19]) else { return nil }
        self.name = String(text[text.index(after: open)..<close])
        self.state = state
        self.parent = parent
        self.ownTicks = utime &+ stime
        self.reapedChildrenTicks = cutime &+ cstime
        self.startTime = start
    }

    /// Process `pid` now, or nil when it is gone.
    public static func read(_ pid: pid_t) -> ProcessStat? {
        guard let data = FileManager.default.contents(atPath: "/proc/\(pid)/stat") else { return nil }
        return ProcessStat(parsing: String(decoding: data, as: UTF8.self))
    }
}

/// Every process in `/proc` at one moment, by id, and who descends from whom.
public struct ProcessTable: Sendable {
    /// The processes read, by id.
    public let processes: [pid_t: ProcessStat]

    /// Reads every process in `/proc` now (one that ends while it is read is left out).
    public init() {
        var processes: [pid_t: ProcessStat] = [:]
        for name in (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? [] {
            guard let pid = pid_t(name), let stat = ProcessStat.read(pid) else { continue }
            processes[pid] = stat
        }
        self.processes = processes
    }

    /// `roots` that are in the table, and all their descendants in it.
    public func tree(of roots: [pid_t]) -> [pid_t] {
        var children: [pid_t: [pid_t]] = [:]
        for (pid, stat) in processes { children[stat.parent, default: []].append(pid) }
        var found: [pid_t] = []
        var pending = roots.filter { processes[$0] != nil }
        var seen = Set<pid_t>()
        while let pid = pending.popLast() {
            guard seen.insert(pid).inserted else { continue }
            found.append(pid)
            pending.append(contentsOf: children[pid] ?? [])
        }
        return found
    }

    /// The descendants of `root`, without `root` itself (which need not be in the table).
    public func descendants(of root: pid_t) -> [pid_t] {
        let children = processes.filter { $0.value.parent == root }.map(\.key)
        return tree(of: children)
    }
}
