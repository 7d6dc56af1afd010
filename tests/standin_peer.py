"""A stand-in for `swarmloco peer` that a launcher test starts through Swarm.start_peer(module=...):
it prints the line a peer prints at its first join (then `--lines N` numbered lines), then exits
with `--exit CODE` (after an error line), with `--exit kill` SIGKILLs itself right after its last
line (as a fail point does) while a child it forked, holding the same output, prints one more line
a second after it has seen it die, or with `--exit wait` waits to be killed. Imports nothing heavy: it
starts in a blink."""

import os
import signal
import sys
import time

if __name__ == "__main__":
    print("peer standin | joined run test at round 0 (1 params, codec fp32)", flush=True)
    args = sys.argv[1:]
    for i in range(int(args[args.index("--lines") + 1]) if "--lines" in args else 0):
        print(f"line {i}")
    code = args[args.index("--exit") + 1]
    if code == "wait":
        time.sleep(120)
    if code == "kill":
        parent = os.getpid()
        if os.fork() == 0:  # the child: its line comes strictly after its parent's exit
            while os.getppid() == parent:
                time.sleep(0.01)
            time.sleep(1.0)  # well after anyone waiting on the exit alone has seen it
            print("standin: its child, after its exit", flush=True)
            os._exit(0)
        print("standin: killing this process (SIGKILL)", flush=True)
        os.kill(parent, signal.SIGKILL)
    print("swarmloco peer: stand-in failed on purpose", flush=True)
    sys.exit(int(code))
