"""Labelled entropy traces from a real (tiny) language model served by vLLM with the entroloop tap.

The model is ``tests.corpora.tiny_lm`` (trained on Debian's zh_CN gettext catalogs, English and
Chinese). It is served by the vLLM CPU engine with the entropy tap loaded from its entry point,
exactly as on a serving node; the tap ships its records to a file sink that this module reads back.
Entropies are the tap's (full vocabulary, float16 on the wire); token ids are vLLM's outputs.

Requests: prompts in both languages (the first words of training messages, and a few written
here), each sampled in one of several regimes — greedy (small models fall into loops), ordinary
sampling, and high temperature (gibberish). Labels are judged from the decoded text only
(``tests.corpora.text_labels``), never from the entropies or the regime, so the detectors scored on
the file cannot have shaped them.

``python -m tests.corpora.lm_traces`` (in .venv-ml) trains or loads the model and rewrites
``tests/data/entropy/lm_traces_dev.jsonl`` and ``lm_traces_test.jsonl`` deterministically for a
given model. The split is by a hash of each request id (``split_of``), fixed before any detector
setting was chosen: settings are tuned on the DEV file only; the TEST file is the one reported.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.corpora.text_labels import Lexicon, label
from tests.corpora.tiny_lm import (
    TinyLMConfig,
    corpus_documents,
    tiny_lm,
    training_report,
)

FOLDER = Path(__file__).resolve().parents[1] / "data" / "entropy"
OUTPUTS = {"dev": FOLDER / "lm_traces_dev.jsonl", "test": FOLDER / "lm_traces_test.jsonl"}
"""DEV: detector settings are tuned here. TEST: reported by `entroloop bench detectors`, never tuned on."""
FRESH_OUTPUT = FOLDER / "lm_traces_fresh.jsonl"
"""FRESH: generated after every detector setting and label rule was final, from prompts that neither
DEV nor TEST holds; nobody looked at it before it was scored. All of it is reported."""
READ_SPLITS = {"read": (1403, "lmr"), "read2": (1404, "lmr2"), "read3": (1405, "lmr3"), "read4": (1407, "lmr4"),
               "read5": (1408, "lmr5")}
"""READ, READ2 and READ3 (seed, id prefix): labelled by a reader, not by ``text_labels``: every text
read end to end from a sheet that shows only the prompt and the decoded text, before any detector ran
on the file (see the README). READ2 was generated after the settings that READ's scoring led to were
final; READ3 (a second blind split) after READ2 was scored, with no setting changed since; READ4
(a third, the first made with sampling entropies) after the sampling edge was set on DEV2; READ5 (a
fourth) after near-cycle loop evidence was added, read by a helper session that never saw the detectors."""
READ_OUTPUTS = {name: FOLDER / f"lm_traces_{name}.jsonl" for name in READ_SPLITS}
DEV2 = (1406, "lmd2")
"""DEV2 (seed, id prefix): made when the tap began shipping sampling entropies (the entropy at the
request's temperature), to tune the gibberish edge on them; labelled by the text rules. Its prompts
pass over every earlier split's. The earlier splits' models are gone with their machines, so only a
split this machine's model made (READ3) can be given sampling entropies afterwards (``--add-sampling``)."""
DEV2_OUTPUT = FOLDER / "lm_traces_dev2.jsonl"
READING = FOLDER / "reading"
"""Reading sheets (what the reader saw) and the labels written from them, by sheet key."""
READER_LABELS = {
    **{path: READING / f"{name}_labels.jsonl" for name, path in READ_OUTPUTS.items()},
    OUTPUTS["dev"]: READING / "dev_labels.jsonl",
    FRESH_OUTPUT: READING / "fresh_labels.jsonl",
    OUTPUTS["test"]: READING / "test_labels.jsonl",
}
"""Files whose ``label`` is a reader's (their text rules' verdict is ``generator.rule_label``): the
READ splits; DEV, read afterwards so that settings are tuned on what a reader calls a loop or
gibberish; and FRESH and TEST, read after they had been scored against the rules."""
MODEL_NAME = "tiny-lm-zh-en"
SEED = 14
FRESH_SEED = 1402


@dataclass(frozen=True)
class Regime:
    name: str
    temperature: float
    top_p: float = 1.0


REGIMES = (
    Regime("greedy", 0.0),
    Regime("sampled", 0.7, top_p=0.9),
    Regime("sampled-t1", 1.0),
    Regime("hot", 1.5),
    Regime("very-hot", 2.0),
)

# Written here (not in the training text): what a user of a git/shell assistant might start with.
HANDWRITTEN_PROMPTS = (
    "How do I undo the last commit",
    "The file could not be",
    "Usage: copy the files to",
    "error: your local changes",
    "如何撤销上一次提交",
    "无法打开文件",
    "用法：将文件复制到",
    "错误：您的本地修改",
)


@dataclass(frozen=True)
class Request:
    id: str
    prompt: str
    lang: str
    regime: Regime
    max_tokens: int
    seed: int


@functools.cache  # a cached model folder never changes (trained in staging, then renamed)
def weights_sha256(model_folder: Path) -> str:
    """The trained weights' fingerprint, recorded in every line this module writes. The model's
    cache key names the recipe (text, config, code), not the weights: torch's CPU kernels round
    differently on another CPU, so the same recipe trained on another machine gives a sibling model
    whose greedy texts part from these after a few tokens. (Here, not in tiny_lm: a change there
    changes the cache key and retrains the model.)"""
    return hashlib.sha256((model_folder / "model.safetensors").read_bytes()).hexdigest()


def split_of(request_id: str) -> str:
    """"dev" or "test": half the requests each, by the first byte of the id's SHA-256 (not by regime,
    language or label, so both halves hold every kind of request)."""
    return "dev" if hashlib.sha256(request_id.encode()).digest()[0] < 128 else "test"


def read_lines(paths: tuple[Path, ...] = tuple(OUTPUTS.values())) -> dict[str, dict]:
    """Every checked-in trace of ``paths`` (default: DEV and TEST), by id."""
    lines = {}
    for path in paths:
        for raw in path.read_text().splitlines():
            line = json.loads(raw)
            lines[line["id"]] = line
    return lines


def corpus_prompts(
    count_per_lang: int, seed: int = SEED, exclude: frozenset[str] = frozenset()
) -> list[tuple[str, str]]:
    """(lang, prompt): the opening words of training messages (English) or characters (Chinese).
    With ``exclude``: messages whose opening line starts with an excluded prompt are passed over,
    and so are prompts already taken (a fresh split shares no prompt with the others)."""
    rng = random.Random(seed)
    documents = corpus_documents()
    prompts: list[tuple[str, str]] = []
    seen = set(exclude)
    for lang in ("en", "zh"):
        pool = [
            d.text
            for d in documents
            if d.lang == lang and len(d.text) >= 24 and d.text[0].isalpha()
        ]
        # Without ``exclude`` exactly the draws that made DEV and TEST (they must reproduce).
        candidates = rng.sample(pool, len(pool) if exclude else count_per_lang)
        taken = 0
        for text in candidates:
            if taken == count_per_lang:
                break
            first_line = text.splitlines()[0]
            prompt = (
                " ".join(first_line.split()[: rng.randint(2, 5)])
                if lang == "en"
                else first_line[: rng.randint(3, 8)]
            )
            if exclude and (prompt in seen or any(first_line.startswith(p) for p in exclude)):
                continue
            seen.add(prompt)
            prompts.append((lang, prompt))
            taken += 1
    return prompts


def plan_requests(
    count_per_lang: int = 30, regimes: tuple[Regime, ...] = REGIMES, seed: int = SEED
) -> list[Request]:
    """Every prompt in every regime, with a random length, shuffled (one model's mixed traffic)."""
    prompts = corpus_prompts(count_per_lang, seed)
    prompts += [
        ("zh" if any("\u4e00" <= c <= "\u9fff" for c in p) else "en", p)
        for p in HANDWRITTEN_PROMPTS
    ]
    return _requests(prompts, regimes, random.Random(seed), "lm")


def plan_fresh_requests(
    used_prompts: frozenset[str], count_per_lang: int = 34, regimes: tuple[Regime, ...] = REGIMES
) -> list[Request]:
    """The FRESH split: as many prompts as DEV and TEST together (68), none of them used there,
    drawn with another seed, every prompt in every regime; ids ``lmf-NNNN``."""
    prompts = corpus_prompts(count_per_lang, FRESH_SEED, exclude=used_prompts | set(HANDWRITTEN_PROMPTS))
    return _requests(prompts, regimes, random.Random(FRESH_SEED), "lmf")


def plan_read_requests(
    name: str, used_prompts: frozenset[str], count_per_lang: int = 20, regimes: tuple[Regime, ...] = REGIMES
) -> list[Request]:
    """A READ split: 40 prompts that no earlier split uses, every prompt in every regime; ids
    ``lmr-NNNN`` (READ), ``lmr2-NNNN`` (READ2), ``lmr3-NNNN`` (READ3)."""
    seed, prefix = READ_SPLITS[name]
    prompts = corpus_prompts(count_per_lang, seed, exclude=used_prompts | set(HANDWRITTEN_PROMPTS))
    return _requests(prompts, regimes, random.Random(seed), prefix)


def read_split_requests(name: str) -> list[Request]:
    """A READ split's requests: its prompts pass over every prompt of the splits made before it
    (DEV, TEST, FRESH, the earlier READ splits, and DEV2 for the READ splits made after it)."""
    names = list(READ_SPLITS)
    earlier = (*OUTPUTS.values(), FRESH_OUTPUT, *(READ_OUTPUTS[n] for n in names[: names.index(name)]),
               *((DEV2_OUTPUT,) if names.index(name) > names.index("read3") else ()))
    used = frozenset(line["generator"]["prompt"] for line in read_lines(earlier).values())
    return plan_read_requests(name, used)


def dev2_requests() -> list[Request]:
    """DEV2's requests: 40 prompts that no earlier split holds (READ3 included), every regime."""
    earlier = (*OUTPUTS.values(), FRESH_OUTPUT, *(READ_OUTPUTS[n] for n in ("read", "read2", "read3")))
    used = frozenset(line["generator"]["prompt"] for line in read_lines(earlier).values())
    seed, prefix = DEV2
    prompts = corpus_prompts(20, seed, exclude=used | set(HANDWRITTEN_PROMPTS))
    return _requests(prompts, REGIMES, random.Random(seed), prefix)


def add_sampling_entropies(path: Path, requests: list[Request], model_folder: Path) -> int:
    """Regenerate a checked-in split's requests and add the tap's sampling entropies to its lines,
    changing nothing else; refused unless every regenerated request reproduces its line's token ids
    and entropies (the same model, engine and seeds), so labels stay with the texts they were made
    from. Returns how many lines gained sampling entropies."""
    lines = [json.loads(raw) for raw in path.read_text().splitlines()]
    by_id = {line["id"]: line for line in lines}
    if set(by_id) != {r.id for r in requests}:
        raise ValueError(f"{path.name}: its lines are not the split's planned requests")
    sha = weights_sha256(model_folder)
    if any(line["generator"]["weights_sha256"] != sha for line in lines):
        raise ValueError(f"{path.name} was made by other weights than {model_folder.name}'s ({sha[:8]}): "
                         f"regenerating it would give other texts")
    added = 0
    for trace in run_engine(requests, model_folder):
        line = by_id[trace["id"]]
        if trace["token_ids"] != line["token_ids"] or any(
            abs(a - b) > 2e-3 for a, b in zip(trace["entropy"], line["entropy"])
        ):
            raise ValueError(f"{path.name}: {trace['id']} did not reproduce its tokens and entropies; nothing written")
        if trace["sampling_entropy"]:
            line["sampling_entropy"] = trace["sampling_entropy"]
            added += 1
    # the key goes after the surprisals, as generated lines have it
    ordered = []
    for line in lines:
        keys = list(line)
        if "sampling_entropy" in line:
            keys.remove("sampling_entropy")
            keys.insert(keys.index("surprisal") + 1, "sampling_entropy")
        ordered.append({key: line[key] for key in keys})
    write_lines(ordered, path)
    return added


def sheet_key(request_id: str) -> str:
    """A READ line's name on the reading sheet. Not its id: ids are numbered prompt by prompt and
    regime by regime, so the id would tell the reader the sampling temperature."""
    return hashlib.sha256(f"read:{request_id}".encode()).hexdigest()[:8]


def write_reading_sheet(lines: list[dict], path: Path) -> None:
    """Prompt and decoded text of each line, by sheet key: no id, regime, entropy or rule label."""
    labels = path.name.replace("sheet.md", "labels.jsonl")
    parts = [f"# Reading sheet (prompt and decoded text only; labels in {labels})\n"]
    for line in sorted(lines, key=lambda line: sheet_key(line["id"])):
        generator = line["generator"]
        parts.append(f"\n## {sheet_key(line['id'])}\n\nprompt: {generator['prompt']}\n\n~~~~\n{generator['text']}\n~~~~\n")
    path.write_text("".join(parts))


def read_labels(path: Path) -> dict[str, dict[str, bool]]:
    """A reading's labels by sheet key (``{"key", "loop", "gibberish", "why"}`` per line); a key
    labelled twice or a line without boolean ``loop`` and ``gibberish`` is an error naming the line."""
    labels: dict[str, dict[str, bool]] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        entry = json.loads(raw)
        if entry["key"] in labels:
            raise ValueError(f"{path}:{number}: sheet key {entry['key']} labelled twice")
        if not all(isinstance(entry.get(name), bool) for name in ("loop", "gibberish")):
            raise ValueError(f"{path}:{number}: needs boolean 'loop' and 'gibberish'")
        labels[entry["key"]] = {"loop": entry["loop"], "gibberish": entry["gibberish"]}
    return labels


def apply_read_labels(output: Path, labels_path: Path) -> int:
    """Set each line's ``label`` from the reader's labels (by sheet key), keeping the text rules'
    verdict in ``generator.rule_label``; every line needs one label and every label one line.
    Returns how many lines were labelled."""
    labels = read_labels(labels_path)
    lines = [json.loads(raw) for raw in output.read_text().splitlines()]
    keys = {sheet_key(line["id"]) for line in lines}
    if keys != set(labels):
        raise ValueError(
            f"{labels_path}: labels for {len(set(labels) - keys)} unknown keys, "
            f"none for {sorted(keys - set(labels))[:5]}"
        )
    for line in lines:
        line["generator"].setdefault("rule_label", line.get("label"))
        line["label"] = labels[sheet_key(line["id"])]
    write_lines(lines, output)
    return len(lines)


def _requests(
    prompts: list[tuple[str, str]], regimes: tuple[Regime, ...], rng: random.Random, prefix: str
) -> list[Request]:
    """Every prompt in every regime, with a random length and seed, shuffled."""
    requests = [
        Request(
            f"{prefix}-{i:04d}",
            prompt,
            lang,
            regime,
            rng.randint(48, 160),
            rng.randrange(2**31),
        )
        for i, ((lang, prompt), regime) in enumerate(
            (p, r) for p in prompts for r in regimes
        )
    ]
    rng.shuffle(requests)
    return requests


def _read_tap_records(folder: Path) -> list:
    from entroloop.collectors.vllm.emit import read_frames

    records = []
    for path in sorted(folder.glob("tokens-*.bin")):
        records.extend(read_frames(path))
    return records


def tap_entropies(
    folder: Path, expected: set[str], timeout_s: float = 60.0, field: str = "values"
) -> dict[str, list[float]]:
    """Per request id, the tap's entropies (chunks joined in order) once its final chunk arrived;
    ``field="surprisal_values"``: its surprisals instead (empty where a chunk shipped none)."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = _read_tap_records(folder)
        finished = {r.request_id for r in records if r.final}
        if expected <= finished or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    missing = expected - finished
    if missing:
        raise RuntimeError(
            f"the entropy tap shipped no final record for {len(missing)} requests, e.g. {sorted(missing)[:3]}"
        )
    chunks: dict[str, list] = {}
    for record in records:
        chunks.setdefault(record.request_id, []).append(record)
    return {
        request_id: [
            float(v)
            for r in sorted(parts, key=lambda r: r.first_token_index)
            for v in (getattr(r, field)() if getattr(r, field)() is not None else ())
        ]
        for request_id, parts in chunks.items()
        if request_id in expected
    }


def tap_environment(sink_folder: Path) -> dict[str, str]:
    """What a serving node sets so that vLLM loads the tap and ships to a frame file."""
    return {
        "ENTROLOOP_ENTROPY_TAP_ENABLED": "true",
        "ENTROLOOP_ENTROPY_TAP_SINK": f"file:{sink_folder}/tokens-{{pid}}.bin",
        "ENTROLOOP_NODE_ID": "tiny-lm-traces",
        "VLLM_USE_V2_MODEL_RUNNER": "0",  # the interface the tap's batch ledger is tested with
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def start_engine(model_folder: Path):
    from vllm import LLM

    return LLM(
        model=str(model_folder),
        served_model_name=MODEL_NAME,
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        max_num_seqs=32,
        gpu_memory_utilization=0.1,
        seed=0,
    )


def stop_engine(llm) -> None:
    """Shut the engine-core subprocess down now (an exception would otherwise leave it running)."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None and callable(getattr(core, "shutdown", None)):
        core.shutdown()


def decode(tokenizer, token_ids: list[int]) -> str:
    """The text a reader sees; message boundaries (<s>, </s>) become line breaks."""
    special = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}
    pieces: list[list[int]] = [[]]
    for token in token_ids:
        if token in special:
            pieces.append([])
        else:
            pieces[-1].append(token)
    return "\n".join(tokenizer.decode(piece) for piece in pieces if piece)


def generate(llm, requests: list[Request], sink_folder: Path) -> list[dict]:
    """Run ``requests`` through the engine; one trace dict per request (no label yet)."""
    from vllm import SamplingParams

    params = [
        SamplingParams(
            temperature=r.regime.temperature,
            top_p=r.regime.top_p,
            max_tokens=r.max_tokens,
            ignore_eos=True,  # a message ends early; the model then starts the next one
            seed=r.seed,
            # The sampled token's own log-probability, from the raw logits (vLLM's default
            # ``logprobs_mode="raw_logprobs"``: before temperature and top-p): its surprisal is
            # the gibberish evidence that pre-temperature entropy cannot give (see the README).
            logprobs=0,
            extra_args={"entroloop_request_id": r.id},
        )
        for r in requests
    ]
    outputs = llm.generate([r.prompt for r in requests], params, use_tqdm=False)
    entropies = tap_entropies(sink_folder, {r.id for r in requests})
    tap_surprisals = tap_entropies(sink_folder, {r.id for r in requests}, field="surprisal_values")
    # the entropy at each request's own temperature (none for greedy requests)
    sampling = tap_entropies(sink_folder, {r.id for r in requests}, field="sampling_values")
    tokenizer = llm.get_tokenizer()
    traces = []
    for request, output in zip(requests, outputs):
        token_ids = list(output.outputs[0].token_ids)
        surprisal = [
            round(-float(position[token].logprob), 4)
            for token, position in zip(token_ids, output.outputs[0].logprobs or [])
        ]
        if len(surprisal) != len(token_ids):
            raise RuntimeError(
                f"{request.id}: vLLM returned {len(surprisal)} logprobs for {len(token_ids)} tokens"
            )
        values = entropies[request.id]
        if len(values) != len(token_ids):
            raise RuntimeError(
                f"{request.id}: the tap shipped {len(values)} entropies for {len(token_ids)} tokens"
            )
        hot = sampling[request.id]
        if len(hot) != (len(token_ids) if request.regime.temperature > 0 else 0):
            raise RuntimeError(
                f"{request.id}: the tap shipped {len(hot)} sampling entropies for {len(token_ids)} tokens "
                f"at temperature {request.regime.temperature}"
            )
        traces.append(
            {
                "id": request.id,
                "model": MODEL_NAME,
                "entropy": [round(v, 4) for v in values],
                "token_ids": token_ids,
                "surprisal": surprisal,
                "tap_surprisal": [round(v, 4) for v in tap_surprisals[request.id]],  # not stored: checked
                "sampling_entropy": [round(v, 4) for v in hot],
                "prompt_token_ids": list(output.prompt_token_ids),
                "text": decode(tokenizer, token_ids),
                "request": request,
            }
        )
    return traces


def lexicon() -> Lexicon:
    documents = corpus_documents()
    return Lexicon.from_texts(
        (d.text for d in documents if d.lang == "en"),
        (d.text for d in documents if d.lang == "zh"),
    )


def to_line(trace: dict, lex: Lexicon, model_folder: Path) -> dict:
    request: Request = trace["request"]
    labelled = label(trace["text"], lex)
    return {
        "id": trace["id"],
        "model": trace["model"],
        "entropy": trace["entropy"],
        "token_ids": trace["token_ids"],
        "surprisal": trace["surprisal"],
        **({"sampling_entropy": trace["sampling_entropy"]} if trace["sampling_entropy"] else {}),
        "label": {"loop": labelled["loop"], "gibberish": labelled["gibberish"]},
        "generator": {
            "source": "tests/corpora/lm_traces.py",
            "model_folder": model_folder.name,
            "weights_sha256": weights_sha256(model_folder),
            "lang": request.lang,
            "regime": request.regime.name,
            "temperature": request.regime.temperature,
            "top_p": request.regime.top_p,
            "prompt": request.prompt,
            "text": trace["text"],
            "label_evidence": labelled["evidence"],
        },
    }


def write_lines(lines: list[dict], path: Path) -> None:
    path.write_text("".join(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n" for line in lines))


def write_split(lines: list[dict], outputs: dict[str, Path] = OUTPUTS) -> None:
    """Each line to its split's file, in generation order."""
    for split, path in outputs.items():
        write_lines([line for line in lines if split_of(line["id"]) == split], path)


def run_engine(requests: list[Request], model_folder: Path) -> list[dict]:
    """Serve the model with vLLM and the tap and generate ``requests`` (one trace dict each)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="entroloop-lm-traces-") as tmp:
        sink = Path(tmp) / "sink"
        os.environ.update(tap_environment(sink))
        print(f"[lm-traces] serving {model_folder.name} with vLLM + tap; {len(requests)} requests", file=sys.stderr)
        started = time.monotonic()
        llm = start_engine(model_folder)
        try:
            traces = generate(llm, requests, sink)
        finally:
            stop_engine(llm)
        print(f"[lm-traces] generated in {time.monotonic() - started:.0f}s", file=sys.stderr)
    return traces


def main(split: str = "dev+test", count_per_lang: int = 30, model_folder: Path | None = None) -> None:
    """Rewrite DEV and TEST, or write the FRESH split, or the READ split (unlabelled, with its
    reading sheet: a reader labels it, then ``--apply-read-labels``)."""
    model_folder = model_folder or tiny_lm(TinyLMConfig())
    if split == "fresh":
        used = frozenset(line["generator"]["prompt"] for line in read_lines().values())
        requests, paths = plan_fresh_requests(used), [FRESH_OUTPUT]
    elif split in READ_SPLITS:
        requests, paths = read_split_requests(split), [READ_OUTPUTS[split]]
    elif split == "dev2":
        requests, paths = dev2_requests(), [DEV2_OUTPUT]
    else:
        requests, paths = plan_requests(count_per_lang), list(OUTPUTS.values())
    lex = lexicon()
    lines = [to_line(t, lex, model_folder) for t in run_engine(requests, model_folder)]
    loops = sum(line["label"]["loop"] for line in lines)
    gibberish = sum(line["label"]["gibberish"] for line in lines)
    if split == "fresh":
        write_lines(lines, FRESH_OUTPUT)
    elif split == "dev2":
        write_lines(lines, DEV2_OUTPUT)
    elif split in READ_SPLITS:
        # The text rules' verdict stays beside the reader's, never in ``label``.
        for line in lines:
            line["generator"]["rule_label"] = line.pop("label")
        write_lines(lines, READ_OUTPUTS[split])
        READING.mkdir(exist_ok=True)
        write_reading_sheet(lines, READING / f"{split}_sheet.md")
    else:
        write_split(lines)
        print("[lm-traces] DEV's labels are the text rules' again: if its texts did not change, --apply-read-labels "
              "restores the reader's; if they did, reading/dev_sheet.md must be written and read again", file=sys.stderr)
    report = training_report(model_folder)
    print(
        f"[lm-traces] wrote {len(lines)} traces to {', '.join(str(p) for p in paths)}: {loops} loop, {gibberish} gibberish "
        f"(model {report['parameters'] / 1e6:.2f} M parameters, final loss {report['final_loss_nats']} nats)",
        file=sys.stderr,
    )


def relabel(outputs: dict[str, Path] | None = None) -> list[tuple[str, dict, dict]]:
    """Labels recomputed from each checked-in line's decoded text (no model, no engine): what a
    change to ``tests.corpora.text_labels`` does to the files (default: DEV, TEST and the READ splits).
    Returns (id, old, new) per change."""
    outputs = outputs or {**OUTPUTS, **READ_OUTPUTS}
    lex = lexicon()
    changed = []
    for path in outputs.values():
        lines = [json.loads(raw) for raw in path.read_text().splitlines()]
        for line in lines:
            labelled = label(line["generator"]["text"], lex)
            new = {"loop": labelled["loop"], "gibberish": labelled["gibberish"]}
            # A reader's label stays; the rules' verdict beside it follows the rules.
            field, holder = ("rule_label", line["generator"]) if "rule_label" in line["generator"] else ("label", line)
            if new != holder[field]:
                changed.append((line["id"], holder[field], new))
            holder[field], line["generator"]["label_evidence"] = new, labelled["evidence"]
        write_lines(lines, path)
    return changed


def _command_line(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.corpora.lm_traces",
        description="Write or label the real (tiny) LM's labelled trace splits (tests/data/entropy/). "
                    "With no option: rewrite lm_traces_dev.jsonl and lm_traces_test.jsonl.")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--fresh", action="store_true", help="write lm_traces_fresh.jsonl: new prompts, never tuned on")
    what.add_argument("--read", choices=READ_SPLITS, metavar="NAME",
                      help=f"write lm_traces_NAME.jsonl unlabelled, and reading/NAME_sheet.md for a reader "
                           f"(NAME: {', '.join(READ_SPLITS)})")
    what.add_argument("--dev2", action="store_true",
                      help="write lm_traces_dev2.jsonl (new prompts, with sampling entropies; labelled by the text rules)")
    what.add_argument("--add-sampling", choices=READ_SPLITS, metavar="NAME",
                      help="regenerate READ split NAME with this machine's model and add the tap's sampling entropies "
                           "to its lines (refused unless the texts reproduce exactly)")
    what.add_argument("--apply-read-labels", action="store_true",
                      help="label the READ splits and DEV from reading/*_labels.jsonl")
    what.add_argument("--relabel", action="store_true",
                      help="recompute the text rules' labels from the stored texts (no model; a reader's label "
                           "stays, the rules' verdict beside it is updated)")
    args = parser.parse_args(argv)
    if args.relabel:
        for trace_id, old, new in relabel():
            print(f"[lm-traces] {trace_id}: {old} -> {new}", file=sys.stderr)
    elif args.apply_read_labels:
        for traces, labels in READER_LABELS.items():
            if traces.exists() and not labels.exists():
                print(f"[lm-traces] {traces.name}: not read yet ({labels} missing), left unlabelled", file=sys.stderr)
            elif traces.exists():
                print(f"[lm-traces] labelled {apply_read_labels(traces, labels)} lines of {traces} from {labels}", file=sys.stderr)
    elif args.add_sampling:
        added = add_sampling_entropies(READ_OUTPUTS[args.add_sampling], read_split_requests(args.add_sampling),
                                       tiny_lm(TinyLMConfig()))
        print(f"[lm-traces] {READ_OUTPUTS[args.add_sampling].name}: sampling entropies added to {added} lines", file=sys.stderr)
    else:
        main("fresh" if args.fresh else "dev2" if args.dev2 else args.read or "dev+test")


if __name__ == "__main__":
    _command_line(sys.argv[1:])
