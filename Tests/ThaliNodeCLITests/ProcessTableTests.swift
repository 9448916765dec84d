import Foundation
import Testing
import ThaliProcess

#if canImport(Glibc)
import Glibc
#endif

/// `ProcessStat` and `ProcessTable`: what the benchmarks read of the processes they start.
@Suite("ProcessTable")
struct ProcessTableTests {
    @Test("a stat line whose name holds spaces and parentheses parses by the last ')'; a torn one is nil")
    func parsesAwkwardNames() throws {
        let fields = (3...52).map { $0 == 3 ? "S" : $0 == 4 ? "41" : $0 == 14 ? "7" : $0 == 15 ? "3" : $0 == 16 ? "20" : $0 == 17 ? "5" : $0 == 22 ? "123456" : "0" }
        let stat = try #require(ProcessStat(parsing: "4242 (a) b (c)) " + fields.joined(separator: " ") + "\n"))
        #expect(stat.name == "a) b (c)")
        #expect(stat.state == "S")
        #expect(stat.parent == 41)
        #expect(stat.ownTicks == 10)
        #expect(stat.reapedChildrenTicks == 25)
        #expect(stat.startTime == 123456)
        #expect(ProcessStat(parsing: "4242 (torn) S 41 0") == nil)
        #expect(ProcessStat(parsing: "no parentheses at all") == nil)
    }

    @Test("a child started here is in this process's descendants, named and parented, until it is reaped")
    func findsAChild() throws {
        let child = Process()
        child.executableURL = URL(fileURLWithPath: "/bin/sleep")
        child.arguments = ["30"]
        try child.run()
        defer {
            kill(child.processIdentifier, SIGKILL)
            child.waitUntilExit()
        }
        let pid = child.processIdentifier
        let table = ProcessTable()
        #expect(table.descendants(of: getpid()).contains(pid))
        #expect(table.tree(of: [pid]) == [pid])
        let stat = try #require(table.processes[pid])
        #expect(stat.parent == getpid())
        #expect(stat.name == "sleep")
    }
}
