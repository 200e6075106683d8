"""How often a measuring trial's two logs differ in the order of their events, and whether the
replay survives it (docs/search.md, "The replayed peak"; src/python/autobatch/_replay.py).

Runs one of the race's models (scripts/bench/race.py) as autobatch.find sets up its probe (3
steps a trial, AdamW, min_batch 2, the CPU budget allocator without a limit), a full trial at 2
and then --trials measuring trials at --size, and prints for each: whether its first step's log
(2 samples) and its whole step's (--size) are the same events in the same order, the length of
aligned_logs' line-up (stretches merged, transients of one log added to the other), and the
replayed peak at --at. --busy N runs N busy processes beside it (the race's load: intra-op worker
threads get scheduled later). Exits 1 unless every trial gave a replay, all the same at --at.

    python scripts/bench/replay_order.py --model vit --trials 8 --busy 1
"""
import argparse
import multiprocessing
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _spin():
    while True:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="vit")
    parser.add_argument("--size", type=int, default=4)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--at", type=int, default=275, help="the batch to read the replay at")
    parser.add_argument("--busy", type=int, default=0, help="busy processes beside it")
    args = parser.parse_args()

    busy = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]
    for p in busy:
        p.start()
    import torch

    import autobatch._measuring as measuring
    from autobatch._replay import aligned_logs, peak_lines
    from autobatch._state import ModelState
    from autobatch._trial import EagerProbe, Meter, leading_size
    import peers
    import race

    seen = []

    def spy(first, first_size, second, second_size, *rest):
        same = first[1] == second[1] and all((x > 0) == (y > 0)
                                             for x, y in zip(first[0], second[0]))
        aligned = None if same else aligned_logs(first, second)
        lines = peak_lines(first, first_size, second, second_size, *rest)
        seen.append((len(first[0]), len(second[0]), same,
                     None if aligned is None else len(aligned[0]), lines))
        return lines

    measuring.peak_lines = spy
    ctor, shape, int_high, _ = race.RACE_MODELS[args.model]
    model = race.make(ctor, int(shape.split("x")[-1]))  # as race.py's child builds it
    x, y = peers.make_batch(argparse.Namespace(shape=shape, int_high=int_high), 1, "cpu")

    def step(m, batch):  # race.py's autobatch row's
        return peers.loss_of(m(batch[0]), batch[1])

    state = ModelState(model, (x, y))
    meter = Meter.cpu(64 << 30, 0)
    params = [p for p in model.parameters() if p.requires_grad]
    probe = EagerProbe(model, (x, y), leading_size((x, y)), torch.device("cpu"),
                       lambda: torch.optim.AdamW(params, lr=1e-3), None,
                       lambda: torch.autocast("cpu", enabled=False), meter, state, 3, step=step)
    probe.state_batch = 2
    meter.finish_setup(state.untracked_bytes())
    try:
        probe(2, 1)
        for _ in range(args.trials):
            probe.measure(args.size, 1)
    finally:
        meter.remove()
        state.restore(True)
        for p in busy:
            p.terminate()
    peaks = set()
    for i, (n1, n2, same, lined_up, lines) in enumerate(seen):
        peak = max(a + s * args.at for a, s in lines) if lines else None
        peaks.add(peak)
        print(f"trial {i + 1}: events {n1} and {n2}; same order: {same}; "
              f"lined up in {lined_up} events; replayed peak at {args.at}: {peak}")
    other = sum(1 for s in seen if not s[2])
    made = sum(1 for s in seen if s[4])
    print(f"{args.model}, measuring trials at {args.size} (first step at 2), {args.busy} busy: "
          f"{other} of {len(seen)} in another order, a replay from {made} of {len(seen)}, "
          f"{len(peaks - {None})} distinct replayed peak(s) at {args.at}")
    return 0 if made == len(seen) and len(peaks - {None}) <= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
