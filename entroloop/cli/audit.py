"""``entroloop audit``: verify the write-once audit log (against signed checkpoints kept outside it
when a public key is given), make the signing key pair, and read records back by one narrow key:
audit records by audit id or user id, action records by action id or alert key."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from entroloop.cli.common import settings_or_exit
from entroloop.contract.settings import Settings

console = Console(stderr=True)

audit_app = typer.Typer(
    name="audit",
    help="The WORM audit log: verify its tamper evidence; read audit records by audit id or user id, "
    "action records by action id or alert key, quarantined dead-letter payloads by dead-letter id.",
    no_args_is_help=True,
)

DataDir = Annotated[
    Path | None,
    typer.Option("--data-dir", "-d", help="Embedded data folder holding worm/ (default: ENTROLOOP_DATA_DIR)."),
]
Store = Annotated[
    str | None,
    typer.Option("--store", help="`local` or `s3` (default: ENTROLOOP_AUDIT_STORE; s3 uses ENTROLOOP_S3_*)."),
]


def _settings(data_dir: Path | None, store: str | None) -> Settings:
    overrides: dict[str, Any] = {}
    if data_dir:
        overrides["data_dir"] = data_dir
    if store:
        overrides["audit_store"] = store
    return settings_or_exit(**overrides)


def _store(settings: Settings):
    from entroloop.infra.worm.stores import local_store_path, open_worm_store

    if settings.audit_store == "local" and not local_store_path(settings).exists():
        console.print(f"[red]{local_store_path(settings)} holds no audit log[/red] (wrong --data-dir?)")
        raise typer.Exit(2)
    try:
        return open_worm_store(settings)
    except ValueError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None


PublicKey = Annotated[
    Path | None,
    typer.Option("--public-key", help="Ed25519 public key (PEM) that checks the signed checkpoints "
                 "(default: ENTROLOOP_AUDIT_PUBLIC_KEY_FILE)."),
]
CheckpointFiles = Annotated[
    list[Path] | None,
    typer.Option("--checkpoint", help="A checkpoint file or folder of them, kept outside the log (repeatable); "
                 "read besides ClickHouse, the S3 store and ENTROLOOP_AUDIT_CHECKPOINT_DIR."),
]


def _checkpoints(settings: Settings, worm: Any, public_key: Path | None, files: list[Path] | None) -> Any:
    """Every valid signed checkpoint of this log (a ``CheckpointSet``), or None without a public key."""
    from entroloop.infra.worm.anchors import log_name, read_checkpoints, reader_anchors
    from entroloop.infra.worm.checkpoints import KeyFileError, load_public_key

    key_file = public_key or settings.audit_public_key_file
    if key_file is None:
        if files:
            console.print("[red]--checkpoint needs --public-key (or ENTROLOOP_AUDIT_PUBLIC_KEY_FILE) to check signatures[/red]")
            raise typer.Exit(2)
        return None
    try:
        key = load_public_key(key_file)
    except KeyFileError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    anchors, errors = reader_anchors(settings, worm, files)
    return read_checkpoints(anchors, log_name(settings), key, errors)


def _signed_only(worm: Any, checkpoints: Any, records: Iterator[dict[str, Any]], withheld: list[str]) -> Iterator[dict[str, Any]]:
    """``records`` whose file hashes to what a manifest linked to a signed checkpoint records
    (``covered_files``); the keys of files whose records are held back are appended to ``withheld``."""
    import hashlib

    from entroloop.infra.worm.checkpoints import covered_files

    covered = covered_files(worm, checkpoints)
    file_ok: dict[str, bool] = {}
    for record in records:
        key = record["_object"]
        if key not in file_ok:
            file_ok[key] = key in covered and hashlib.sha256(worm.get(key)).hexdigest() == covered[key]
        if file_ok[key]:
            yield record
        else:
            withheld.append(key)
            console.print(f"[red]withheld[/red] a record in {key}: its batch is covered by no valid signed "
                          "checkpoint (forged or rewritten?); run `entroloop audit verify`")


def _storage_error(exc: Exception) -> None:
    """Say what went wrong with the store in one line (no stack trace) and exit 2."""
    console.print(f"[red]audit store error:[/red] {type(exc).__name__}: {exc}")
    raise typer.Exit(2) from None


def _is_storage_error(exc: Exception) -> bool:
    from entroloop.infra.worm.s3_store import S3Unavailable

    return isinstance(exc, (S3Unavailable, OSError)) or type(exc).__module__.startswith("botocore")


@audit_app.command()
def verify(
    data_dir: DataDir = None,
    store: Store = None,
    public_key: PublicKey = None,
    checkpoint: CheckpointFiles = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
) -> None:
    """Recompute every hash, Merkle root and chain link and, with a public key, hold the log against
    every signed checkpoint kept outside it; exit 1 naming each problem found."""
    from entroloop.sinks.audit.verify import verify_store

    try:
        settings = _settings(data_dir, store)
        worm = _store(settings)
        report = verify_store(worm, _checkpoints(settings, worm, public_key, checkpoint))
    except Exception as exc:
        if not _is_storage_error(exc):
            raise
        _storage_error(exc)
    if as_json:
        print(json.dumps(report.as_dict()))
    else:
        for problem in report.problems:
            console.print(f"[red]{problem.kind}[/red] {escape(problem.key)}: {escape(problem.detail)}")
        verdict = "[green]intact[/green]" if report.ok else f"[red]{len(report.problems)} problem(s)[/red]"
        per_topic = ", ".join(f"{topic}: {n}" for topic, n in sorted(report.records_by_topic.items()))
        console.print(
            f"{report.store}: {verdict} — {report.chains} chains, {report.batches} batches, {report.files} files, "
            f"{report.records} records{f' ({per_topic})' if per_topic else ''}, "
            f"{report.bytes / 1e6:.1f} MB in {report.seconds:.2f}s"
        )
        _print_anchor(report.anchor)
    if not report.ok:
        raise typer.Exit(1)


def _print_anchor(anchor: dict[str, Any]) -> None:
    """Say what the log was checked against: the newest signed checkpoint, or that there was none."""
    newest = anchor.get("newest")
    if not newest:
        reason = "no public key given (--public-key)" if anchor.get("public_key") is None else "no valid checkpoint"
        console.print(f"[yellow]only internal consistency was checked[/yellow] ({reason}): a truncation, a deleted "
                      "chain or a consistent rewrite of the folder would pass unnoticed")
    else:
        import datetime as dt

        when = dt.datetime.fromtimestamp(float(newest["created_at"]), dt.UTC).isoformat(timespec="seconds")
        console.print(f"checked against {anchor['checkpoints_valid']} signed checkpoint(s) (key {anchor['public_key']}); "
                      f"newest: {escape(str(newest['source']))} at {when}, {newest['batches']} batches, "
                      f"signed by {newest['key_fingerprint']}")
    for error in anchor.get("source_errors") or []:
        console.print(f"[yellow]anchor not read:[/yellow] {escape(error)}")


def _print_lookup(settings: Settings, topic: str, column: str, value: str, what: str,
                  public_key: Path | None = None, checkpoint: list[Path] | None = None) -> None:
    """Print the records of ``topic`` whose ``column`` equals ``value`` as JSON lines; exit 1 if none.

    Audit records published in parts (too large for one record) are printed joined, whole.
    With a public key, a record is printed only if its batch is linked to a valid signed checkpoint
    (``_signed_only``): a forged or rewritten batch is withheld, named on stderr, and the exit
    status is 1. Without one, a warning says the answer is not anchored."""
    from entroloop.contract.records import Audit
    from entroloop.infra.worm.layouts import join_audit_parts
    from entroloop.infra.worm.reader import find_records

    found = 0
    withheld: list[str] = []
    try:
        worm = _store(settings)
        records = find_records(worm, column, value, topic=topic)
        checkpoints = _checkpoints(settings, worm, public_key, checkpoint)
        if checkpoints is None:
            console.print("[yellow]warning: no public key (--public-key / ENTROLOOP_AUDIT_PUBLIC_KEY_FILE): records are "
                          "not checked against a signed checkpoint and could come from a forged batch[/yellow]")
        else:
            records = _signed_only(worm, checkpoints, records, withheld)
        if topic == Audit.topic:
            records = join_audit_parts(records)
        for record in records:
            if record.get("parts_missing"):
                console.print(f"[red]audit {record['audit_id']} is incomplete:[/red] parts "
                              f"{record['parts_missing']} of {record['part_count']} are not in the log")
            print(json.dumps(record, ensure_ascii=False, default=str))
            found += 1
    except Exception as exc:
        if not _is_storage_error(exc):
            raise
        _storage_error(exc)
    if withheld:
        raise typer.Exit(1)
    if not found:
        console.print(f"no {what} with {column} = {value!r}")
        raise typer.Exit(1)


def _one_of(options: dict[str, str | None]) -> tuple[str, str]:
    """The (column, value) of the one option given; exit 2 unless exactly one was."""
    given = [(column, value) for column, value in options.items() if value is not None]
    if len(given) != 1:
        console.print(f"[red]give exactly one of {' or '.join('--' + c.replace('_', '-') for c in options)}[/red]")
        raise typer.Exit(2)
    return given[0]


@audit_app.command()
def get(
    audit_id: Annotated[str | None, typer.Option("--audit-id", help="The audit id of one answer.")] = None,
    user_id: Annotated[str | None, typer.Option("--user-id", help="Every record of one (pseudonymised) user id.")] = None,
    data_dir: DataDir = None,
    store: Store = None,
    public_key: PublicKey = None,
    checkpoint: CheckpointFiles = None,
) -> None:
    """Print the audit records of one audit id or one user id as JSON lines (the only read paths);
    with a public key, only records of batches covered by a valid signed checkpoint."""
    from entroloop.contract.records import Audit

    column, value = _one_of({"audit_id": audit_id, "user_id": user_id})
    _print_lookup(_settings(data_dir, store), Audit.topic, column, value, "audit record", public_key, checkpoint)


@audit_app.command()
def actions(
    action_id: Annotated[str | None, typer.Option("--action-id", help="The action id of one action record.")] = None,
    alert_key: Annotated[
        str | None,
        typer.Option("--alert-key", help="Every action about one alert key (retraining loop: trigger key or adapter id)."),
    ] = None,
    data_dir: DataDir = None,
    store: Store = None,
    public_key: PublicKey = None,
    checkpoint: CheckpointFiles = None,
) -> None:
    """Print the action records of one action id or one alert key as JSON lines, read from the
    write-once log through its manifests (the only read paths for actions); with a public key,
    only records of batches covered by a valid signed checkpoint."""
    from entroloop.contract.records import Action

    column, value = _one_of({"action_id": action_id, "alert_key": alert_key})
    _print_lookup(_settings(data_dir, store), Action.topic, column, value, "action record", public_key, checkpoint)


@audit_app.command()
def keygen(
    out: Annotated[Path, typer.Option("--out", help="Folder for the key pair, outside the data folder.")],
) -> None:
    """Make the Ed25519 key pair that signs audit checkpoints: the private key (0600) for
    ENTROLOOP_AUDIT_SIGNING_KEY_FILE on the writer, the public key for `audit verify --public-key`."""
    from entroloop.infra.worm.checkpoints import (
        KeyFileError,
        generate_key_pair,
        key_fingerprint,
        load_public_key,
    )

    try:
        private, public = generate_key_pair(out)
    except KeyFileError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    console.print(f"private key: {private} (0600; set ENTROLOOP_AUDIT_SIGNING_KEY_FILE on the audit writer)")
    console.print(f"public key:  {public} (give it to auditors: `entroloop audit verify --public-key {public}`)")
    print(key_fingerprint(load_public_key(public)))


@audit_app.command()
def quarantine(
    dead_letter_id: Annotated[str, typer.Argument(help="The event_id of one row of dead_letters (a UUID).")],
    out: Annotated[Path | None, typer.Option("--out", help="Write the bytes to this file (0600) instead of stdout.")] = None,
    data_dir: DataDir = None,
    store: Store = None,
) -> None:
    """Print the raw payload of one dead letter, kept in the write-once quarantine (by id only:
    dead_letters holds the reason, size and SHA-256, never the bytes, which may hold prompts)."""
    import sys

    from entroloop.infra.private_files import open_private
    from entroloop.infra.quarantine import NotQuarantined, quarantine_from_settings

    settings = _settings(data_dir, store)
    if settings.audit_store == "local" and not (settings.data_dir / "quarantine").is_dir():
        console.print(f"[red]{settings.data_dir / 'quarantine'} holds no quarantine[/red] (wrong --data-dir?)")
        raise typer.Exit(1)
    try:
        found = quarantine_from_settings(settings).get(dead_letter_id)
    except ValueError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    except NotQuarantined as exc:
        console.print(f"[red]{exc.args[0]}[/red] (in {settings.data_dir / 'quarantine'} or the S3 store's quarantine/)")
        raise typer.Exit(1) from None
    except Exception as exc:
        if _is_storage_error(exc):
            _storage_error(exc)
        raise
    console.print(f"{len(found.data)} bytes, sha256 {found.sha256} (compare dead_letters.payload_sha256), from {found.location}")
    if out is not None:
        with open_private(out, "wb") as fh:
            fh.write(found.data)
        return
    sys.stdout.buffer.write(found.data)
    sys.stdout.buffer.flush()


def register(app: typer.Typer) -> None:
    app.add_typer(audit_app, name="audit")
