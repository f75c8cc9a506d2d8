"""Core utilities every layer may use: where agents listen, units, tokens, the window word, percentiles.

Imports nothing of freeride but `freeride.errors` (and the generated code, for nothing yet): the
bottom of the product's layers.
"""
