import NIOConcurrencyHelpers
import NIOCore
import Testing
@testable import ThaliAdmission

/// The kernel filter's program as data: run by a small classic-BPF interpreter (the opcodes the program
/// uses) over IPv4 and IPv6 headers, and checked against the kernel's rules for a valid program.
@Suite("SourceFilterProgram")
struct SourceFilterProgramTests {
    /// What the program returns for a packet whose network header is `header`, as the kernel's
    /// interpreter would (a load outside the header returns 0, i.e. drops).
    private func run(_ program: SourceFilterProgram, header: [UInt8]) -> UInt32 {
        typealias Code = SourceFilterProgram.Code
        var accumulator: UInt32 = 0
        var index = 0
        func load(_ constant: UInt32, bytes: Int) -> UInt32? {
            let offset = Int(constant &- SourceFilterProgram.networkHeaderOffset)
            guard constant >= SourceFilterProgram.networkHeaderOffset, offset + bytes <= header.count else { return nil }
            return header[offset..<(offset + bytes)].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        }
        while index < program.instructions.count {
            let instruction = program.instructions[index]
            index += 1
            switch instruction.code {
            case Code.loadByte, Code.loadWord:
                guard let value = load(instruction.constant, bytes: instruction.code == Code.loadByte ? 1 : 4) else { return 0 }
                accumulator = value
            case Code.shiftRight:
                accumulator >>= instruction.constant
            case Code.jumpIfEqual:
                index += Int(accumulator == instruction.constant ? instruction.jumpIfTrue : instruction.jumpIfFalse)
            case Code.jump:
                index += Int(instruction.constant)
            case Code.returnConstant:
                return instruction.constant
            default:
                Issue.record("unexpected opcode \(instruction.code)")
                return 0
            }
        }
        Issue.record("ran off the end of the program")
        return 0
    }

    private func ipv4Header(from source: [UInt8]) -> [UInt8] {
        [0x45, 0, 0, 60, 0, 0, 0x40, 0, 64, 6, 0, 0] + source + [10, 0, 0, 1]
    }

    private func ipv6Header(from source: [UInt8]) -> [UInt8] {
        [0x60, 0, 0, 0, 0, 40, 6, 64] + source + Array(repeating: 0, count: 15) + [1]
    }

    private func address(_ text: String) throws -> FilteredAddress { try #require(FilteredAddress(text)) }

    @Test("addresses parse to the words the kernel compares; an IPv4-mapped IPv6 address is IPv4")
    func parsing() throws {
        #expect(FilteredAddress("10.0.0.10") == .v4(0x0A00_000A))
        #expect(FilteredAddress("::ffff:10.0.0.10") == .v4(0x0A00_000A))
        #expect(FilteredAddress("fe80::1:2") == .v6(0xFE80_0000, 0, 0, 0x0001_0002))
        #expect(FilteredAddress("::1") == .v6(0, 0, 0, 1))
        #expect(FilteredAddress("?") == nil)
        #expect(FilteredAddress("10.0.0") == nil)
        #expect(FilteredAddress("") == nil)
    }

    @Test("with no sources every packet is kept, whole")
    func emptyKeepsAll() {
        let program = SourceFilterProgram(refusing: [])
        #expect(run(program, header: ipv4Header(from: [10, 0, 0, 10])) == UInt32.max)
        #expect(run(program, header: ipv6Header(from: Array(repeating: 0xAB, count: 16))) == UInt32.max)
    }

    @Test("IPv4 sources in the list are dropped, all others kept, and IPv6 packets are not confused with them")
    func ipv4() throws {
        let program = SourceFilterProgram(refusing: [try address("10.0.0.10"), try address("::ffff:10.0.0.12"), try address("fd00::1")])
        #expect(run(program, header: ipv4Header(from: [10, 0, 0, 10])) == 0)
        #expect(run(program, header: ipv4Header(from: [10, 0, 0, 12])) == 0)
        #expect(run(program, header: ipv4Header(from: [10, 0, 0, 11])) == UInt32.max)
        #expect(run(program, header: ipv4Header(from: [11, 0, 0, 10])) == UInt32.max)
        // An IPv6 source whose bytes 4...7 are 10.0.0.10 (where an IPv4 source would be) is kept.
        #expect(run(program, header: ipv6Header(from: [0xfd, 0, 0, 0, 10, 0, 0, 10] + Array(repeating: 0, count: 8))) == UInt32.max)
    }

    @Test("IPv6 sources are dropped only when all 16 bytes match")
    func ipv6() throws {
        let refused: [UInt8] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]
        let program = SourceFilterProgram(refusing: [try address("fd00::2"), try address("fd00::1"), try address("10.0.0.10")])
        #expect(run(program, header: ipv6Header(from: refused)) == 0)
        #expect(run(program, header: ipv6Header(from: Array(refused.dropLast()) + [2])) == 0)
        for word in 0..<4 {
            var other = refused
            other[word * 4] ^= 0x80
            #expect(run(program, header: ipv6Header(from: other)) == UInt32.max, "word \(word) differs")
        }
        #expect(run(program, header: ipv4Header(from: [10, 0, 0, 11])) == UInt32.max)
    }

    @Test("programs stay within the kernel's rules at the largest size: every jump lands inside, the last instruction returns")
    func kernelRules() throws {
        let v6 = (0..<SourceFilterProgram.maximumSources).map { FilteredAddress.v6(0xFD00_0000, 0, UInt32($0), 1) }
        let v4 = (0..<SourceFilterProgram.maximumSources).map { FilteredAddress.v4(0x0A00_0000 + UInt32($0)) }
        for sources in [v6, v4, Array(v6.prefix(200) + v4.prefix(200)), []] {
            let program = SourceFilterProgram(refusing: sources)
            let count = program.instructions.count
            #expect(count <= SourceFilterProgram.maximumInstructions)
            #expect(program.instructions.last?.code == SourceFilterProgram.Code.returnConstant)
            for (index, instruction) in program.instructions.enumerated() {
                switch instruction.code {
                case SourceFilterProgram.Code.jumpIfEqual:
                    #expect(index + 1 + Int(max(instruction.jumpIfTrue, instruction.jumpIfFalse)) < count)
                case SourceFilterProgram.Code.jump:
                    #expect(index + 1 + Int(instruction.constant) < count)
                default:
                    break
                }
            }
        }
        // Every one of the largest IPv6 list is dropped; its neighbours are not.
        let program = SourceFilterProgram(refusing: v6)
        func bytes(_ words: [UInt32]) -> [UInt8] { words.flatMap { word in (0..<4).map { UInt8(truncatingIfNeeded: word >> (24 - 8 * $0)) } } }
        let last = UInt32(SourceFilterProgram.maximumSources - 1)
        #expect(run(program, header: ipv6Header(from: bytes([0xFD00_0000, 0, last, 1]))) == 0)
        #expect(run(program, header: ipv6Header(from: bytes([0xFD00_0000, 0, 0, 1]))) == 0)
        #expect(run(program, header: ipv6Header(from: bytes([0xFD00_0000, 0, last + 1, 1]))) == UInt32.max)
        #expect(run(program, header: ipv6Header(from: bytes([0xFD00_0000, 0, 3, 2]))) == UInt32.max)
    }

    @Test("duplicates count once; each source costs its documented instructions")
    func sizes() throws {
        let base = SourceFilterProgram(refusing: []).instructions.count
        let a = try address("10.0.0.10")
        let b = try address("fd00::1")
        #expect(SourceFilterProgram(refusing: [a, a, try address("::ffff:10.0.0.10")]).instructions.count
            == base + SourceFilterProgram.instructionsPerIPv4Source)
        #expect(SourceFilterProgram(refusing: [b, b]).instructions.count == base + SourceFilterProgram.instructionsPerIPv6Source)
    }

    @Test("the bound on kernel-filtered sources is checked with the other limits")
    func limitsChecked() {
        var limits = AdmissionLimits()
        #expect(limits.problem == nil)
        limits.maxFilteredSources = SourceFilterProgram.maximumSources + 1
        #expect(limits.problem?.contains("maxFilteredSources") == true)
        limits.maxFilteredSources = -1
        #expect(limits.problem?.contains("maxFilteredSources") == true)
        limits.maxFilteredSources = 0
        #expect(limits.problem == nil)
    }
}

/// What the gate reports to a kernel filter: the sources in a refusal period, and when that changes.
@Suite("AdmissionRefusedSources")
struct AdmissionRefusedSourcesTests {
    private let start = NIODeadline.uptimeNanoseconds(1_000_000_000_000)

    private var limits: AdmissionLimits {
        var limits = AdmissionLimits()
        limits.maxConnectionsPerSource = 2
        limits.sourceRefusalPeriod = .seconds(60)
        return limits
    }

    @Test("only sources refused for their rate are listed, until their refusal period ends, latest first")
    func refusedSources() {
        var limits = limits
        limits.maxUnauthenticatedPerSource = 1
        var gate = AdmissionGate<String>(limits: limits)
        for source in ["a", "b"] {
            for _ in 0..<2 {
                #expect(gate.admit(source, now: start) == .admitted)
                gate.closed(source, authenticated: false)
            }
        }
        #expect(gate.admit("a", now: start) == .refused(.sourceRate))
        #expect(gate.admit("b", now: start + .seconds(1)) == .refused(.sourceRate))
        // Holding its one unauthenticated connection: refused for that, which is no refusal period.
        #expect(gate.admit("c", now: start) == .admitted)
        #expect(gate.admit("c", now: start) == .refused(.sourceUnauthenticated))
        #expect(gate.refusedSources(at: start + .seconds(2)).map(\.source) == ["b", "a"])
        #expect(gate.refusedSources(at: start + .seconds(2)).first?.until == start + .seconds(61))
        #expect(gate.refusedSources(at: start + .seconds(60)).map(\.source) == ["b"])
        #expect(gate.refusedSources(at: start + .seconds(61)).isEmpty)
    }

    @Test("the controller tells its observers when a refusal period starts, not on every refused connection")
    func observers() {
        let controller = AdmissionController<String>(limits: limits)
        let calls = NIOLockedValueBox(0)
        let id = controller.addRefusedSourcesObserver { calls.withLockedValue { $0 += 1 } }
        let now = NIODeadline.now()
        for _ in 0..<2 {
            if case .success(let ticket) = controller.admit("a", now: now) { ticket.release() }
        }
        #expect(calls.withLockedValue { $0 } == 0)
        for _ in 0..<10 { _ = controller.admit("a", now: now) }
        #expect(calls.withLockedValue { $0 } == 1)
        #expect(controller.refusedSources(now: now).map(\.source) == ["a"])
        controller.removeRefusedSourcesObserver(id)
        for _ in 0..<3 { _ = controller.admit("b", now: now) }
        #expect(calls.withLockedValue { $0 } == 1)
    }
}
