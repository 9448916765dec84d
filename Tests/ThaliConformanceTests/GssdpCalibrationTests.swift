import Foundation
import Testing
@testable import ThaliConformance
import ThaliSSDP
import ThaliTestSupport

/// Target mode's SSDP grading against GNOME's gssdp (`gssdp-discover`, Debian gupnp-tools), an SSDP
/// implementation independent of ours and not a Thali peer: it searches, and fetches nothing. gssdp speaks
/// only on port 1900, so the run is in a network namespace of its own.
@Suite(.enabled(if: TestEnvironment.available(TestEnvironment.canUseNetworkNamespaces && ChildProcess.which("gssdp-discover") != nil
                                                && PackagePaths.thaliNode() != nil)))
struct GssdpCalibrationTests {
    @Test("gssdp-discover's M-SEARCH passes search-form; it fetches no beacons, so valid-fetched FAILs and the rest is INCONCLUSIVE")
    func gssdpSearchGraded() async throws {
        let namespace = try NetworkNamespace("thali-conf-gssdp-\(getpid())")
        let directory = try PeerModeTests.scratchDirectory("gssdp")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let target = try namespace.spawn(try #require(PackagePaths.thaliNode()), [
            "conformance", "target", "--address", "127.0.0.1", "--ssdp-port", "1900", "--search-wait-s", "10", "--observe-s", "1",
            "--json-out", directory + "/target.json",
        ])
        defer { _ = target.terminate() }
        try await target.waitForOutput(containing: "start it now", timeout: .seconds(20))
        let gssdp = try namespace.spawn("gssdp-discover", ["-i", "lo", "-t", ThaliServiceName.notificationType, "-n", "3"])
        defer { _ = gssdp.terminate() }
        let (status, verdicts, output) = try await TargetModeTests.finish(target, directory: directory)
        #expect(status != 0, "valid-fetched is a MUST: \(output)")
        #expect(verdicts[TargetConformance.Cases.searchForm.id] == "PASS", "\(output)\n--- gssdp:\n\(gssdp.output)")
        #expect(verdicts[TargetConformance.Cases.validFetched.id] == "FAIL", "\(output)")
        for testCase in TargetConformance.Cases.scripted.dropFirst() {
            #expect(verdicts[testCase.id] == "INCONCLUSIVE", "\(testCase.id)\n\(output)")
        }
    }
}
