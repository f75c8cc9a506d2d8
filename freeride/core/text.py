"""Text from outside made safe to show: a task's name, arguments and failure reason come from whoever submitted
it or from its exception, and end up on terminals, in one-line logs and in Prometheus labels."""

from __future__ import annotations

import re

_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Characters that move the cursor, recolour or rewrite a terminal, or start a new line in a log: C0 and C1
# controls, DEL, the Unicode line and paragraph separators and the bidirectional overrides.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` safe for a terminal and a one-line log: each control character shown escaped (`\\x1b`, `\\n`)."""
    return _UNPRINTABLE.sub(lambda m: _NAMED_ESCAPES.get(m.group(), repr(m.group())[1:-1]), text)
