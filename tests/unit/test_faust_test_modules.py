"""The heavy suite's environment has no faust (tests/conftest.py): every test module that imports it,
directly or through the worker's modules, must be in ``FAUST_TEST_MODULES``, or the heavy suite stops
at collection. Found by reading the test files, so the light suite catches a new one."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import FAUST_TEST_MODULES

TESTS = Path(__file__).resolve().parents[1]
# faust itself, or an entroloop module that imports it at its top
IMPORTS_FAUST = re.compile(
    r"^\s*(import faust|from faust[ .]|from entroloop\.streams\.(app|faust_\w+) import|import entroloop\.streams\.(app|faust_))",
    re.MULTILINE)


def test_every_test_module_that_imports_faust_is_left_out_of_the_heavy_suite() -> None:
    importing = sorted(str(path.relative_to(TESTS)) for path in TESTS.rglob("test_*.py")
                       if IMPORTS_FAUST.search(path.read_text(encoding="utf-8")))
    assert importing, "the pattern finds nothing: it no longer matches how the worker is imported"
    assert sorted(set(importing) - set(FAUST_TEST_MODULES)) == []
