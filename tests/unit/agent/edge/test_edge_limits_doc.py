"""The docs state the bubble-edge time limits the agent applies (freeride/agent/edge/bubble_checks.py), in each
place they name them: architecture.md once said "an hour away" while the code allowed 60 s back and 1 s ahead."""

from __future__ import annotations

import pytest
from support.paths import REPO

from freeride.agent.edge.bubble_checks import MAX_EDGE_AGE_NS, MAX_EDGE_LEAD_NS

ROOT = REPO


@pytest.mark.parametrize("doc", ["architecture.md", "operations.md"])
def test_docs_state_the_edge_time_limits_of_the_code(doc: str) -> None:
    text = " ".join((ROOT / "docs" / doc).read_text().split())  # line breaks read as spaces
    age_s, lead_s = MAX_EDGE_AGE_NS // 10**9, MAX_EDGE_LEAD_NS // 10**9
    assert f"more than {age_s} s old" in text
    assert f"more than {lead_s} s ahead" in text or f"more than {lead_s} s in the future" in text
    assert "an hour away" not in text
