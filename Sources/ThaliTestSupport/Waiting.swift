/// Waiting in tests for what announces itself by no event: the one place the tests poll, and the one
/// place they race a deadline. A test waits for the condition it needs (with a deadline that fails it),
/// never for a guessed time: a guessed time is too short on a loaded machine and too long everywhere else.

/// Checks `check` at once and then every `interval` until it gives a value, and returns that value; nil
/// when `timeout` passed first (after one last check). For state another thread or process updates that
/// no event announces: a store, a counter, a file, a child's output.
public func waitForValue<Value>(timeout: Duration, every interval: Duration = .milliseconds(20),
                                isolation: isolated (any Actor)? = #isolation,
                                _ check: () async throws -> Value?) async throws -> Value? {
    let clock = ContinuousClock()
    let deadline = clock.now + timeout
    while true {
        if let value = try await check() { return value }
        guard clock.now < deadline else { return nil }
        // The poll's interval: the one sleep behind every wait for a condition in the tests.
        try await Task.sleep(for: interval)
    }
}

/// Checks `condition` at once and then every `interval` until it holds; returns whether it held within
/// `timeout` (see ``waitForValue(timeout:every:isolation:_:)``).
public func waitUntil(timeout: Duration, every interval: Duration = .milliseconds(20),
                      isolation: isolated (any Actor)? = #isolation,
                      _ condition: () async throws -> Bool) async throws -> Bool {
    try await waitForValue(timeout: timeout, every: interval) { try await condition() ? true : nil } ?? false
}

/// Reads `read` every `quiet` until two reads in a row agree, and returns the last read and whether it
/// settled within `timeout`: for a test whose point is that something stops (a writer facing a reader
/// that does not read, a count of objects being freed), where "stopped" can only mean "did not change
/// for `quiet`".
public func waitUntilSettled<Value: Equatable>(quiet: Duration, timeout: Duration,
                                               isolation: isolated (any Actor)? = #isolation,
                                               _ read: () async throws -> Value) async throws -> (value: Value, settled: Bool) {
    var last: Value?  // none before the first read: the first check only records
    let settled = try await waitForValue(timeout: timeout, every: quiet) { () async throws -> Value? in
        let now = try await read()
        defer { last = now }
        return now == last ? now : nil
    }
    if let settled { return (settled, true) }
    if let last { return (last, false) }
    return (try await read(), false)  // not reached: the first check reads
}

/// `body`'s result, or nil when `timeout` passes first (`body` is then cancelled): how a test waits for
/// an event that may never come (an answer, the end of a stream) without hanging.
public func withTimeout<Value: Sendable>(_ timeout: Duration,
                                         _ body: @escaping @Sendable () async throws -> Value) async throws -> Value? {
    try await withThrowingTaskGroup(of: Value?.self) { group in
        group.addTask { try await body() }
        group.addTask {
            // The deadline itself: cancelled as soon as `body` ends.
            try await Task.sleep(for: timeout)
            return nil
        }
        defer { group.cancelAll() }
        return try await group.next() ?? nil
    }
}
