"""Bearer tokens: who may produce to, consume from and administer which topics.

The token file (YAML) lists one entry per client; topic patterns are shell globs (``orders-*``)::

    tokens:
      - name: orders-service
        token: "s3cr3t-orders"
        produce: ["orders", "orders-*"]
        consume: ["orders"]
      - name: ops
        token: "s3cr3t-ops"
        admin: true            # every topic, plus CreateTopic/UpdateTopic

Tokens are kept as SHA-256 digests and looked up by digest, so a lookup takes the same time whatever
the token. A call carries ``authorization: Bearer <token>`` metadata.

RocketMQ 5's clients sign instead of sending a secret: ``authorization: MQv2-HMAC-SHA1 Credential=<AK>,
SignedHeaders=x-mq-date-time, Signature=<hex HMAC-SHA1(SK, x-mq-date-time)>``. An entry's name is its
access key and its token the secret key (``Credentials(ak=name, sk=token)``); the signature is verified
with that secret, and a ``x-mq-date-time`` more than MAX_SIGNATURE_SKEW_S from the gateway's clock is
refused, so a captured header stops working. Names are unique for that reason. Neither a token nor its digest
is ever logged or put in an error message (a YAML syntax error names the line and column, not the
line's text). The gateway reloads the file when it changes (gateway/token_reload.py):
:meth:`TokenTable.replace` swaps the whole table at once, so a call sees the old or the new tokens.
"""

from __future__ import annotations

import enum
import fnmatch
import hashlib
import hmac
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from services.store.config import ConfigError

AUTHORIZATION = "authorization"
_BEARER = "bearer "
#: RocketMQ 5's signature scheme and the header it signs.
SIGNATURE_SCHEME = "MQv2-HMAC-SHA1"
DATE_TIME = "x-mq-date-time"
_DATE_TIME_FORMAT = "%Y%m%dT%H%M%SZ"
#: How far a signed request's x-mq-date-time may be from the gateway's clock (either way).
MAX_SIGNATURE_SKEW_S = 15 * 60


class Action(enum.Enum):
    PRODUCE = "produce"
    CONSUME = "consume"
    ADMIN = "admin"


class AuthError(Exception):
    """Base of the two refusals; the message says what to fix."""


class UnauthenticatedError(AuthError):
    pass


class PermissionDeniedError(AuthError):
    pass


@dataclass(slots=True, frozen=True)
class Principal:
    name: str
    produce: tuple[str, ...] = ()
    consume: tuple[str, ...] = ()
    admin: bool = False
    # (action, topic) -> allowed; topic patterns are matched once per topic, not per call.
    _decisions: dict[tuple[Action, str], bool] = field(default_factory=dict, compare=False, repr=False)

    def may(self, action: Action, topic: str) -> bool:
        if self.admin:
            return True
        decision = self._decisions.get((action, topic))
        if decision is None:
            patterns = {Action.PRODUCE: self.produce, Action.CONSUME: self.consume}.get(action, ())
            decision = any(fnmatch.fnmatchcase(topic, p) for p in patterns)
            if len(self._decisions) < 100_000:
                self._decisions[(action, topic)] = decision
        return decision


ANONYMOUS = Principal("anonymous", admin=True)


class TokenTable:
    """Empty table = auth off: every call acts as an admin."""

    def __init__(self, principals_by_digest: dict[bytes, Principal] | None = None,
                 secrets_by_access_key: dict[str, tuple[bytes, Principal]] | None = None) -> None:
        self._by_digest = principals_by_digest or {}
        self._by_access_key = secrets_by_access_key or {}

    @property
    def enabled(self) -> bool:
        return bool(self._by_digest)

    def __len__(self) -> int:
        return len(self._by_digest)

    def replace(self, other: TokenTable) -> None:
        """Take ``other``'s tokens (a reload). One reference assignment: calls in flight on the event
        loop see either table whole, never a mix."""
        self._by_digest, self._by_access_key = other._by_digest, other._by_access_key

    def authenticate(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> Principal:
        if not self._by_digest:
            return ANONYMOUS
        header = _header(metadata, AUTHORIZATION)
        if header is None:
            raise UnauthenticatedError("this gateway requires a token: send metadata "
                                       "'authorization: Bearer <token>'")
        if header.startswith(SIGNATURE_SCHEME + " "):
            return self._verify_signature(header, _header(metadata, DATE_TIME))
        if not header[:len(_BEARER)].lower() == _BEARER:
            raise UnauthenticatedError("the authorization metadata must be 'Bearer <token>' (or RocketMQ 5's "
                                       f"'{SIGNATURE_SCHEME} Credential=...')")
        token = header[len(_BEARER):]
        if token != token.strip():  # "t0ken " is another token: never let it pass for "t0ken"
            raise UnauthenticatedError("the token has whitespace around it: send exactly 'Bearer <token>'")
        principal = self._by_digest.get(_digest(token))
        if principal is None:
            raise UnauthenticatedError("unknown token: check the token you were given")
        return principal

    def _verify_signature(self, header: str, date_time: str | None, now: float | None = None) -> Principal:
        """A RocketMQ 5 client's signed request: the access key's secret must give the same HMAC-SHA1 of
        the signed date-time, and that time must be recent."""
        fields = dict(part.split("=", 1) for part in header[len(SIGNATURE_SCHEME):].replace(",", " ").split()
                      if "=" in part)
        access_key = fields.get("Credential", "").split("/")[0]
        if not access_key:
            raise UnauthenticatedError(f"the {SIGNATURE_SCHEME} authorization names no access key: give the "
                                       "client Credentials(access key = the token's name, secret key = the token)")
        if DATE_TIME not in fields.get("SignedHeaders", "").split(";") or date_time is None:
            raise UnauthenticatedError(f"the signature must cover the {DATE_TIME} header the request sends")
        try:
            signed_at = datetime.strptime(date_time, _DATE_TIME_FORMAT).replace(tzinfo=UTC).timestamp()
        except ValueError:
            raise UnauthenticatedError(f"{DATE_TIME} {date_time[:40]!r} is not yyyyMMddTHHmmssZ") from None
        skew = (time.time() if now is None else now) - signed_at
        if abs(skew) > MAX_SIGNATURE_SKEW_S:
            raise UnauthenticatedError(f"the request was signed {skew:+.0f} s from the gateway's clock, more than "
                                       f"{MAX_SIGNATURE_SKEW_S} s: check the client machine's clock (UTC)")
        known = self._by_access_key.get(access_key)
        expected = hmac.new(known[0] if known else b"", date_time.encode(), hashlib.sha1).hexdigest()
        if not hmac.compare_digest(expected, fields.get("Signature", "").lower()) or known is None:
            raise UnauthenticatedError("unknown access key or wrong secret key: the client's Credentials must be "
                                       "a token's name (access key) and the token (secret key)")
        return known[1]

    @staticmethod
    def authorize(principal: Principal, action: Action, topic: str) -> None:
        if not principal.may(action, topic):
            verb = {Action.PRODUCE: "produce to", Action.CONSUME: "consume from",
                    Action.ADMIN: "administer"}[action]
            raise PermissionDeniedError(f"token {principal.name!r} may not {verb} topic {topic!r}"
                                        + ("" if action is Action.ADMIN else f" (its {action.value} list)"))


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _header(metadata: Sequence[tuple[str, str | bytes]] | None, name: str) -> str | None:
    for key, value in metadata or ():
        if key == name:
            return value.decode() if isinstance(value, bytes) else value
    return None


def load_token_table(path: str | Path | None) -> TokenTable:
    if path is None:
        return TokenTable()
    try:
        loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read the token file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"the token file {path} is not UTF-8 text (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"the token file {path} is not valid YAML: {_yaml_problem(exc)}") from None
    entries = loaded.get("tokens") if isinstance(loaded, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{path}: expected 'tokens:' with at least one entry")
    table: dict[bytes, Principal] = {}
    by_name: dict[str, tuple[bytes, Principal]] = {}
    for i, entry in enumerate(entries):
        principal, token = _entry(path, i, entry)
        digest = _digest(token)
        if digest in table:
            raise ConfigError(f"{path}: tokens[{i}] ({principal.name}) repeats the token of {table[digest].name}")
        if principal.name in by_name:
            raise ConfigError(f"{path}: tokens[{i}] repeats the name {principal.name!r}: names are RocketMQ 5 "
                              "clients' access keys, so each must be unique")
        table[digest] = principal
        by_name[principal.name] = (token.encode(), principal)
    return TokenTable(table, by_name)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What is wrong and where, without PyYAML's snippet of the offending line (it may hold a token)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return f"{exc.problem or exc.context or 'syntax error'}{where}"
    return type(exc).__name__


def _entry(path: str | Path, index: int, entry: Any) -> tuple[Principal, str]:
    where = f"{path}: tokens[{index}]"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected a mapping")
    unknown = set(entry) - {"name", "token", "produce", "consume", "admin"}
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
    token = entry.get("token")
    if not isinstance(token, str) or len(token) < 8:
        raise ConfigError(f"{where}: 'token' must be a string of at least 8 characters")
    if token != token.strip() or any(ch.isspace() for ch in token):
        raise ConfigError(f"{where}: 'token' must not contain whitespace")
    lists = {}
    for key in ("produce", "consume"):
        value = entry.get(key, [])
        if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
            raise ConfigError(f"{where}: '{key}' must be a list of topic names or globs")
        lists[key] = tuple(value)
    return Principal(str(entry.get("name", f"token-{index}")), lists["produce"], lists["consume"],
                     bool(entry.get("admin", False))), token
