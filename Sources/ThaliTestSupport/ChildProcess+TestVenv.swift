import Foundation
@_exported import ThaliProcess

extension ChildProcess {
    /// The Python interpreter of the test venv prepared by `scripts/bootstrap.sh --test`
    /// (`THALI_TEST_VENV`, else `.venv-test` in the package root), if it exists.
    public static func testVenvPython(packageRoot: String) -> String? {
        let venv = ProcessInfo.processInfo.environment["THALI_TEST_VENV"] ?? "\(packageRoot)/.venv-test"
        let python = "\(venv)/bin/python"
        return FileManager.default.isExecutableFile(atPath: python) ? python : nil
    }
}
