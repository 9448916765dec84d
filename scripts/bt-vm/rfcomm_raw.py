#!/usr/bin/python3
"""Raw RFCOMM throughput between two local adapters, for comparison with `thali-node bench ble --radio`:
a server on SERVER_ADDRESS, a client bound to CLIENT_ADDRESS, BYTES sent one way, then one JSON line.
The client writes CHUNK octets per send() (0: the whole payload in one blocking sendall()).
Usage: rfcomm_raw.py SERVER_ADDRESS CLIENT_ADDRESS BYTES [CHUNK] [CHANNEL]"""
import json
import socket
import sys
import threading
import time

server_address, client_address, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
chunk = int(sys.argv[4]) if len(sys.argv) > 4 else 0
channel = int(sys.argv[5]) if len(sys.argv) > 5 else 11

listener = socket.socket(socket.AF_BLUETOOTH, socket.SOCK_STREAM, socket.BTPROTO_RFCOMM)
listener.bind((server_address, channel))
listener.listen(1)
received = 0
done = threading.Event()


def serve():
    global received
    connection, _ = listener.accept()
    while received < total:
        data = connection.recv(65536)
        if not data:
            break
        received += len(data)
    done.set()
    connection.close()


threading.Thread(target=serve, daemon=True).start()
client = socket.socket(socket.AF_BLUETOOTH, socket.SOCK_STREAM, socket.BTPROTO_RFCOMM)
client.bind((client_address, 0))
started = time.monotonic()
client.connect((server_address, channel))
connected = time.monotonic()
payload = bytes(i & 0xFF for i in range(total))
step = chunk or total
for offset in range(0, total, step):
    client.sendall(payload[offset:offset + step])
done.wait(600)
finished = time.monotonic()
client.close()
print(json.dumps({"raw_chunk": chunk, "raw_rfcomm_connect_s": round(connected - started, 3), "raw_bytes": received,
                  "raw_s": round(finished - connected, 3),
                  "raw_kib_per_s": round(received / 1024 / max(finished - connected, 1e-9), 3)}, sort_keys=True))
sys.exit(0 if received == total else 1)
