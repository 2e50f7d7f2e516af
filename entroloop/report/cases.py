"""Bad cases as HTML: the model's output beside the user's correction, the minimal failing example
marked in both (what the output says, what the correction says instead), and the token diff. Every stored text goes through ``html.escape``: outputs
and corrections are user and model text, so a ``<script>`` in a correction must stay text."""

from __future__ import annotations

from datetime import datetime, timezone
from html import escape

from entroloop.report.data import BadCaseRow

CONTEXT_CHARS = 400  # of a long text, this much is kept on each side of the minimal failing example
DIFF_OPS_SHOWN = 12


def _clip(text: str, start: int, end: int, context: int = CONTEXT_CHARS) -> tuple[str, str, str]:
    """(before, marked, after) around ``text[start:end]``, with long outer parts shortened to ``…``."""
    before, marked, after = text[:start], text[start:end], text[end:]
    if len(before) > context:
        before = "…" + before[-context:]
    if len(after) > context:
        after = after[:context] + "…"
    if len(marked) > 2 * context:
        marked = marked[:context] + " … " + marked[-context:]
    return before, marked, after


def _shorten(text: str, limit: int = 2 * CONTEXT_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _marked(text: str, start: int, end: int) -> str:
    before, marked, after = _clip(text, start, end)
    middle = f"<mark>{escape(marked)}</mark>" if marked else ""
    return f"{escape(before)}{middle}{escape(after)}"


def _diff(ops: list[tuple[str, str, str]]) -> str:
    if not ops:
        return "<span class='muted'>no token changed</span>"
    items = []
    for op, old, new in ops[:DIFF_OPS_SHOWN]:
        parts = []
        if old:
            parts.append(f"<del>{escape(_shorten(old, CONTEXT_CHARS))}</del>")
        if new:
            parts.append(f"<ins>{escape(_shorten(new, CONTEXT_CHARS))}</ins>")
        items.append(f"<li><span class='op'>{escape(op)}</span> {' → '.join(parts)}</li>")
    more = len(ops) - DIFF_OPS_SHOWN
    if more > 0:
        items.append(f"<li class='muted'>… {more} more change{'s' if more > 1 else ''}</li>")
    return f"<ol class='diff'>{''.join(items)}</ol>"


def bad_case_html(case: BadCaseRow) -> str:
    """One bad case as an ``<article>``: who and where, both texts, the minimal example, the diff."""
    start, end = case.minimal_span
    old, new = case.minimal_example
    # the replacement's place in the correction: the same start, the same untouched suffix
    new_end = start + len(new)
    when = datetime.fromtimestamp(case.emitted_at, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    labels = "".join(f"<span class='chip'>{escape(label)}</span>" for label in case.labels)
    facts = [f"<code>{escape(case.request_id)}</code>", escape(case.model), f"route {escape(case.route)}",
             f"adapter {escape(case.adapter)}" if case.adapter else "base model", when,
             f"confidence {case.confidence:.2f}"]
    minimal = (f"<del>{escape(_shorten(old))}</del> → <ins>{escape(_shorten(new))}</ins>"
               if old or new else "<span class='muted'>none (the texts are equal)</span>")
    return f"""<article class="case">
<p class="case-head">{' · '.join(facts)} {labels}</p>
<div class="pair">
<div><h4>Model output</h4><p class="text">{_marked(case.response, start, end)}</p></div>
<div><h4>User correction</h4><p class="text">{_marked(case.correction, start, new_end)}</p></div>
</div>
<p class="minimal"><b>Minimal failing example</b> (characters {start}–{end} of the output): {minimal}</p>
<div class="diff-block"><b>Diff</b> ({len(case.diff)} change{'' if len(case.diff) == 1 else 's'}, output → correction):
{_diff(case.diff)}</div>
<details><summary>Prompt</summary><p class="text">{escape(_shorten(case.prompt))}</p></details>
</article>"""


__all__ = ["bad_case_html"]
