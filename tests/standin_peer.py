"""A stand-in for `swarmloco peer` that a launcher test starts through Swarm.start_peer(module=...):
it prints the line a peer prints at its first join, then exits with `--exit CODE` (after an error
line) or, with `--exit wait`, waits to be killed. Imports nothing heavy: it starts in a blink."""

import sys
import time

if __name__ == "__main__":
    print("peer standin | joined run test at round 0 (1 params, codec fp32)", flush=True)
    code = sys.argv[sys.argv.index("--exit") + 1]
    if code == "wait":
        time.sleep(120)
    print("swarmloco peer: stand-in failed on purpose", flush=True)
    sys.exit(int(code))
