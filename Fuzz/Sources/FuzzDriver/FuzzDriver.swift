import ThaliFuzzHarnesses

/// libFuzzer's entry for programs that have their own `main`.
@_silgen_name("LLVMFuzzerRunDriver")
private func LLVMFuzzerRunDriver(
    _ argc: UnsafeMutablePointer<CInt>,
    _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
    _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt
) -> CInt

/// The bridge between libFuzzer and the harnesses.
public enum FuzzDriver {
    /// The harness called `name`; stops the program if there is none (a build mistake, not an input).
    public static func harness(named name: String) -> FuzzHarness {
        guard let harness = FuzzHarnesses.named(name) else { fatalError("no fuzz harness named \(name)") }
        return harness
    }

    /// Runs one input. A broken invariant stops the process, which libFuzzer reports as a finding with
    /// the input saved beside it.
    public static func run(_ harness: FuzzHarness, _ data: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
        do {
            try harness.run(UnsafeRawBufferPointer(start: data, count: data == nil ? 0 : count))
        } catch {
            fatalError("invariant broken: \(error)")
        }
        return 0
    }

    /// Hands the command line to libFuzzer.
    public static func runDriver(
        _ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?,
        _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt
    ) -> CInt {
        var count = argc
        var arguments = argv
        return LLVMFuzzerRunDriver(&count, &arguments, callback)
    }
}
