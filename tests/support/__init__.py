"""What the tests share, one module per concern: agents and synthetic trainers (agents.py), the CLI in a subprocess
(cli.py), paths (paths.py), a manual clock (clock.py), the worker's gate harness (worker.py), the engine's fakes
(engine_fakes.py) and its servicers served in-process (served.py), fault tests' tagged agents (faults.py), side
tasks in an agent (sidetasks.py), a real Redis (redis_server.py) and Prometheus (prometheus.py), a small full disk
(disk.py), the deploy files (deploy_files.py), and the machine's own jitter for timing tests (jitter.py).
Fixtures stay in tests/conftest.py, built from these.
"""
