"""docs/scale-out.md's table is the rendering of ``support.scale_out`` (the doc cannot drift from the data), and every
test a cell names is one pytest collects (the data cannot name a test that does not exist). The refused cells are
resolved through SGLang's argument pipeline in ``tests/e2e/test_speculative_config.py``."""

import subprocess
import sys

from support import scale_out
from support.paths import DOCS, REPO

DOC = DOCS / "scale-out.md"


def test_the_doc_holds_the_rendered_table():
    text = DOC.read_text()
    assert text.count(scale_out.BEGIN) == 1 and text.count(scale_out.END) == 1
    start, end = text.index(scale_out.BEGIN), text.index(scale_out.END) + len(scale_out.END)
    assert text[start:end] == scale_out.render(), (
        "docs/scale-out.md's table differs from tests/support/scale_out.py: replace it with the output of "
        "`python tests/support/scale_out.py`"
    )


def test_every_cell_has_a_status_and_every_named_test_is_collected():
    tested = set()
    for row, column, cell in scale_out.cells():
        assert isinstance(cell, (scale_out.Tested, scale_out.Refused, scale_out.GpuOnly, scale_out.Untested)), (
            row,
            column,
        )
        if isinstance(cell, scale_out.Tested):
            tested.add(f"tests/{cell.test}")  # node ids as pytest prints them, from the repository's root
    files = sorted({test.split("::")[0] for test in tested})
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", *files],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    collected = {line.strip() for line in out.stdout.splitlines() if "::" in line}
    missing = sorted(tested - collected)
    assert not missing, (
        f"named in the scale-out table, not collected: {missing}\n{out.stdout[-2000:]}{out.stderr[-2000:]}"
    )
