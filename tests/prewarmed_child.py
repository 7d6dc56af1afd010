"""A child for tests/test_prewarmed.py, run as `python -m tests.prewarmed_child ARG...` by the
prewarmed server: prints what it sees (pid, session, working directory, environment, arguments),
then exits with ARG (a number), raises (`raise`), waits to be signalled (`wait`) or counts the
modules a first optimizer step imports and exits 0 (`optimizer`)."""

import gc
import os
import sys
import threading

print(f"pid={os.getpid()}", flush=True)
print(f"ppid={os.getppid()}\npgid={os.getpgid(0)}\nsid={os.getsid(0)}\ncwd={os.getcwd()}")
print(f"probe={os.environ.get('PREWARMED_PROBE', '')}\nargv={sys.argv[1:]!r}\nname={__name__}")
print(f"torch_preloaded={'torch' in sys.modules}", flush=True)
print(f"gc_enabled={gc.isenabled()}\ngc_frozen={gc.get_freeze_count()}", flush=True)
if sys.argv[1] == "optimizer":  # what a first optimizer step still has to import (torch._dynamo, sympy: preloaded)
    import torch

    weight = torch.nn.Parameter(torch.ones(4))
    weight.grad = torch.ones(4)
    before = set(sys.modules)
    torch.optim.AdamW([weight]).step()
    print(f"optimizer_imports={len(set(sys.modules) - before)}", flush=True)
    sys.argv[1] = "0"
print("stderr=to stderr", file=sys.stderr, flush=True)
if sys.argv[1] == "wait":
    threading.Event().wait()
if sys.argv[1] == "raise":
    raise RuntimeError("asked to raise")
sys.exit(int(sys.argv[1]))
