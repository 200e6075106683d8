"""A distillation job whose frozen teacher lives outside the model find() sizes (its step calls it
from a closure), in a fresh process on the CPU (test_doors.py):

    python outside_check.py find LIMIT        prints {"max": B, "held_outside": bytes}
    python outside_check.py loop LIMIT B      prints {"outcome": "fits" | "out-of-memory"}

`find` builds the teacher, the student and the example, then runs autobatch.find (margin 0,
AdamW, the distillation step). `loop` is the user's own job without autobatch: the budget
allocator installed before anything is built (every tensor counts, the teacher's too), then two
steps of the plain eager loop at micro-batch B: each batch made as a job's loader makes it (the
one-row example repeated, nothing else of it kept), the teacher's output under no_grad, MSE to it, backward, AdamW's step,
zero_grad(set_to_none=True)."""
import json
import sys

import torch
import torch.nn.functional as F

from fresh_budget import print_outcome


def build():
    torch.manual_seed(0)
    teacher = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]).eval()
    teacher.requires_grad_(False)  # frozen: about 16.8 MB of weights the student's job holds
    student = torch.nn.Sequential(torch.nn.Linear(1024, 128), torch.nn.ReLU(),
                                  torch.nn.Linear(128, 1024))
    return teacher, student, torch.randn(1, 1024)


def distill(teacher):
    def step(model, batch):
        with torch.no_grad():
            target = teacher(batch)
        return F.mse_loss(model(batch), target)
    return step


def main():
    mode, limit = sys.argv[1], int(sys.argv[2])
    if mode == "find":
        import autobatch
        teacher, student, x = build()
        r = autobatch.find(student, x, step=distill(teacher), memory_limit=limit, margin=0)
        print(json.dumps({"max": r.max_micro_batch,
                          "held_outside": r.memory["held_outside_model_bytes"],
                          "warnings": r.warnings}))
        return
    b = int(sys.argv[3])

    def job():
        teacher, student, x = build()
        row = x.tolist()
        del x  # a job holds its loader's batches, not find()'s example
        step = distill(teacher)
        opt = torch.optim.AdamW(student.parameters())
        for _ in range(2):
            batch = torch.tensor(row).repeat(b, 1)
            loss = step(student, batch)
            loss.backward()
            del loss
            opt.step()
            opt.zero_grad(set_to_none=True)
    print_outcome(limit, job)

if __name__ == "__main__":
    main()
