#!/usr/bin/env python3
"""Where a pt2 package's peak differs from the eager step's (issue 26; docs/formats.md): one
training step of a torchvision DenseNet (cross-entropy, no optimizer) run eagerly and as its
package through Python's AOTInductor loader, each under torch.profiler's allocation events; prints
both peaks and, at each peak, the live tensors by size and the ops that made them, and the sizes
whose counts differ. The figures of docs/formats.md's "Keeps every tensor an op takes" came from
this (the 1.38% and the two convolution outputs of 1,048,576 and 524,288 bytes):

  python scripts/bench/pt2_peak_diff.py d121 --batch 8          # torchvision densenet121()
  python scripts/bench/pt2_peak_diff.py dn:32:2,2:64 --batch 8  # DenseNet(growth, blocks, init)

The package is exported to a temporary folder (export_pt2 without its memory check), or read from
--pkg. Minutes for DenseNet-121 on 2 cores.
"""
import argparse
import collections
import io
import os
import sys
import tempfile
import zipfile

import torch
import torch.nn.functional as F
from torch.profiler import profile, ProfilerActivity

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import autobatch_export as ab  # noqa


def make_model(spec):
    import torchvision
    if spec == "d121":
        return torchvision.models.densenet121(weights=None)
    # e.g. "dn:32:2,2:64"
    _, g, blocks, init = spec.split(":")
    return torchvision.models.DenseNet(growth_rate=int(g), block_config=tuple(int(b) for b in blocks.split(",")),
                                       num_init_features=int(init))


def trace(prof):
    """(time, delta, ptr, ctx) for every allocation event, ctx = names of enclosing ops."""
    out = []
    def walk(node, stack):
        if node.tag == torch._C._profiler._EventType.Allocation:
            ef = node.extra_fields
            if ef.device.type == "cpu":
                out.append((node.start_time_ns, ef.alloc_size, ef.ptr, tuple(stack)))
            return
        stack2 = stack + [node.name]
        for c in node.children:
            walk(c, stack2)
    for r in prof.profiler.kineto_results.experimental_event_tree():
        walk(r, [])
    out.sort(key=lambda e: e[0])
    return out


def live_at_peak(events, top=40, label=""):
    cur = peak = 0
    live = {}
    best = None
    for i, (t, d, ptr, ctx) in enumerate(events):
        cur += d
        if d > 0:
            live[ptr] = (d, ctx, i)
        else:
            live.pop(ptr, None)
        if cur > peak:
            peak = cur
            best = (i, dict(live))
    i, snap = best
    print(f"== {label}: peak {peak:,} at event {i}/{len(events)} ctx={events[i][3][-3:]}")
    return peak, snap, events[i]


def short(ctx):
    c = [n for n in ctx if not n.startswith("aten::empty") and n != "aten::as_strided"]
    return " > ".join(c[-3:])


def summarize(snap):
    counts = collections.Counter()
    for size, ctx, i in snap.values():
        counts[(size, short(ctx))] += 1
    tot = collections.Counter()
    for (size, c), k in counts.items():
        tot[size] += k
    return counts, tot


def eager_step(model, x, y, steps=1, opt=None):
    model.train()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(steps):
            for p in model.parameters():
                p.grad = None
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            del logits
            loss.backward()
            del loss
            if opt is not None:
                opt.step()
    return prof


def package_step(path, x, y):
    from torch._inductor.package import load_package
    with zipfile.ZipFile(path) as archive:
        folder = archive.namelist()[0].split("/")[0]
        state = torch.load(io.BytesIO(archive.read(f"{folder}/{ab.PT2_WEIGHTS}")))
    compiled = load_package(path, "model")
    wanted = set(compiled.get_constant_fqns())
    compiled.load_constants({k: v for k, v in state.items() if k in wanted}, check_full_update=True,
                            user_managed=True)
    loader = compiled.loader
    loader.run([x, y])  # warm
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        outs = loader.run([x, y])
        del outs
    return prof


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("spec")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--pkg", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = make_model(args.spec)
    folder = tempfile.TemporaryDirectory()
    pkg = args.pkg or os.path.join(folder.name, "model.pt2")
    if not args.pkg:
        ab.export_pt2(model, pkg, (torch.randn(2, 3, args.size, args.size),), loss="cross-entropy",
                      check_memory=False)
    x = torch.randn(args.batch, 3, args.size, args.size)
    y = torch.randint(0, 1000, (args.batch,))
    pe = eager_step(model, x, y)
    ee = trace(pe)
    pp = package_step(pkg, x, y)
    ep = trace(pp)
    peak_e, snap_e, ev_e = live_at_peak(ee, label="eager")
    peak_p, snap_p, ev_p = live_at_peak(ep, label="package")
    print(f"eager {peak_e:,} package {peak_p:,} diff {peak_p - peak_e:+,} ({100*(peak_p/peak_e-1):+.3f}%)")
    ce, te = summarize(snap_e)
    cp, tp = summarize(snap_p)
    print("-- sizes: eager count vs package count (only differing)")
    for size in sorted(set(te) | set(tp), key=lambda s: -s):
        if te[size] != tp[size]:
            print(f"  {size:>12,}  eager {te[size]:3d}  package {tp[size]:3d}  net {size*(te[size]-tp[size]):+,}")
    print("-- eager live by (size, ctx), top")
    for (size, c), k in sorted(ce.items(), key=lambda kv: -kv[0][0] * kv[1])[:50]:
        print(f"  {size:>12,} x{k:<3d} {c}")
    print("-- package live by (size, ctx), top")
    for (size, c), k in sorted(cp.items(), key=lambda kv: -kv[0][0] * kv[1])[:50]:
        print(f"  {size:>12,} x{k:<3d} {c}")


if __name__ == "__main__":
    main()
