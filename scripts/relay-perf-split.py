#!/usr/bin/env python3
"""Where each forwarder's CPU goes during `thali-node bench relay --peers` (issue 41's bulk arithmetic,
spec/node.md): kernel, AES-GCM/GHASH, memcpy/memmove and the rest, per path (both stunnels; ssh, sshd and
its sessions; both relaying nodes).

    scripts/relay-perf-split.py OUTDIR BINARY [bench relay --peers options...]

Runs `perf record -a -e cpu-clock -F 1999` (root) around one `BINARY bench relay --peers --json ...`, records
the bench's descendants, their threads and libcrypto's load address from /proc every 20 ms, then reads
`perf script -F tid,time,ip,sym,dso`. A sample is kernel (kernel address), cipher (in libcrypto's code that
uses AES-NI or carry-less multiply: Debian's libcrypto is stripped, so the AES and GHASH kernels are found by
their instructions with objdump, clusters of them less than 1 KiB apart widened by 256 bytes; on
`openssl speed -evp aes-256-gcm` 92-95 % of libcrypto's samples fall there, the rest being EVP calls),
copy (libc's memcpy/memmove) or rest. Only samples between the 0.1th and 99.9th percentile of a path's cipher
samples count (bytes flow then), which leaves its start-up out. Shares are of those samples; s/GB multiplies
them by the bench's own cpu_s_per_gb (/proc). Prints one line per path and writes OUTDIR/summary.json.
"""
import json, os, re, subprocess, sys, time, signal

out, binary, args = sys.argv[1], sys.argv[2], sys.argv[3:]
tag = os.path.basename(out.rstrip('/'))
os.makedirs(out, exist_ok=True)
LIBCRYPTO = '/lib/x86_64-linux-gnu/libcrypto.so.3'


def cipher_ranges():
    """libcrypto's code regions (file addresses) that use AES-NI or PCLMULQDQ."""
    GAP, MARGIN = 1024, 256
    pattern = re.compile(r'^\s*([0-9a-f]+):\s+(v?aes(enc|dec)(last)?|v?aeskeygenassist|v?aesimc|v?pclmul\w*|vpclmul\w*)\b')
    disassembly = subprocess.run(['objdump', '-d', '--no-show-raw-insn', os.path.realpath(LIBCRYPTO)],
                                 capture_output=True, text=True).stdout
    addresses = sorted(int(m.group(1), 16) for m in map(pattern.match, disassembly.splitlines()) if m)
    regions = []
    for a in addresses:
        if regions and a - regions[-1][1] < GAP: regions[-1][1] = a
        else: regions.append([a, a])
    return [(s - MARGIN, e + MARGIN) for s, e in regions]


FREQ = 1999
perf = subprocess.Popen(['perf', 'record', '-q', '-a', '-e', 'cpu-clock', '-F', str(FREQ), '-o', f'{out}/perf.data'],
                        stdout=subprocess.DEVNULL, stderr=open(f'{out}/perf.err', 'w'))
time.sleep(1.0)
load = open('/proc/loadavg').read().split()[:3]
start = time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())
bench = subprocess.Popen([binary, 'bench', 'relay', '--peers', '--json'] + args,
                         stdout=subprocess.PIPE, stderr=open(f'{out}/bench.err', 'w'))
procs = {}  # pid -> (ppid, comm)
tasks = {}  # tid -> pid
bases = {}  # pid -> libcrypto's load address
def snapshot():
    table = {}
    for name in os.listdir('/proc'):
        if not name.isdigit(): continue
        try:
            text = open(f'/proc/{name}/stat').read()
        except OSError:
            continue
        close = text.rindex(')')
        comm = text[text.index('(') + 1:close]
        fields = text[close + 2:].split()
        table[int(name)] = (int(fields[1]), comm)
    children = {}
    for pid, (ppid, _) in table.items(): children.setdefault(ppid, []).append(pid)
    pending = list(children.get(bench.pid, []))
    while pending:
        pid = pending.pop()
        if pid not in procs: procs[pid] = table[pid]
        if True:  # every look: a process that execs after its fork (sshd's session, `sshd -R`) maps it anew
            try:
                for line in open(f'/proc/{pid}/maps'):
                    part = line.split()
                    if len(part) >= 6 and part[5].endswith('/libcrypto.so.3') and part[2] == '00000000':
                        bases[pid] = int(part[0].split('-')[0], 16)
                        break
            except OSError:
                pass
        try:
            for tid in os.listdir(f'/proc/{pid}/task'): tasks[int(tid)] = pid
        except OSError:
            pass
        pending += children.get(pid, [])
while bench.poll() is None:
    snapshot()
    time.sleep(0.02)
result = json.loads(bench.stdout.read())
perf.send_signal(signal.SIGINT)
perf.wait()
end = time.strftime('%H:%M:%S', time.gmtime())
load_end = open('/proc/loadavg').read().split()[:3]
# Roles: each path's forwarding processes.
roles = {'stunnel': [], 'ssh': [], 'relay': []}
for pid, (ppid, comm) in procs.items():
    if comm.startswith('stunnel'): roles['stunnel'].append(pid)
    elif comm in ('ssh', 'sshd'): roles['ssh'].append(pid)          # ssh, sshd and its sessions
    elif comm == 'thali-node' and ppid == bench.pid: roles['relay'].append(pid)
R = cipher_ranges()
COPY = re.compile(r'^__(memmove|memcpy|mempcpy)\w*$|^(memmove|memcpy)$')
script = subprocess.run(['perf', 'script', '-i', f'{out}/perf.data', '-F', 'tid,time,ip,sym,dso'],
                        capture_output=True, text=True).stdout
role_of = {pid: role for role, pids in roles.items() for pid in pids}
samples = {role: [] for role in roles}   # (time, kind, label)
for line in script.splitlines():
    m = re.match(r'\s*(\d+)\s+([\d.]+):\s+([0-9a-f]+)\s+(.*)\s+\((.*)\)$', line)
    if not m: continue
    tid, t, ip, sym, dso = int(m.group(1)), float(m.group(2)), int(m.group(3), 16), m.group(4).strip(), m.group(5)
    pid = tasks.get(tid, tid)
    role = role_of.get(pid)
    if role is None: continue
    if dso == '[kernel.kallsyms]' or ip >= 0xffff800000000000: kind = 'kernel'
    elif dso.endswith('libcrypto.so.3') and pid in bases and any(a <= ip - bases[pid] <= b for a, b in R): kind = 'cipher'
    elif COPY.match(sym): kind = 'copy'
    else: kind = 'rest'
    samples[role].append((t, kind, f'{dso.split("/")[-1]} {sym}'))
split = {}
for role in roles:
    # The bulk window: from the 0.1th to the 99.9th percentile of the role's cipher samples (AES-GCM runs only
    # while bytes flow), so that the forwarders' start (a node's start-up, sshd's key exchange) is left out.
    times = sorted(t for t, kind, _ in samples[role] if kind == 'cipher')
    lo, hi = times[int(len(times) * 0.001)], times[int(len(times) * 0.999) - 1]
    inside = [(kind, label) for t, kind, label in samples[role] if lo <= t <= hi]
    kinds = {k: sum(1 for kind, _ in inside if kind == k) for k in ['kernel', 'cipher', 'copy', 'rest']}
    top = {}
    by_dso = {}
    for kind, label in inside:
        if kind == 'rest':
            top[label] = top.get(label, 0) + 1
            dso = label.split(' ')[0]
            by_dso[dso] = by_dso.get(dso, 0) + 1
    total = len(inside)
    path = result['paths'][role]
    split[role] = {'samples_all': len(samples[role]), 'samples': total, 'window_s': hi - lo, 'perf_cpu_s': total / FREQ,
                   'pids': len(roles[role]), 'bases': sum(1 for p in roles[role] if p in bases),
                   'cpu_s_per_gb': path['cpu_s_per_gb'], 'single_mb_s': path['single_mb_s'], 'parallel_mb_s': path['parallel_mb_s'],
                   'shares': {k: v / total for k, v in kinds.items()} if total else {},
                   'top_rest': sorted(top.items(), key=lambda x: -x[1])[:15],
                   'rest_by_dso': {d: n / total for d, n in sorted(by_dso.items(), key=lambda x: -x[1])}}
bulk_gb = (result['mib'] + result['parallel'] * result['parallel_mib']) * 2**20 / 1e9
summary = {'tag': tag, 'start': start, 'end': end, 'load_start': load, 'load_end': load_end, 'args': args,
           'bulk_gb': bulk_gb, 'split': split, 'bench': result}
json.dump(summary, open(f'{out}/summary.json', 'w'), indent=1)
for role, s in split.items():
    sh = s['shares']
    print(f"{tag} {role}: cpu/GB {s['cpu_s_per_gb']:.3f} (perf in window {s['perf_cpu_s']/bulk_gb:.3f}, all {s['samples_all']/FREQ/bulk_gb:.3f}, window {s['window_s']:.2f} s) one stream {s['single_mb_s']} MB/s, parallel {s['parallel_mb_s']} MB/s "
          + ' '.join(f"{k} {v*100:.1f}%" for k, v in sh.items()))
json.dump({str(k): v for k, v in procs.items()}, open(f'{out}/procs.json', 'w'))
os.remove(f'{out}/perf.data')  # large; the split is in summary.json
