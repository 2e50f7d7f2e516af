"""PII redaction that runs on the serving node, before a prompt or answer leaves it.

Entities: e-mail addresses, phone numbers (Chinese mobiles, ``+``-prefixed international numbers,
North-American ``(555) 123-4567`` style), bank card numbers (13–19 digits passing the Luhn check),
Chinese resident identity numbers (18 characters, GB 11643 check digit incl. ``X``), IPv4 and IPv6
addresses. Candidates are found by regular expressions and kept only when they validate
(Luhn, ID check digit, ``ipaddress``), so order numbers and dates are left alone.

Each entity becomes ``[TYPE:pseudonym]`` where the pseudonym is a keyed hash (HMAC-SHA256 with
``ENTROLOOP_PII_HASH_KEY``) of the normalised value: the same e-mail in the audit log and in a
feedback record gets the same pseudonym, so joins keep working, while without the key the value
cannot be recovered by hashing guesses. Counts per entity type are returned for the Audit record's
``redactions`` field.

Pure standard library: no torch, no model.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from entroloop.contract.settings import Settings

PSEUDONYM_HEX_CHARS = 16  # 64 bits: collisions are negligible at audit-log scale

_CN_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_CN_ID_CHECK = "10X98765432"


def luhn_valid(digits: str) -> bool:
    """The Luhn checksum every payment card number carries in its last digit."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def cn_id_valid(value: str) -> bool:
    """GB 11643-1999 check digit of an 18-character Chinese resident identity number."""
    if len(value) != 18 or not value[:17].isdigit():
        return False
    total = sum(int(c) * w for c, w in zip(value[:17], _CN_ID_WEIGHTS))
    return _CN_ID_CHECK[total % 11] == value[17].upper()


def _ipv6_valid(value: str) -> bool:
    try:
        ipaddress.IPv6Address(value)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class _Detector:
    kind: str
    pattern: re.Pattern[str]
    normalise: Callable[[str], str]
    valid: Callable[[str], bool] = lambda _: True


def _digits(value: str) -> str:
    return re.sub(r"\D", "", value)


def _phone_key(digits: str) -> str:
    """One form per number, so ``+86 138 1234 5678`` and ``13812345678`` share a pseudonym."""
    if len(digits) == 13 and digits.startswith("861") and digits[3] in "3456789":
        return digits[2:]
    return digits


# Order = priority when two candidates overlap (an ID number contains card-like digit runs).
_DETECTORS: tuple[_Detector, ...] = (
    _Detector(
        "email",
        re.compile(r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}(?![\w-])"),
        str.lower,
    ),
    _Detector(
        "cn_id",
        re.compile(
            r"(?<![0-9A-Za-z])[1-9]\d{5}(?:18|19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])\d{3}[\dXx]"
            r"(?![0-9A-Za-z])"
        ),
        str.upper,
        cn_id_valid,
    ),
    _Detector(
        "bank_card",
        re.compile(r"(?<![\d+-])\d(?:[ -]?\d){12,18}(?![\d-])"),
        _digits,
        lambda v: 13 <= len(_digits(v)) <= 19 and luhn_valid(_digits(v)),
    ),
    _Detector(
        "ipv6",
        re.compile(
            r"(?<![0-9A-Fa-f:.])(?:[0-9A-Fa-f]{0,4}:){2,7}(?:(?:\d{1,3}\.){3}\d{1,3}|[0-9A-Fa-f]{1,4})?"
            r"(?![0-9A-Fa-f:]|\.\d)"
        ),
        lambda v: ipaddress.IPv6Address(v).compressed,
        _ipv6_valid,
    ),
    _Detector(
        "ipv4",
        re.compile(r"(?<![\d.])(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?!\.?\d)"),
        str,
    ),
    _Detector(
        "phone",
        re.compile(
            r"(?<![\w+])(?:"
            r"(?:\+?86[ -]?)?1[3-9]\d(?:[ -]?\d{4}){2}"  # Chinese mobile, optionally +86
            r"|\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?){2,5}"  # international, E.164-like with +
            r"|\(?\d{3}\)?[ .-]\d{3}[ .-]\d{4}"  # North American
            r")(?!\w)"
        ),
        lambda v: _phone_key(_digits(v)),
        lambda v: 7 <= len(_digits(v)) <= 15,
    ),
)

ENTITY_TYPES: tuple[str, ...] = tuple(d.kind for d in _DETECTORS)


@dataclass(frozen=True)
class Redacted:
    """A redacted text and how many entities of each type it contained."""

    text: str
    counts: dict[str, int] = field(default_factory=dict)


class PiiRedactor:
    """Replaces PII with keyed pseudonyms. Thread-safe (no mutable state)."""

    def __init__(self, key: bytes | str | None) -> None:
        """``key=None``: a random per-process key (pseudonyms then join only within this process)."""
        self.ephemeral = key is None or key == b"" or key == ""
        if self.ephemeral:
            key = os.urandom(32)
        self._key = key.encode() if isinstance(key, str) else key

    @classmethod
    def from_settings(cls, settings: Settings) -> PiiRedactor:
        """Keyed by ENTROLOOP_PII_HASH_KEY; empty means a random key, which breaks cross-node joins."""
        return cls(settings.pii_hash_key.get_secret_value() or None)

    def pseudonym(self, kind: str, value: str) -> str:
        """Keyed hash of a normalised value, domain-separated by entity type."""
        mac = hmac.new(self._key, f"{kind}\x00{value}".encode(), hashlib.sha256)
        return mac.hexdigest()[:PSEUDONYM_HEX_CHARS]

    def pseudonymise_user(self, user_id: str) -> str:
        """The pseudonymous user id carried by Audit and Feedback records."""
        return self.pseudonym("user", user_id) if user_id else ""

    def find(self, text: str) -> list[tuple[int, int, str, str]]:
        """Validated, non-overlapping entities as (start, end, kind, normalised value)."""
        taken: list[tuple[int, int, str, str]] = []
        for detector in _DETECTORS:
            for match in detector.pattern.finditer(text):
                start, end, raw = match.start(), match.end(), match.group()
                if any(start < e and s < end for s, e, _, _ in taken):
                    continue
                if not detector.valid(raw):
                    continue
                taken.append((start, end, detector.kind, detector.normalise(raw)))
        taken.sort()
        return taken

    def redact(self, text: str) -> Redacted:
        """Replace every entity by ``[KIND:pseudonym]``; count entities per kind."""
        entities = self.find(text)
        if not entities:
            return Redacted(text, {})
        parts: list[str] = []
        counts: Counter[str] = Counter()
        cursor = 0
        for start, end, kind, value in entities:
            parts.append(text[cursor:start])
            parts.append(f"[{kind.upper()}:{self.pseudonym(kind, value)}]")
            counts[kind] += 1
            cursor = end
        parts.append(text[cursor:])
        return Redacted("".join(parts), dict(counts))


__all__ = ["ENTITY_TYPES", "PiiRedactor", "Redacted", "cn_id_valid", "luhn_valid"]
