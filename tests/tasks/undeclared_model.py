"""A model factory that declares no limits (`sidetasks.models.declares`): nothing about a prompt is known at submit.

Loaded by file reference (`model=tests/tasks/undeclared_model.py:byte_decoder`) by tests/side_tasks/test_generate.py.
"""

from __future__ import annotations

from sidetasks.models import ByteDecoder
from sidetasks.models import byte_decoder as declared


def byte_decoder() -> ByteDecoder:
    return declared()
