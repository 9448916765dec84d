import Foundation
import Testing
import ThaliBeacons
import ThaliSupport
import ThaliTestSupport
import ThaliSSDP

/// A deliberately broken `/NotificationBeacons` server: Python's own `http.server`, run as a separate
/// process, each mode breaking one rule. It prints `PORT <n> LISTENING` once it listens on an ephemeral port.
private let brokenServerScript = #"""
import os, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

mode = sys.argv[1]
body = bytes.fromhex(sys.argv[2]) if len(sys.argv) > 2 else b""
served = 0
served_lock = threading.Lock()

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def handle(self):
        if mode == "silent":      # accepts the connection, never answers
            time.sleep(3600)
            return
        super().handle()

    def do_POST(self):
        if mode == "lax":         # accepts any method
            self.do_GET()
        else:
            self.send_error(501)

    def do_GET(self):
        global served
        if self.path != "/NotificationBeacons" and mode != "lax":
            self.send_error(404)
            return
        with served_lock:
            served += 1
            count = served
        if mode == "crashes" and count > 3:
            os._exit(1)           # the whole server dies under load
        if mode == "throttles-429" and count > 3:
            self.send_response(429)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if mode.startswith("busy-") and count > 3:   # busy answers, each breaking one rule of their form
            retry_after = {"busy-http-date": "Fri, 27 Nov 2026 03:00:00 GMT", "busy-zero": "0", "busy-too-long": "3600",
                           "busy-fraction": "1.5"}.get(mode, "2")
            self.send_response(503)
            if mode != "busy-no-retry-after":
                self.send_header("Retry-After", retry_after)
            payload = body if mode == "busy-with-body" else b""
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        self.requests_here = getattr(self, "requests_here", 0) + 1
        if mode == "hangs-second" and self.requests_here == 2:
            time.sleep(3600)      # the second request on a persistent connection is never answered
            return
        self.send_response(200)
        if mode != "no-content-type":
            self.send_header("Content-Type", "text/plain" if mode == "wrong-content-type" else "application/octet-stream")
        if mode != "no-cache-control":
            self.send_header("Cache-Control", "no-cache")
        if mode == "endless":     # no length: the body runs until the client hangs up
            self.end_headers()
            chunk = b"\x00" * 65536
            try:
                while True:
                    self.wfile.write(chunk)
            except OSError:
                return
        if mode == "endless-head":  # header lines that never end
            self.flush_headers()
            try:
                while True:
                    self.wfile.write(b"X-Filler: " + b"a" * 1000 + b"\r\n")
            except OSError:
                return
        if mode == "declared-huge":
            self.send_header("Content-Length", "100000000")
            self.end_headers()
            return
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        # "truncated": half of the declared body, then the connection closes.
        self.wfile.write(body[: len(body) // 2] if mode == "truncated" else body)

if mode in ("http11", "hangs-second"):
    Handler.protocol_version = "HTTP/1.1"   # persistent connections
server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print("PORT", server.server_address[1], "LISTENING", flush=True)
server.serve_forever()
"""#

/// Starts the broken server in `mode` serving `body`; stops it when `body` returns.
public func withBrokenServer(_ mode: String, body stream: [UInt8] = [],
                             _ run: (BeaconLocation) async throws -> Void) async throws {
    let directory = FileManager.default.temporaryDirectory
        .appendingPathComponent("thali-conformance-\(getpid())-\(UInt32.random(in: 0...UInt32.max))")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }
    let script = directory.appendingPathComponent("broken_server.py")
    try brokenServerScript.write(to: script, atomically: true, encoding: .utf8)
    let hex = Hex.encode(stream)
    let process = try ChildProcess("/usr/bin/python3", ["-u", script.path, mode] + (hex.isEmpty ? [] : [hex]))
    // A throwaway server: nothing to shut down cleanly, so no grace period.
    defer { process.terminate(signal: SIGKILL) }
    // Wait for the line's last word, so that the port number has arrived in full.
    try await process.waitForOutput(containing: " LISTENING")
    let line = try #require(process.output.split(separator: "\n").first { $0.hasPrefix("PORT ") })
    let port = try #require(Int(line.split(separator: " ")[1]))
    try await run(BeaconLocation(host: "127.0.0.1", port: port))
}
