"""The tooling that ships with freeride, above the product: the demo, the benchmarks, the harness
that tests and benchmarks drive real agents with, and the timeline picture.

Nothing in the product imports this package; `freeride.main` adds its commands to the CLI.
"""
