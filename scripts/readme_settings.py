"""Rewrite the settings table in docs/configuration.md from entroloop/contract/settings.py.

Run after adding a setting (`make readme-settings`); tests/unit/entroloop/test_settings.py fails
while the page lacks a variable.
"""

import re
from pathlib import Path

from entroloop.contract.settings import settings_markdown

page = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
text = page.read_text()
block = f"<!-- settings:begin -->\n{settings_markdown()}\n<!-- settings:end -->"
page.write_text(re.sub(r"<!-- settings:begin -->.*<!-- settings:end -->", lambda _: block, text, flags=re.S))
