#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A source address as the kernel filter compares it: the 4 bytes of an IPv4 address (an IPv4-mapped
/// IPv6 address such as `::ffff:10.0.0.1`, the form a dual-stack listener reports an IPv4 peer in,
/// counts as IPv4, because its packets are IPv4) or the 16 bytes of an IPv6 one, as big-endian words.
public enum FilteredAddress: Sendable, Hashable {
    /// An IPv4 address, as the big-endian word of its 4 bytes.
    case v4(UInt32)
    /// An IPv6 address, as the big-endian words of its 16 bytes.
    case v6(UInt32, UInt32, UInt32, UInt32)

    /// The address in `text` (dotted IPv4 or IPv6 text, as `SocketAddress.ipAddress` gives it), or nil
    /// when it is neither (a Unix socket's "?").
    public init?(_ text: String) {
        if !text.contains(":") {
            var address = in_addr()
            guard inet_pton(AF_INET, text, &address) == 1 else { return nil }
            self = .v4(UInt32(bigEndian: address.s_addr))
            return
        }
        var address = in6_addr()
        guard inet_pton(AF_INET6, text, &address) == 1 else { return nil }
        let bytes = withUnsafeBytes(of: &address) { Array($0) }
        let words = (0..<4).map { index in
            bytes[(index * 4)..<(index * 4 + 4)].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        }
        if words[0] == 0, words[1] == 0, words[2] == 0x0000_FFFF {
            self = .v4(words[3])
        } else {
            self = .v6(words[0], words[1], words[2], words[3])
        }
    }
}

/// A classic BPF program for a listening socket that drops every segment from a list of sources and
/// keeps all others: instructions as data, a pure function of the list. Attached to a listening TCP
/// socket (Linux `SO_ATTACH_FILTER`), it runs in `tcp_v4_rcv`/`tcp_v6_rcv` on each segment for the
/// listener, so a refused source's SYN is dropped before a connection exists: no SYN-ACK, no accept,
/// no work in user space. It reads the source through the network-header ancillary offset
/// (`SKF_NET_OFF`): the IP version nibble, then the IPv4 source (at 12) or the IPv6 source (at 8).
///
/// Each IPv4 source takes 2 instructions and each IPv6 source 9; jumps are local, so the program stays
/// valid at any length the kernel accepts (``maximumInstructions``).
public struct SourceFilterProgram: Sendable, Hashable {
    /// One classic BPF instruction, laid out as the kernel's `struct sock_filter`.
    public struct Instruction: Sendable, Hashable {
        /// Operation code (class, size, mode or operation, source).
        public var code: UInt16
        /// Jump offset when a comparison holds.
        public var jumpIfTrue: UInt8
        /// Jump offset when it does not.
        public var jumpIfFalse: UInt8
        /// The constant operand.
        public var constant: UInt32

        /// An instruction.
        public init(code: UInt16, jumpIfTrue: UInt8 = 0, jumpIfFalse: UInt8 = 0, constant: UInt32) {
            self.code = code
            self.jumpIfTrue = jumpIfTrue
            self.jumpIfFalse = jumpIfFalse
            self.constant = constant
        }
    }

    /// Operation codes used here (linux/bpf_common.h).
    public enum Code {
        /// `BPF_LD | BPF_B | BPF_ABS`: A = the byte at the constant offset.
        public static let loadByte: UInt16 = 0x30
        /// `BPF_LD | BPF_W | BPF_ABS`: A = the big-endian word at the constant offset.
        public static let loadWord: UInt16 = 0x20
        /// `BPF_ALU | BPF_RSH | BPF_K`: A >>= constant.
        public static let shiftRight: UInt16 = 0x74
        /// `BPF_JMP | BPF_JEQ | BPF_K`: jump by `jumpIfTrue` when A == constant, else by `jumpIfFalse`.
        public static let jumpIfEqual: UInt16 = 0x15
        /// `BPF_JMP | BPF_JA`: jump by the constant.
        public static let jump: UInt16 = 0x05
        /// `BPF_RET | BPF_K`: accept this many bytes of the packet (0: drop it).
        public static let returnConstant: UInt16 = 0x06
    }

    /// The kernel's ancillary offset of the network header (`SKF_NET_OFF`, -0x100000), as the unsigned
    /// constant of a load.
    public static let networkHeaderOffset = UInt32(bitPattern: -0x10_0000)
    /// What the program returns to keep a segment: all of it. (A smaller number would trim the segment's
    /// payload to it: TCP caps the trim at the header, so a large loopback segment would lose data.)
    public static let keep = UInt32.max
    /// What it returns to drop a segment.
    public static let drop: UInt32 = 0
    /// The longest program the kernel accepts (`BPF_MAXINSNS`).
    public static let maximumInstructions = 4096
    /// Instructions one refused IPv4 source takes.
    public static let instructionsPerIPv4Source = 2
    /// Instructions one refused IPv6 source takes.
    public static let instructionsPerIPv6Source = 9
    /// Sources a program can hold whatever their family (IPv6 at 9 instructions each, within
    /// ``maximumInstructions`` with the program's fixed part).
    public static let maximumSources = 448

    /// The program, in order.
    public let instructions: [Instruction]

    /// A program dropping segments from `sources` (duplicates count once) and keeping every other.
    /// Traps when given more than ``maximumSources`` (the owner bounds the list:
    /// ``AdmissionLimits/maxFilteredSources``).
    public init(refusing sources: [FilteredAddress]) {
        precondition(sources.count <= Self.maximumSources, "at most \(Self.maximumSources) sources fit in one program")
        var seen = Set<FilteredAddress>()
        var v4: [UInt32] = []
        var v6: [(UInt32, UInt32, UInt32, UInt32)] = []
        for source in sources where seen.insert(source).inserted {
            switch source {
            case .v4(let word): v4.append(word)
            case .v6(let a, let b, let c, let d): v6.append((a, b, c, d))
            }
        }
        typealias I = Instruction
        let net = Self.networkHeaderOffset
        var program: [Instruction] = [
            I(code: Code.loadByte, constant: net),
            I(code: Code.shiftRight, constant: 4),
            // IPv6 jumps over the IPv4 block (its length does not fit a conditional jump's 8 bits).
            I(code: Code.jumpIfEqual, jumpIfTrue: 0, jumpIfFalse: 1, constant: 6),
            I(code: Code.jump, constant: UInt32(1 + v4.count * Self.instructionsPerIPv4Source + 1)),
            I(code: Code.loadWord, constant: net &+ 12),
        ]
        for word in v4 {
            program += [
                I(code: Code.jumpIfEqual, jumpIfTrue: 0, jumpIfFalse: 1, constant: word),
                I(code: Code.returnConstant, constant: Self.drop),
            ]
        }
        program.append(I(code: Code.returnConstant, constant: Self.keep))
        for (a, b, c, d) in v6 {
            // Each word that differs jumps to the next source's block.
            program += [
                I(code: Code.loadWord, constant: net &+ 8), I(code: Code.jumpIfEqual, jumpIfFalse: 7, constant: a),
                I(code: Code.loadWord, constant: net &+ 12), I(code: Code.jumpIfEqual, jumpIfFalse: 5, constant: b),
                I(code: Code.loadWord, constant: net &+ 16), I(code: Code.jumpIfEqual, jumpIfFalse: 3, constant: c),
                I(code: Code.loadWord, constant: net &+ 20), I(code: Code.jumpIfEqual, jumpIfFalse: 1, constant: d),
                I(code: Code.returnConstant, constant: Self.drop),
            ]
        }
        program.append(I(code: Code.returnConstant, constant: Self.keep))
        instructions = program
    }
}
