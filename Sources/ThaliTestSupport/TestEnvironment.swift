import Foundation

/// What a test may assume about the machine it runs on.
public enum TestEnvironment {
    /// True when the run promises that every independent peer is installed (`scripts/test.sh` sets
    /// `THALI_REQUIRE_PEERS=1` after installing them; CI sets `CI`). Tests that need a peer use
    /// `available(_:)` so that under this promise a missing peer fails the test instead of skipping it.
    public static var peersRequired: Bool {
        let environment = ProcessInfo.processInfo.environment
        return environment["THALI_REQUIRE_PEERS"] == "1" || environment["CI"] == "true"
    }

    /// Whether a test that needs a peer should run: always when peers are required, otherwise only
    /// when `condition` (the peer is present) holds.
    public static func available(_ condition: @autoclosure () -> Bool) -> Bool {
        peersRequired || condition()
    }

    /// Whether this process may create network namespaces for multi-host tests (root, and `ip` present).
    public static var canUseNetworkNamespaces: Bool { geteuid() == 0 && ChildProcess.which("ip") != nil }
}
