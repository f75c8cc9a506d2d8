"""`freeride gpu-check`: one command that checks a GPU host end to end and writes a report.

    freeride gpu-check --out DIR [--fake-gpu] [--only a,b] [--skip a,b] [--budget-s N] [--gpu N]

Each check (checks/, listed in registry.py) runs in a child process of its own (child.py) with its
own time budget; runner.py starts it, kills its process group at the budget and sweeps whatever it
left running, so one failure, hang or missing binary never stops the rest. report.py writes
DIR/gpu-check.json and DIR/gpu-check.md. `--fake-gpu` rehearses the same checks on a machine
without a GPU (the fake GPU and the stand-in MPS control program); the checks that need CUDA are
then skipped, saying so. Kept light: the child processes import this package first.
"""
