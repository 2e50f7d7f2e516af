"""PII redaction: what is found, what is left alone, and that pseudonyms join."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from entroloop.contract.settings import Settings
from entroloop.infra.pii import (
    ENTITY_TYPES,
    PiiRedactor,
    cn_id15_valid,
    cn_id_valid,
    luhn_valid,
)

KEY = "test-key"
PLACEHOLDER = re.compile(r"\[([A-Z0-9_]+):([0-9a-f]{16})\]")


def kinds(text: str) -> list[str]:
    return [m.group(1).lower() for m in PLACEHOLDER.finditer(PiiRedactor(KEY).redact(text).text)]


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("write to Bob.Smith+x@Example.co.uk today", "email"),
        ("手机 13812345678 联系", "phone"),
        ("call +86 138 1234 5678", "phone"),
        ("call (555) 123-4567", "phone"),
        ("call +44 20 7946 0958", "phone"),
        ("card 4111 1111 1111 1111 exp", "bank_card"),
        ("card 5500-0000-0000-0004", "bank_card"),
        ("card 6011000990139424", "bank_card"),
        ("身份证 11010519491231002X 号", "cn_id"),
        ("id 11010519491231002x", "cn_id"),
        ("from 192.168.1.20.", "ipv4"),
        ("from 2001:db8::1 and", "ipv6"),
        ("mapped ::ffff:192.0.2.1", "ipv6"),
    ],
)
def test_each_entity_is_found(text: str, kind: str) -> None:
    assert kinds(text) == [kind]


@pytest.mark.parametrize(
    "text",
    [
        "card 4111 1111 1111 1112 fails Luhn",
        "id 110105194912310021 has a wrong check digit",
        "on 2026-11-29 at 08:25:44, ratio 3:2, version 1.2.3",
        "order #12345 costs 19.99, 300.400.500.600 is no address",
        "hash dead:beef and 12:30",
    ],
)
def test_look_alikes_are_left_alone(text: str) -> None:
    redacted = PiiRedactor(KEY).redact(text)
    assert redacted.text == text and redacted.counts == {}


def test_counts_and_surrounding_text() -> None:
    text = "a@b.io and c@d.io, card 4111111111111111, ip 10.0.0.1"
    redacted = PiiRedactor(KEY).redact(text)
    assert redacted.counts == {"email": 2, "bank_card": 1, "ipv4": 1}
    assert redacted.text.startswith("[EMAIL:") and ", card [BANK_CARD:" in redacted.text
    assert "4111" not in redacted.text and "@" not in redacted.text


def test_pseudonyms_join_across_formats_and_depend_on_the_key() -> None:
    a, b = PiiRedactor(KEY), PiiRedactor("other-key")

    def ids(redactor: PiiRedactor, text: str) -> list[str]:
        return [m.group(2) for m in PLACEHOLDER.finditer(redactor.redact(text).text)]

    # Same entity, different spellings: one pseudonym (joins work).
    assert ids(a, "+86 138 1234 5678") == ids(a, "13812345678")
    assert ids(a, "BOB@EXAMPLE.COM") == ids(a, "bob@example.com")
    assert ids(a, "4111-1111-1111-1111") == ids(a, "4111111111111111")
    assert ids(a, "2001:0db8:0000::1") == ids(a, "2001:db8::1")
    # Another key: another pseudonym (not a plain hash anyone can recompute).
    assert ids(a, "bob@example.com") != ids(b, "bob@example.com")
    # Entity types are domain-separated.
    assert a.pseudonym("email", "x") != a.pseudonym("phone", "x")
    assert a.pseudonymise_user("u1") == a.pseudonym("user", "u1") and a.pseudonymise_user("") == ""


def test_key_comes_from_settings() -> None:
    keyed = PiiRedactor.from_settings(Settings(pii_hash_key=SecretStr(KEY)))
    assert not keyed.ephemeral
    assert keyed.pseudonym("email", "x") == PiiRedactor(KEY).pseudonym("email", "x")
    assert PiiRedactor.from_settings(Settings()).ephemeral


def test_checksums() -> None:
    assert luhn_valid("4111111111111111") and not luhn_valid("4111111111111112")
    assert cn_id_valid("11010519491231002X") and not cn_id_valid("110105194912310021")
    assert cn_id15_valid("110105491231002") and not cn_id15_valid("110105491331002")  # month 13
    assert not cn_id15_valid("990105491231002")  # no province 99
    assert set(ENTITY_TYPES) == {
        "email", "phone", "landline", "iban", "bank_card", "cn_id", "passport", "ipv4", "ipv6", "name", "address"
    }


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200))
def test_redaction_is_total_and_idempotent(text: str) -> None:
    redactor = PiiRedactor(KEY)
    once = redactor.redact(text)
    assert sum(once.counts.values()) == len(PLACEHOLDER.findall(once.text)) - len(PLACEHOLDER.findall(text))
    twice = redactor.redact(once.text)
    assert twice.text == once.text and twice.counts == {}


def test_does_not_import_torch() -> None:
    code = "import sys, entroloop.infra.pii; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
