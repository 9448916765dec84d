// The helpers these tests share with the library's (TemporaryHome, TestPeople, BlueZMock, ...) live in
// ThaliTestSupport; re-exported here so that every file of this target sees them.
@_exported import ThaliTestSupport

/// The `thali-node` built beside this test bundle.
var thaliNodeExecutable: String { CommandLineTests.executable }
