"""Sizing on the job's DataLoader (issue 67 item 1): find, check_batch and soak take the loader in
place of an example batch and run the trials on its costliest samples, collated by its own
collate_fn (autobatch/_loader.py). The truth is the user's own plain loop over the same loader in
a fresh process under the same budget (helpers/loader_epoch.py). Each test names the wrong
implementation it catches."""
import itertools
import json
import os
import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader

import autobatch
import loader_data as D
from autobatch._loader import loader_batches

HELPERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers")
MIB = 1 << 20
LIMIT = 64 * MIB


def fresh(*args):
    """helpers/loader_epoch.py ARGS in a fresh process, its JSON line as a dict."""
    out = subprocess.run([sys.executable, os.path.join(HELPERS, "loader_epoch.py"),
                          *map(str, args)], capture_output=True, text=True, timeout=600,
                         cwd=HELPERS)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- the scan: which samples bound the trial batch -------------------------------------------

def test_a_padding_loader_is_sized_on_its_longest_sample_not_its_first_batch():
    # Catches: sizing on the loader's first batch (16 to 20 tokens here), or on a sample drawn
    # at random: the trial rows must be as long as the longest sample of the epoch.
    lb = loader_batches(D.loader("pad"))
    assert lb.collation == "stacks"
    assert lb.binding == {"input_ids": [1, D.LONGEST], "attention_mask": [1, D.LONGEST]}
    assert lb.example["input_ids"].shape[1] == D.LONGEST
    assert (lb.samples, lb.dataset_size, lb.scope) == (D.SAMPLES, D.SAMPLES, "the epoch")
    assert next(iter(D.loader("pad")))["input_ids"].shape[1] < 32  # the first batch is short


def test_a_datasets_lengths_spare_loading_every_sample():
    # Catches: reading every sample (dataset[i]) when the dataset says each sample's length: a
    # large corpus would be read whole before the first trial. The binding is the same.
    loader = D.loader("lengths")
    lb = loader_batches(loader)
    assert 0 < loader.dataset.loaded <= 8 * 64 < D.SAMPLES
    assert lb.binding == loader_batches(D.loader("pad")).binding
    assert lb.samples == D.SAMPLES


def test_a_packing_collator_is_sized_on_the_b_costliest_samples_together():
    # Catches: treating a concatenating collator as a padding one (B rows of the longest sample:
    # [B, 512]) or repeating its one-row batch; the batch of B samples is one row of the B
    # longest samples' tokens, and a trial's batch is collated anew from the dataset (no sample
    # held between trials, where it would count as memory outside the model).
    loader = D.loader("pack")
    lb = loader_batches(loader)
    assert lb.collation == "concatenates"
    top3 = sum(sorted(D.lengths())[-3:])
    assert lb.make(3, torch.device("cpu"))["input_ids"].shape == (1, top3)
    assert lb.make(1, torch.device("cpu"))["input_ids"].shape == (1, D.LONGEST)


def test_images_of_varying_height_and_width_are_padded_to_the_largest_of_each():
    # Catches: ranking samples by one number (their elements: the 64 x 40 image is the largest)
    # and sizing on that one sample; padded with the tall and the wide one, a batch is 96 x 96.
    lb = loader_batches(DataLoader(D.Images(), batch_size=2, collate_fn=D.pad_images))
    assert lb.collation == "stacks"
    assert lb.binding == {"batch": [1, 3, 96, 96]}


def test_an_iterable_dataset_is_read_for_its_first_batches_and_says_so():
    # Catches: calling "the first N batches" the epoch, or reading the whole stream when asked
    # for N batches (the longest of the first 4 batches of 8 is sample 31).
    lb = loader_batches(D.loader("stream"), batches=4)
    assert lb.samples == 32 and lb.dataset_size is None
    assert lb.scope == "the first 4 batches of the IterableDataset (not the epoch)"
    assert lb.binding["input_ids"] == [1, D.lengths()[31]]
    whole = loader_batches(D.loader("stream"), batches=10_000)
    assert whole.scope == f"the IterableDataset's {D.SAMPLES // 8} batches (it ended: the whole stream)"
    assert whole.binding["input_ids"] == [1, D.LONGEST]


def test_a_batch_samplers_batches_are_enumerated_and_its_costliest_named():
    # Catches: ignoring the loader's own batch_sampler (its batches are the job's), or drawing
    # from the job's RNG while enumerating a random one.
    lb = loader_batches(D.loader("buckets", 8))
    assert lb.sampler_batches == {"batches": D.SAMPLES // 8, "largest_samples": 8,
                                  "costliest_samples": 8,
                                  "costliest_shape": {"input_ids": [8, D.LONGEST],
                                                      "attention_mask": [8, D.LONGEST]}}
    shuffled = DataLoader(D.Tokens(), batch_sampler=D.ShuffledBuckets(D.SAMPLES, 8),
                          collate_fn=D.pad)
    state = torch.get_rng_state()
    assert loader_batches(shuffled).sampler_batches["batches"] == D.SAMPLES // 8
    assert torch.equal(state, torch.get_rng_state())


@pytest.mark.parametrize("make, words", [
    (lambda: DataLoader(D.Tokens(), batch_size=None), "does not batch"),
    (lambda: DataLoader([], batch_size=2), "no sample"),
    (lambda: DataLoader(D.Images(), batch_size=2), "collate_fn failed on a list of 2"),
    (lambda: DataLoader([{"text": "a b"}, {"text": "c"}], batch_size=2),
     "no tensor of a batch dimension"),
])
def test_a_loader_that_cannot_be_sized_is_a_usage_error_before_any_trial(make, words):
    # Catches: a loader's failure surfacing from inside a trial as the model's error (or as out
    # of memory), or a torch error that does not say what the loader must be.
    with pytest.raises(autobatch.UsageError, match=words):
        autobatch.find(D.model(), make(), memory_limit=LIMIT, device="cpu", progress=False)


class _Broken(D.Tokens):
    """Sample 150 raises, as a corrupt record would."""

    def __getitem__(self, k):
        if k == 150:
            raise KeyError("broken sample 150")
        return super().__getitem__(k)


class _WrongLengths(D.Tokens):
    lengths = [1, 2, 3]  # three lengths for 2000 samples


@pytest.mark.parametrize("dataset, words", [
    (_Broken(), r"dataset failed on sample 150 \(KeyError"),
    (_WrongLengths(), "a `lengths` attribute that is not one int per sample"),
])
def test_a_dataset_that_fails_or_misstates_its_lengths_is_a_usage_error(dataset, words):
    # Catches: the dataset's own KeyError leaving as a raw traceback from autobatch's code, and
    # a malformed `lengths` ignored silently (the whole dataset then read without a word).
    with pytest.raises(autobatch.UsageError, match=words):
        autobatch.find(D.model(), DataLoader(dataset, batch_size=8, collate_fn=D.pad),
                       memory_limit=LIMIT, device="cpu")


def test_loader_batches_bounds_a_map_style_scan_and_is_refused_without_a_loader():
    # Catches: a bounded scan reported as the epoch, the bound taken as the epoch's size (the
    # micro-batch's bound stays the sampler's 2000 samples), an option silently ignored with an
    # example batch, and a count that is not >= 1.
    lb = loader_batches(D.loader("pad"), batches=4)
    assert lb.scope == "the first 4 batches the sampler draws (not the epoch)"
    assert (lb.samples, lb.dataset_size) == (32, D.SAMPLES)
    assert lb.binding["input_ids"] == [1, D.lengths()[31]]
    with pytest.raises(autobatch.UsageError, match="only with a DataLoader"):
        autobatch.find(D.model(), torch.ones(1, 4, dtype=torch.long), loader_batches=4,
                       memory_limit=LIMIT)
    with pytest.raises(autobatch.UsageError, match="loader_batches: expected an int >= 1"):
        autobatch.find(D.model(), D.loader("stream"), loader_batches=0, memory_limit=LIMIT)


# --- find, check_batch and soak on the loader --------------------------------------------------

def test_find_on_the_loader_reports_what_bound_it_and_stops_at_the_datasets_size():
    # Catches: a Result that does not say the loader's data bound it, and micro-batches tried
    # above the samples the epoch has (5 images: none is larger than 5).
    loader = DataLoader(D.Images(), batch_size=2, collate_fn=D.pad_images)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(4, 1))
    r = autobatch.find(model, loader, memory_limit=LIMIT, device="cpu", progress=False)
    assert (r.max_micro_batch, r.capped_by) == (5, "dataset-size")
    assert r.data["binding_shape"] == {"batch": [1, 3, 96, 96]}
    assert max(t.micro_batch_size for t in r.trials) == 5
    assert any(w.startswith("sized on the DataLoader's data (5 samples of the epoch)")
               for w in r.warnings)


def test_check_batch_on_the_loader_runs_the_costliest_rows():
    # Catches: check_batch on the loader's first batch (a 34-row trial of 17 tokens fits in a
    # fraction of what 34 rows of 512 tokens need).
    small = autobatch.check_batch(D.model(), next(iter(D.loader("pad"))), 34,
                                  memory_limit=LIMIT, device="cpu")
    big = autobatch.check_batch(D.model(), D.loader("pad"), 34, memory_limit=LIMIT, device="cpu")
    assert small.outcome == big.outcome == "fits"
    assert big.peak_bytes > 10 * small.peak_bytes


def test_soak_on_the_loader_runs_its_consecutive_batches_and_sees_no_leak_in_growing_batches():
    # Catches: a soak that repeats one batch where the loader was given (every step the same
    # shape), and a growth fitted on the held bytes with the held batch in them: along a sorted
    # loader each step holds a longer batch, which is the data, not a leak.
    r = autobatch.soak(D.model(), D.loader("pad"), 34, steps=10, memory_limit=LIMIT, device="cpu")
    widths = [s.batch_shape["input_ids"][1] for s in r.steps]
    assert widths == sorted(widths) and widths[0] < widths[-1]
    assert widths[0] == max(D.lengths()[:34])
    held = [s.held_bytes for s in r.steps]
    assert held[-1] > held[2]  # the held bytes grow with the batch ...
    assert not r.growing and r.growth_bytes_per_step == 0.0  # ... and that is not growth
    assert "collated in this process" in r.batches


class _LongestFirst(D.Buckets):
    """The buckets from the longest down: the job's order is not the dataset's."""

    def __iter__(self):
        return reversed(list(super().__iter__()))


def test_soak_reads_only_the_batches_it_runs():
    # Catches: a soak that scans the whole dataset for its costliest samples (find's work, which
    # the soak's in-order batches do not use), once per soak; and loader_batches taken silently
    # where it bounds nothing.
    loader = D.loader("pad")
    autobatch.soak(D.model(), loader, 8, steps=3, memory_limit=LIMIT, device="cpu")
    assert loader.dataset.loaded == 8 + 3 * 8  # the session's example, then one batch a step
    with pytest.raises(autobatch.UsageError, match="loader_batches: bounds find"):
        autobatch.soak(D.model(), loader, 8, steps=3, loader_batches=2, memory_limit=LIMIT)


def test_soak_follows_the_loaders_own_order():
    # Catches: a soak that walks the dataset's index order where the loader does not (a
    # batch_sampler's buckets, a shuffling sampler): the steps must see the batches the job sees,
    # here the longest first.
    loader = DataLoader(D.Tokens(), batch_sampler=_LongestFirst(D.SAMPLES, 8), collate_fn=D.pad)
    expected = [b["input_ids"].shape[1] for b in itertools.islice(iter(loader), 5)]
    r = autobatch.soak(D.model(), loader, 8, steps=5, memory_limit=LIMIT, device="cpu")
    assert [s.batch_shape["input_ids"][1] for s in r.steps] == expected
    assert expected[0] == D.LONGEST and expected == sorted(expected, reverse=True)


# --- the truth: the user's own loop over the same loader, fresh processes (slow) --------------

@pytest.mark.slow
def test_the_first_batchs_answer_fails_within_the_epoch_and_the_loaders_trains_it():
    # Catches: sizing on the first batch (short sequences: its answer runs out of memory within
    # the epoch), and a loader answer that is not exact: the worst batch a shuffled epoch can
    # build (the costliest samples together) fits at max_micro_batch and not one above.
    first = fresh("find", "pad", LIMIT, "first")
    ran = fresh("epoch", "pad", LIMIT, first["safe"])
    assert ran["failed_batch"] is not None and ran["shape"][0] == first["safe"]
    found = fresh("find", "pad", LIMIT)
    assert found["data"]["binding_shape"]["input_ids"] == [1, D.LONGEST]
    epoch = fresh("epoch", "pad", LIMIT, found["safe"])
    assert epoch == {"failed_batch": None, "shape": None,
                     "batches": -(-D.SAMPLES // found["safe"])}
    assert fresh("worst", "pad", LIMIT, found["max"])["failed_batch"] is None
    assert fresh("worst", "pad", LIMIT, found["max"] + 1)["failed_batch"] is not None
    # The bucketing batch_sampler of that size trains its epoch too.
    assert fresh("epoch", "buckets", LIMIT, found["safe"])["failed_batch"] is None


@pytest.mark.slow
def test_a_packing_loaders_answer_is_exact_on_its_costliest_samples():
    # Catches: sizing a packing collator as rows (its batch is a sum of samples), and holding
    # the samples between trials (counted as memory outside the model: 2 sizes too small).
    found = fresh("find", "pack", LIMIT)
    assert found["data"]["collation"] == "concatenates"
    assert fresh("worst", "pack", LIMIT, found["max"])["failed_batch"] is None
    assert fresh("worst", "pack", LIMIT, found["max"] + 1)["failed_batch"] is not None


@pytest.mark.slow
def test_an_iterable_datasets_answer_covers_the_batches_it_read():
    # Catches: reporting the first N batches as the epoch. The stream is sorted: the answer on
    # its first 8 batches fails later in the stream, and the one on the whole stream is the
    # map-style dataset's.
    part = fresh("find", "stream", LIMIT, 8)
    assert "(not the epoch)" in part["data"]["scope"]
    assert fresh("epoch", "stream", LIMIT, part["safe"])["failed_batch"] is not None
    whole = fresh("find", "stream", LIMIT, 10_000)
    assert (whole["max"], whole["safe"]) == tuple(fresh("find", "pad", LIMIT)[k]
                                                  for k in ("max", "safe"))
    assert fresh("epoch", "stream", LIMIT, whole["safe"])["failed_batch"] is None
