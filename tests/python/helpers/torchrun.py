"""Runs a test script on 2 CPU ranks with torchrun (gloo), as a cluster launcher would, and reads
the JSON each rank wrote (OUT/rank-<r>.json): for the frameworks' DDP tests."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(tmp_path, script, *args, ranks=2, port_offset=0, timeout=300):
    """(the completed torchrun process, [each rank's dict, for the ranks that wrote one]);
    subprocess.TimeoutExpired after `timeout` seconds (a rank left waiting: a hang)."""
    out = tmp_path / "ranks"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
           "--master-port", str(29500 + port_offset + os.getpid() % 400),
           os.path.join(HERE, script), str(out), *map(str, args)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=HERE)
    found = [json.loads((out / f"rank-{r}.json").read_text())
             for r in range(ranks) if (out / f"rank-{r}.json").exists()]
    return done, found
