// A test target that imports the peer's helpers gets the low-level ones (processes, paths, environment) too.
@_exported import ThaliTestSupport
