"""The kinds of rule a setting can have (a whole number in a range, seconds, a choice, a URL, ...):
each a :class:`Rule` that says what it wants and why a value is refused. The table of which
tunable has which rule is tritonfleet.settings.check.RULES.

This module imports nothing of tritonfleet (settings layer).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from . import origin_stores


@dataclass(frozen=True)
class Rule:
    """What a setting may hold: ``test(value)`` returns why not (None: fine); ``what`` says what
    is wanted, in the words of the refusal."""

    what: str
    test: Callable[[Any], str | None]

    def problem(self, value: Any) -> str | None:
        return self.test(value)


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return (
        isinstance(v, (int, float)) and not isinstance(v, bool) and not (isinstance(v, float) and not math.isfinite(v))
    )


def quoted_number(v: Any) -> str:
    """A hint for a number written as text."""
    if isinstance(v, str):
        try:
            float(v)
        except ValueError:
            return ""
        return f" (write {v} without quotes)"
    return ""


def whole(lo: int | None = None, hi: int | None = None, none: bool = False, unit: str = "") -> Rule:
    """A whole number in [lo, hi] (``none``: or None)."""
    span = (
        f"from {lo} to {hi}"
        if lo is not None and hi is not None
        else f">= {lo}"
        if lo is not None
        else f"<= {hi}"
        if hi is not None
        else ""
    )
    what = f"a whole number{' of ' + unit if unit else ''} {span}".strip() + (" or None" if none else "")

    def test(v):
        if v is None and none:
            return None
        if not is_int(v):
            return f"must be {what}{quoted_number(v)}"
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            return f"must be {what}"
        return None

    return Rule(what, test)


def number(
    lo: float | None = None, hi: float | None = None, lo_open: bool = False, none: bool = False, unit: str = ""
) -> Rule:
    """A number (whole or not) in [lo, hi], or (lo, hi] with ``lo_open``."""
    low = (f"> {lo:g}" if lo_open else f">= {lo:g}") if lo is not None else ""
    span = f"{low}{' and ' if low and hi is not None else ''}{f'<= {hi:g}' if hi is not None else ''}"
    what = f"a number{' of ' + unit if unit else ''} {span}".strip() + (" or None" if none else "")

    def test(v):
        if v is None and none:
            return None
        if not is_number(v):
            return f"must be {what}{quoted_number(v)}"
        if lo is not None and (v <= lo if lo_open else v < lo):
            return f"must be {what}"
        if hi is not None and v > hi:
            return f"must be {what}"
        return None

    return Rule(what, test)


def seconds(lo_open: bool = True, none: bool = False) -> Rule:
    """A duration in seconds: > 0 (``lo_open``), else >= 0 (0: do not wait)."""
    return number(0, lo_open=lo_open, none=none, unit="seconds")


def flag() -> Rule:
    def test(v):
        return None if isinstance(v, bool) else f"must be True or False{quoted_bool(v)}"

    return Rule("True or False", test)


def quoted_bool(v: Any) -> str:
    if isinstance(v, str) and v.lower() in ("true", "false", "yes", "no"):
        return f" (write {v.lower() in ('true', 'yes')} without quotes)"
    return ""


def text(none: bool = False, empty: bool = True, digits_ok: bool = False, padded: bool = True) -> Rule:
    """A string (``none``: or None; ``empty``: "" allowed; ``digits_ok``: a whole number too,
    as pyinfra's --data turns "580" into 580; ``padded``: leading or trailing white space allowed,
    which an image reference, for one, never has)."""
    what = (
        "a string"
        + ("" if empty else " (not empty)")
        + (" or a whole number" if digits_ok else "")
        + (" or None" if none else "")
    )

    def test(v):
        if v is None and none:
            return None
        if digits_ok and is_int(v) and v >= 0:
            return None
        if isinstance(v, (bool, int, float)):  # pyinfra's --data turns true, false and numbers into values
            bare = str(v).lower() if isinstance(v, bool) else str(v)
            kind = "a boolean" if isinstance(v, bool) else "a number"
            return f"must be {what} (a bare {bare} is read as {kind}: quote it, in --data as NAME='\"{bare}\"')"
        if not isinstance(v, str):
            return f"must be {what}"
        if not empty and not v.strip():
            return f"must be {what}"
        if not padded and v != v.strip():
            return f"must be {what} without leading or trailing white space (write {v.strip()!r})"
        return None

    return Rule(what, test)


def name_list() -> Rule:
    """Names (a list of strings): a dict of names and values is told that only the names go here."""
    what = "a list of names (strings)"

    def test(v):
        if isinstance(v, dict):
            return (
                f"must be {what}: the names only, e.g. extra_host_data = {sorted(map(str, v))!r}, each value "
                'set as data of its own (webhook_token = "...")'
            )
        return text_list().problem(v)

    return Rule(what, test)


def absolute_path() -> Rule:
    """An absolute path (on the host: a relative one would depend on the directory a unit runs in)."""
    what = "an absolute path (starting with /)"

    def test(v):
        if not isinstance(v, str) or not v.startswith("/") or v != v.strip():
            return f"must be {what}"
        return None

    return Rule(what, test)


def choice(*values: Any) -> Rule:
    shown = ", ".join(repr(v) for v in values)
    what = f"one of {shown}"

    def test(v):
        if isinstance(v, bool) and not any(isinstance(c, bool) for c in values):
            return f"must be {what}"
        if v in values:
            return None
        near = (
            [c for c in values if isinstance(c, str) and difflib.get_close_matches(str(v), [c], n=1, cutoff=0.6)]
            if isinstance(v, str)
            else []
        )
        if near:
            return f"must be {what} (did you mean {near[0]!r}?)"
        # a number of the list written as text gets the hint every number's rule gives
        return f"must be {what}" + (quoted_number(v) if any(is_number(c) for c in values) else "")

    return Rule(what, test)


def text_list(none: bool = False) -> Rule:
    what = "a list of strings" + (" or None" if none else "")

    def test(v):
        if v is None and none:
            return None
        if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
            return f"must be {what}" + (' (write it in brackets: ["..."])' if isinstance(v, str) else "")
        return None

    return Rule(what, test)


def mapping(value: Rule | None = None, what_value: str = "") -> Rule:
    what = "a dict" + (f" of name -> {what_value or value.what}" if value else "")

    def test(v):
        if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
            return f"must be {what}"
        if value is not None:
            for k, x in v.items():
                why = value.problem(x)
                if why:
                    return f"[{k!r}] = {x!r} {why}"
        return None

    return Rule(what, test)


def dict_of_dicts() -> Rule:
    def test(v):
        return None if isinstance(v, dict) else "must be a dict"

    return Rule("a dict", test)


def xid_list() -> Rule:
    """Xid numbers: a list of whole numbers > 0 (NVIDIA's Xid catalog numbers them from 1)."""
    what = "a list of Xid numbers (whole numbers > 0)"

    def test(v):
        if not isinstance(v, (list, tuple)) or not all(is_int(x) and x > 0 for x in v):
            return f"must be {what}" + (" (write it in brackets: [48, 79])" if is_int(v) else "")
        return None

    return Rule(what, test)


#: a quarantine budget written as text: "N" hosts or "P%" of the group (the receiver's own
#: parser, tritonfleet.fleet.quarantine.planning.budget_limit, reads the same forms)
_BUDGET = re.compile(r"^\s*([0-9]+)\s*(%?)\s*$")


def budget() -> Rule:
    """Hosts of a group that may be out at once: a whole number >= 0, or "P%" with P from 0 to 100."""
    what = 'a whole number of hosts >= 0 or "P%" of the group (0 to 100)'

    def test(v):
        if is_int(v):
            return None if v >= 0 else f"must be {what}"
        m = _BUDGET.match(v) if isinstance(v, str) else None
        if not m or (m.group(2) and int(m.group(1)) > 100):
            return f"must be {what}{quoted_number(v)}"  # "-1" as text: the hint, as every number's rule gives
        if not m.group(2):  # "25": hosts or a percentage? the text form is for P% only
            return f"must be {what} (write {m.group(1)} without quotes or '{m.group(1)}%')"
        return None

    return Rule(what, test)


#: a rollout's capacity limit: "N" hosts or "P%" of a backend's servers (P may have decimals;
#: tritonfleet.fleet.rollout.capacity.parse_limit reads the same forms)
_LIMIT = re.compile(r"^\s*[0-9]+\s*$")
_LIMIT_PERCENT = re.compile(r"^\s*([0-9]+(\.[0-9]+)?)%\s*$")


def capacity_limit(none: bool = True) -> Rule:
    """Hosts of a load balancer's backend: a whole number >= 0, or "P%" of its servers with
    0 < P <= 100 (a rollout's rollout_max_unavailable, rollout_min_available)."""
    what = 'a whole number of hosts >= 0 or a percentage of the backend\'s servers like "25%"' + (
        " or None" if none else ""
    )

    def test(v):
        if v is None and none:
            return None
        if is_int(v):
            return None if v >= 0 else f"must be {what}"
        if isinstance(v, str) and _LIMIT.match(v) and str(int(v)) == v.strip():
            return None
        m = _LIMIT_PERCENT.match(v) if isinstance(v, str) else None
        if not m or not 0 < float(m.group(1)) <= 100:
            return f"must be {what}"
        return None

    return Rule(what, test)


def listen_address(none: bool = False) -> Rule:
    """ "address:port" to listen on (an IPv6 address in brackets; an empty address: every one),
    port 0-65535 (0: one the system picks)."""
    what = '"address:port" (e.g. "127.0.0.1:9469")' + (" or None" if none else "")

    def test(v):
        if v is None and none:
            return None
        if not isinstance(v, str):
            return f"must be {what}"
        addr, sep, port = v.rpartition(":")
        if not sep or not port.isdigit() or int(port) > 65535 or any(c.isspace() for c in addr):
            return f"must be {what}"
        return None

    return Rule(what, test)


EVERY_ADDRESS = ("", "0.0.0.0", "::", "[::]", "*")


def named_address() -> Rule:
    """One address (an IP address or a host name, no port) or None; never every address."""
    what = 'one address of the host (e.g. "10.0.0.5", no port) or None, never every address (0.0.0.0, ::)'

    def test(v):
        if v is None:
            return None
        if (
            not isinstance(v, str)
            or v.strip() in EVERY_ADDRESS
            or any(c.isspace() for c in v)
            or not re.fullmatch(r"[A-Za-z0-9.\-]+|\[?[0-9A-Fa-f:.]+\]?", v)
        ):
            return f"must be {what}"
        return None

    return Rule(what, test)


def login_name() -> Rule:
    """A registry login name as htpasswd files and Basic credentials hold it: a word of letters,
    digits and ``._@-`` (no ':', which ends the name, no white space)."""
    what = "a login name (letters, digits, '.', '_', '@', '-')"

    def test(v):
        if not isinstance(v, str) or not re.fullmatch(r"[A-Za-z0-9._@-]{1,64}", v):
            return f"must be {what}"
        return None

    return Rule(what, test)


def url(*schemes: str, none: bool = False) -> Rule:
    """A URL of one of ``schemes`` with a server part, and no white space, quote or backslash
    (the host-side fetch writes URLs into curl's config file in double quotes: see
    tritonfleet.model_repo.origin, which refuses the same)."""
    shown = " or ".join(f"{s}://..." for s in schemes)
    what = f"a URL ({shown})" + (" or None" if none else "")

    def test(v):
        if v is None and none:
            return None
        if not isinstance(v, str):
            return f"must be {what}"
        parts = urlsplit(v)
        if parts.scheme not in schemes or not parts.netloc:
            return f"must be {what}"
        if not URL_SAFE.match(v):
            return f"must be {what} without white space, quotes or backslashes (percent-encode them)"
        return None

    return Rule(what, test)


def origin_url(none: bool = False) -> Rule:
    """:func:`url` of a scheme in the table of model origin stores
    (tritonfleet.settings.origin_stores, read when a value is checked), then that store's own URL
    rule (an s3:// URL's bucket as S3 names buckets: refused at load, not at the first upload)."""

    def test(v):
        if not origin_stores.STORES and v is not None:
            return (
                "cannot be checked: no model origin store is loaded (tritonfleet.model_repo.origin fills "
                "tritonfleet.settings.origin_stores.STORES)"
            )
        base = url(*origin_stores.schemes(), none=none)
        why = base.problem(v)
        if why is None and isinstance(v, str):
            bad = origin_stores.store_of(v).url_problem(v)
            return f"must be {base.what}: {bad}" if bad else None
        return why

    return Rule("a URL of a model origin store" + (" or None" if none else ""), test)


#: the characters tritonfleet.model_repo.origin lets through into curl's config file (in double quotes)
URL_SAFE = re.compile(r"^[A-Za-z0-9._~:/?#\[\]@!$&'()*+,;=%-]+$")


def http_url(none: bool = False) -> Rule:
    """An http:// or https:// URL (the quarantine receiver's, Alertmanager's)."""
    return url("http", "https", none=none)
