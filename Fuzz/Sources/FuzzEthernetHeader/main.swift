import FuzzDriver

// The `ethernet-header` harness under libFuzzer. SwiftPM links an executable's entry as `<Target>_main`.

private let harness = FuzzDriver.harness(named: "ethernet-header")

@_cdecl("LLVMFuzzerTestOneInput")
public func testOneInput(_ data: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    FuzzDriver.run(harness, data, count)
}

@_cdecl("FuzzEthernetHeader_main")
public func main(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    FuzzDriver.runDriver(argc, argv, testOneInput)
}
