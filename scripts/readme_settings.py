"""Rewrite the settings table in README.md from entroloop/contract/settings.py (run after adding a setting)."""

import re
from pathlib import Path

from entroloop.contract.settings import settings_markdown

readme = Path(__file__).resolve().parents[1] / "README.md"
text = readme.read_text()
block = f"<!-- settings:begin -->\n{settings_markdown()}\n<!-- settings:end -->"
readme.write_text(re.sub(r"<!-- settings:begin -->.*<!-- settings:end -->", lambda _: block, text, flags=re.S))
