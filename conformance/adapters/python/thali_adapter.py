#!/usr/bin/env python3
"""Reference adapter for the Thali conformance suite (spec/conformance.md, "Adapter contract").

The suite runs this command with one of four verbs appended and reads its standard output. This one
drives `thali-node` as the implementation under test; for yours, change the four `# yours:` lines.

    --adapter "python3 thali_adapter.py --node /path/to/thali-node --home /path/to/data-dir"
"""
import json, signal, subprocess, sys

def main(argv):
    node, home, verb = "thali-node", None, argv[1:]
    while verb[:1] in (["--node"], ["--home"]):
        if verb[0] == "--node": node = verb[1]
        else: home = verb[1]
        verb = verb[2:]
    base = [node] + (["--home", home] if home else [])
    def run(*args):  # one call into the implementation; its failure is the verb's (non-zero exit)
        done = subprocess.run(base + list(args), capture_output=True, text=True)
        if done.returncode != 0: sys.exit(f"{' '.join(args)}: {done.stderr.strip()}")
        return done.stdout
    match verb:
        case ["contacts", "add", name, key]:  # add a contact; print anything, exit 0
            run("contacts", "add", name, key)  # yours: add `key` (compressed SEC1 hex) as `name`
        case ["send", name, text, "--json"]:  # queue a text; print {"id": UUID}
            item = json.loads(run("send", name, text, "--json"))  # yours: queue `text` for `name`
            print(json.dumps({"id": item["id"]}))
        case ["inbox", "--json"]:  # print every received item: id, from_public_key, kind, text
            items = json.loads(run("inbox", "--json"))  # yours: list what was received
            print(json.dumps([{k: item.get(k) for k in ("id", "from_public_key", "kind", "text")} for item in items]))
        case ["events"]:  # one JSON object per line, flushed, until SIGTERM
            follower = subprocess.Popen(base + ["events"], stdout=subprocess.PIPE, text=True)  # yours: subscribe
            signal.signal(signal.SIGTERM, lambda *_: (follower.terminate(), follower.wait(), sys.exit(0)))
            for line in follower.stdout:
                try: event = json.loads(line)
                except ValueError: continue
                if isinstance(event, dict) and isinstance(event.get("event"), str):
                    keep = ("event", "contact", "role", "clean", "location")  # the fields the suite reads
                    print(json.dumps({k: v for k, v in event.items() if k in keep}), flush=True)
        case _:
            sys.exit(f"unknown verb: {' '.join(verb)}")

if __name__ == "__main__":
    main(sys.argv)
