import NIOCore
import NIOPosix
import Testing
import ThaliTestSupport

/// The daemons the tests start (dbus-daemon, dbusmock, peers) must not inherit the test process's
/// descriptors: NIO opens sockets without close-on-exec, and a listening port or another child's output
/// pipe held by a long-lived daemon stays open after its owner closed it.
@Suite struct ChildProcessTests {
    @Test func aChildInheritsNoneOfOurSocketsOrPipes() async throws {
        let listener = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .bind(host: "127.0.0.1", port: 0).get()
        defer { listener.close(promise: nil) }
        let other = try ChildProcess("sleep", ["5"])  // its pipes are open in this process meanwhile
        defer { _ = other.terminate() }
        // The child lists its own descriptors: 0, 1 and 2, and the one `ls` opens to read the directory.
        let result = try ChildProcess.run("ls", ["/proc/self/fd"])
        #expect(result.status == 0, "\(result.output)")
        let descriptors = result.output.split(whereSeparator: \.isWhitespace).compactMap { Int($0) }
        #expect(descriptors.count == 4 && Set(descriptors).isSuperset(of: [0, 1, 2]), "the child holds \(descriptors)")
    }

    /// A child's output may still be in the pipe (or, here, still to be written by a grandchild holding it)
    /// when the child is reaped: `waitForExit` returns only once the output has been read to its end.
    @Test func waitForExitReturnsTheWholeOutput() async throws {
        let child = try ChildProcess("sh", ["-c", "(sleep 0.3; echo written-after-exit) & exit 3"])
        defer { _ = child.terminate() }
        let status = try await child.waitForExit()
        #expect(status == 3)
        #expect(child.output.contains("written-after-exit"), "output so far: \(child.output)")
    }
}
