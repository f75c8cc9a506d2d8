"""The package's version and its worker protocol: one place, read by the agent (its welcome to trainers, the
interpreter probe at submit), the workers and the metrics."""

__version__ = "0.1.0"

# What an agent and the worker and check processes it starts must agree on: worker.proto, the window word
# (freeride.core.window), the worker's and the check's command lines and environment, the check's JSON answer.
# Bump it with any change to them that an older or newer freeride would misread. A task run in its own
# interpreter (`freeride submit --python PATH`) runs the freeride installed there: the agent asks it for this
# number at submit (`PATH -m freeride.worker --protocol`), and each worker compares it with the agent's at start.
WORKER_PROTOCOL = 1
