"""Benchmarks that measure the control path and the harvest (`freeride bench ...`)."""
