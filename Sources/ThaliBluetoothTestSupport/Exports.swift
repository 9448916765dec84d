// A test target that imports the BlueZ mock gets the low-level helpers (processes, paths, environment) too.
@_exported import ThaliTestSupport
