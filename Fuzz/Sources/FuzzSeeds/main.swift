import FuzzDriver
import Foundation
import ThaliFuzzHarnesses

// Writes every harness's seeds into `<corpus>/<name>/seed-<n>` (argument: the corpus folder), and
// replaces seeds that changed. Built in the fuzz package, so it links libFuzzer too and needs its symbol.

@_cdecl("LLVMFuzzerTestOneInput")
public func testOneInput(_ data: UnsafePointer<UInt8>?, _ count: Int) -> CInt { 0 }

@_cdecl("FuzzSeeds_main")
public func main(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    let arguments = CommandLine.arguments
    guard arguments.count == 2 else {
        FileHandle.standardError.write(Data("usage: FuzzSeeds CORPUS-DIRECTORY\n".utf8))
        return 2
    }
    for harness in FuzzHarnesses.all {
        let directory = arguments[1] + "/" + harness.name
        try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let seeds = harness.seeds()
        for (index, seed) in seeds.enumerated() {
            _ = FileManager.default.createFile(atPath: directory + "/seed-\(index)", contents: Data(seed))
        }
        print("\(harness.name): \(seeds.count) seeds")
    }
    return 0
}
