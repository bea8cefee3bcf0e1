"""Print the load average and the CPU shares (user / nice / system / idle) since the last call.

usage: cpustat.py STATEFILE LABEL   (the first call with a new STATEFILE prints only the load average)
"""

import json
import sys
import time
from pathlib import Path

state, label = Path(sys.argv[1]), sys.argv[2]
f = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
load = Path("/proc/loadavg").read_text().split()[:3]
msg = f"[{time.strftime('%H:%M:%S', time.gmtime())} UTC] {label}: load {' '.join(load)}"
if state.exists():
    old = json.loads(state.read_text())
    d = [a - b for a, b in zip(f, old, strict=False)]
    tot = sum(d[:8]) or 1
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    msg += "; CPU since last: " + " ".join(f"{n} {x / tot:.2f}" for n, x in zip(names, d, strict=False))
state.write_text(json.dumps(f))
print(msg, flush=True)
