"""`freeride demo`: plan.py fixes what runs, run.py runs it (agents, side tasks, a real pipeline), report.py
prints and draws what happened."""
