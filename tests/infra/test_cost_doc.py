"""docs/cost.md's figures are the estimate's (tools/cost_doc.py; issue 65, finding 6: the page showed $101.35 /
$549.51 / $1,436.59 where the estimate printed $68.14 / $384.03 / $1,206.64).

The stacks' plans come from the session's shared `plan_for` fixture, as the policy and plan tests read them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tools import cost_doc


def test_the_page_holds_what_the_tool_would_write(plan_for: Callable[[str], list[dict[str, Any]]]) -> None:
    generated = cost_doc.blocks({stack: plan_for(stack) for stack in cost_doc.stacks()})
    page = (cost_doc.ROOT / cost_doc.COST_DOC).read_text()
    for name, text in generated.items():
        assert text in page, f"docs/cost.md's {name!r} block is not the estimate's: run `make cost-doc`"
    stacks = generated["stacks"]
    assert all(f"| {stack} (" in stacks for stack in cost_doc.stacks())  # every shipped stack has its row
    assert "p4d.24xlarge | us-west-2 | 8 | $21.95764 | $9.38 | 2026-11-09" in generated["gpu-prices"]


def test_write_replaces_only_between_the_markers_and_names_a_missing_block(tmp_path: Path) -> None:
    begin, end = cost_doc.markers("idle")
    page = tmp_path / "cost.md"
    page.write_text(f"# Cost\nby hand\n{begin}\nold figures\n{end}\nby hand too\n")
    new = f"{begin}\n| new |\n{end}"
    assert cost_doc.write({"idle": new}, page) == f"# Cost\nby hand\n{new}\nby hand too\n"
    with pytest.raises(SystemExit, match=r"no .*cost-doc:stacks begin.* markers to write the 'stacks' block"):
        cost_doc.write({"stacks": "x"}, page)
