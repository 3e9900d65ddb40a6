"""Stored records, as an operator reads them (idem_record): what
Store.list(), Store.get() and Store.show() return."""
import json
from typing import Any, Dict, Optional

_STATES = {1: "in_progress", 2: "completed", 3: "unknown"}
_SEALED = {0: None, 1: "no key", 2: "does not open"}


class Record:
    """One record: its id (tenant, operation, key), state ("in_progress",
    "completed" or "unknown"), attempt (1, then one more per takeover),
    fingerprint, times in Unix milliseconds (created_ms, updated_ms,
    lease_expires_ms, 0 unless in progress, and expires_ms, the retention),
    the canonical request (bytes, JSON; None when not kept), and for a
    completed record its response: status, meta and body (bytes, None
    without one; .value is the body JSON-decoded). recovered: the response
    was stored by a call that took the key over, or by an operator
    resolving a record of more than one attempt: an earlier attempt may
    also have acted. seal_key_id and sealed ("no key" or "does not open",
    None when the response is in clear) say what a sealed record hides."""

    __slots__ = ("tenant", "operation", "key", "fingerprint", "state", "attempt",
                 "created_ms", "updated_ms", "lease_expires_ms", "expires_ms", "request",
                 "has_response", "status", "meta", "body", "recovered", "seal_key_id",
                 "sealed")

    tenant: str
    operation: str
    key: str
    fingerprint: str
    state: str
    attempt: int
    created_ms: int
    updated_ms: int
    lease_expires_ms: int
    expires_ms: int
    request: Optional[bytes]
    has_response: bool
    status: Optional[int]
    meta: Optional[bytes]
    body: Optional[bytes]
    recovered: bool
    seal_key_id: str
    sealed: Optional[str]

    def __init__(self, **fields: Any) -> None:
        for name in self.__slots__:
            object.__setattr__(self, name, fields.pop(name))
        if fields:
            raise TypeError("Record(): unknown field(s) %s" % ", ".join(sorted(fields)))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a Record is read-only")

    @property
    def value(self) -> Any:
        """The stored response's body, JSON-decoded (what a replay of a
        call of this binding returns); None without a body. ValueError
        when it is not JSON (stored by another program)."""
        if self.body is None:
            return None
        return json.loads(self.body.decode("utf-8"))

    def to_json(self) -> Dict[str, Any]:
        """The record as `idem keys list --json` writes it (text that is
        UTF-8 without NUL as a string, other bytes as {"hex": ...})."""
        out: Dict[str, Any] = {
            "tenant": self.tenant, "operation": self.operation, "key": self.key,
            "fingerprint": self.fingerprint, "state": self.state, "attempt": self.attempt,
            "created_ms": self.created_ms, "updated_ms": self.updated_ms,
            "lease_expires_ms": self.lease_expires_ms, "expires_ms": self.expires_ms,
            "recovered": self.recovered, "request": _bytes_json(self.request)}
        if self.seal_key_id:
            out["seal_key_id"] = self.seal_key_id
        if self.sealed:
            out["sealed"] = self.sealed
        if self.has_response:
            out["response"] = {"status": self.status, "meta": _bytes_json(self.meta),
                               "body": _bytes_json(self.body)}
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Record) and all(
            getattr(self, n) == getattr(other, n) for n in self.__slots__)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "Record(tenant=%r, operation=%r, key=%r, state=%r, attempt=%d%s)" % (
            self.tenant, self.operation, self.key, self.state, self.attempt,
            ", status=%r" % self.status if self.has_response else "")

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return _rebuild, ({n: getattr(self, n) for n in self.__slots__},)


def _rebuild(fields: Dict[str, Any]) -> Record:
    return Record(**fields)


def _bytes_json(b: Optional[bytes]) -> Any:
    if b is None:
        return None
    if b"\x00" not in b:
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return {"hex": b.hex()}


def record_of(ffi: Any, r: Any) -> Record:
    """A Record copied from an idem_record (cdata)."""
    def text(p: Any) -> str:
        return str(ffi.string(p).decode("utf-8", "surrogateescape")) if p else ""

    def data(p: Any, n: int) -> Optional[bytes]:
        return None if p == ffi.NULL else ffi.unpack(ffi.cast("char *", p), n)

    has = bool(r.has_response)
    return Record(
        tenant=text(r.tenant), operation=text(r.operation), key=text(r.key),
        fingerprint=text(r.fingerprint), state=_STATES.get(r.state, str(r.state)),
        attempt=r.attempt, created_ms=r.created_ms, updated_ms=r.updated_ms,
        lease_expires_ms=r.lease_expires_ms, expires_ms=r.expires_ms,
        request=data(r.request, r.request_len), has_response=has,
        status=r.response.status if has or r.sealed else None,
        meta=data(r.response.meta, r.response.meta_len) if has else None,
        body=(data(r.response.body, r.response.body_len) or b"") if has else None,
        recovered=bool(r.recovered), seal_key_id=ffi.string(r.seal_key_id).decode("ascii"),
        sealed=_SEALED.get(r.sealed, "does not open"))
