"""One fuzz harness for every HTTP endpoint and gRPC method the lab serves.

``bodies`` makes seeded hostile bodies from one valid example: random bytes, truncated
JSON, JSON nested past the decoder's recursion limit (and deep but legal), a wrong type at
each path of the example in turn, random replace/drop/retype mutations, and one body over
the endpoint's size limit every 200 rounds. ``requests`` does the same for GET endpoints:
hostile query strings, paths and methods, and one round in five the endpoint's own hostile
URLs where it has some.

``run`` sends them to one endpoint over a real HTTP(S) client and records, per endpoint:
answers, refusals, 5xx, dropped connections, slow answers, answers outside the protocol,
refusals without a reason, and refusals an exception wrote ("could not answer",
"malformed object:", KeyError text, tracebacks: a bug, not a refusal). ``Report.check``
fails on any of those, on an endpoint whose accept or reject path never ran, and on a
server that no longer answers the valid example afterwards.

``run_grpc`` does the same for one gRPC method (tests/component/test_fuzz_grpc.py): raw
bytes as the serialized request, the valid example with a hostile value in each field in
turn, random hostile messages and, every 200 rounds, repeated fields 10,000 long. A status
grpcio writes for an exception ("Exception calling application", "Exception deserializing
request!") is a bug; so are a dropped call, an answer over the deadline, a refusal without
a reason, and one without the word upstream's error carries.

``GPULAB_FUZZ_ROUNDS`` sets the bodies per endpoint (1,000 by default, as in CI).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
from google.protobuf.descriptor import FieldDescriptor, MethodDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

ROUNDS = int(os.environ.get("GPULAB_FUZZ_ROUNDS", "1000"))
DEADLINE = 2.0  # seconds for any one answer
# a gRPC server runs in a process of its own, beside make test's two clusters: one
# GetPreferredAllocation in 16,000 answers once took 2.0 s there (2026-12-07)
GRPC_DEADLINE = 5.0
JUNK: list[Any] = [
    None,
    True,
    0,
    -1,
    2**70,
    1.5,
    "",
    "x",
    "abc",
    [],
    {},
    [None],
    {"": None},
    "\u0000",
    "💥" * 50,
    {"nested": {"deeper": [1, {"x": None}]}},
    ["nvidia.com/gpu"],
    "-5",
    "1e400",
    "NaN",
]
# text only an exception writes: such an answer is a bug, not a refusal
BUG_MARKERS = ("could not answer", "malformed object:", "KeyError", "Traceback", "internal error")


class OutOfProtocol(Exception):
    """The answer is not what the endpoint's protocol allows."""


@dataclass(frozen=True)
class Answer:
    accepted: bool
    message: str = ""  # a refusal's reason


# reads one response; raises OutOfProtocol when it is not a protocol answer
Judge = Callable[[httpx.Response], Answer]
# an endpoint's own hostile body (POST) or URL (GET), and the word its refusal must carry
# (None: any reason, or an answer)
Extra = Callable[[random.Random], tuple[bytes, str | None]]


@dataclass(frozen=True)
class Endpoint:
    path: str
    example: Any  # a valid body (POST) or None (GET)
    judge: Judge
    max_body: int = 3 << 20
    method: str = "POST"
    extra: Extra | None = None  # endpoint-specific hostile shapes, one round in five
    example_accepted: bool = True  # False: the example is answered in protocol, refused
    bug_markers: tuple[str, ...] = BUG_MARKERS


# -- bodies ---------------------------------------------------------------------------------


def mutate(rng: random.Random, obj: Any, depth: int = 0) -> Any:
    """Replace, drop or retype one random part of ``obj``."""
    if isinstance(obj, dict) and obj and depth < 10 and rng.random() < 0.85:
        key = rng.choice(list(obj))
        out = dict(obj)
        roll = rng.random()
        if roll < 0.2:
            del out[key]
        elif roll < 0.4:
            out[key] = rng.choice(JUNK)
        else:
            out[key] = mutate(rng, obj[key], depth + 1)
        return out
    if isinstance(obj, list) and obj and depth < 10 and rng.random() < 0.85:
        out = list(obj)
        i = rng.randrange(len(out))
        out[i] = mutate(rng, out[i], depth + 1)
        return out
    return rng.choice(JUNK)


def paths(obj: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path (keys and indexes) inside ``obj``, the root excluded."""
    items = (
        obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    )
    for key, value in items:
        yield (*prefix, key)
        yield from paths(value, (*prefix, key))


def put(obj: Any, where: tuple[Any, ...], value: Any) -> Any:
    """A copy of ``obj`` with ``value`` at ``where`` (copied along the path only)."""
    if not where:
        return value
    out = dict(obj) if isinstance(obj, dict) else list(obj)
    out[where[0]] = put(obj[where[0]], where[1:], value)
    return out


def raw(rng: random.Random, text: bytes) -> bytes:
    roll = rng.randrange(8)
    if roll == 0:
        return bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 300)))
    if roll == 1:
        return b"[" * 100_000 + b"]" * 100_000  # nesting beyond the recursion limit
    if roll == 2:
        return b'{"request": ' + b'{"x": ' * 3000 + b"1" + b"}" * 3000 + b"}"
    if roll == 3:
        return (b'{"a":' * 900) + b"1" + (b"}" * 900)  # deep but legal
    if roll == 4:
        return text[: rng.randrange(1, len(text))]  # truncated
    if roll == 5:
        return rng.choice([b"", b"null", b"[1, 2, 3]", b'"review"', b"NaN", b"\xff\xfe\x00{}"])
    if roll == 6:
        return b'{"x": ' + text  # unterminated object around the example
    return text.replace(b":", b"=", 1)


def oversized(limit: int) -> bytes:
    return b'{"request": "' + b"x" * (limit + 1) + b'"}'


@dataclass
class Body:
    content: bytes
    kind: str  # raw | wrong-type | mutated | extra | oversize
    word: str | None = None  # what the refusal must say, where known


def bodies(rng: random.Random, endpoint: Endpoint, rounds: int) -> Iterator[Body]:
    example = endpoint.example
    text = json.dumps(example).encode()
    where = list(paths(example))
    rng.shuffle(where)
    for i in range(rounds):
        if i % 200 == 7:
            yield Body(oversized(endpoint.max_body), "oversize")
        elif i % 5 == 0:
            yield Body(raw(rng, text), "raw")
        elif i % 5 in (1, 2) and where:  # every path of the example, in turn
            target = where[(i // 5 * 2 + i % 5 - 1) % len(where)]
            yield Body(json.dumps(put(example, target, rng.choice(JUNK))).encode(), "wrong-type")
        elif i % 5 == 3 and endpoint.extra is not None:
            content, word = endpoint.extra(rng)
            yield Body(content, "extra", word)
        else:
            yield Body(json.dumps(mutate(rng, example)).encode(), "mutated")


HOSTILE_SUFFIXES = [
    "/../../etc/passwd",
    "/%2e%2e/%2e%2e",
    "/%00",
    "/" + "a" * 4000,
    "//",
    "/%ff%fe",
    "/💥",
    "/.;/x",
]
HOSTILE_QUERIES = [
    "?" + "a=" + "b" * 4000,
    "?namespace=%00",
    "?namespace=" + "%" * 50,
    "?x=1&x=2&x=3&" + "&".join(f"k{i}=v" for i in range(300)),
    "?name[]=1",
    "?=",
    "?namespace=💥",
    "?%ff=%fe",
]
METHODS = ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]


def requests(
    rng: random.Random, endpoint: Endpoint, rounds: int
) -> Iterator[tuple[str, str, bytes, str | None]]:
    """Hostile (method, url, body, word) for a GET endpoint: ``word`` is what the refusal
    of one of the endpoint's own hostile URLs must say (None: any reason)."""
    path = endpoint.path
    for i in range(rounds):
        if endpoint.extra is not None and i % 5 == 4:
            url, word = endpoint.extra(rng)
            yield "GET", url.decode(), b"", word
            continue
        roll = i % 4
        if roll == 0:
            yield "GET", path + rng.choice(HOSTILE_QUERIES), b"", None
        elif roll == 1:
            yield "GET", path.rstrip("/") + rng.choice(HOSTILE_SUFFIXES), b"", None
        elif roll == 2:
            yield rng.choice(METHODS), path, bytes(rng.getrandbits(8) for _ in range(64)), None
        else:
            junk = "".join(rng.choice("abc%/?&=#;:.~ ") for _ in range(rng.randrange(1, 40)))
            yield "GET", path + "?" + junk.replace(" ", "%20").replace("#", "%23"), b"", None


# -- runner ---------------------------------------------------------------------------------


@dataclass
class Report:
    path: str
    counts: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    slowest: float = 0.0
    alive_after: bool = False

    def fail(self, kind: str, text: str) -> None:
        self.counts[kind] += 1
        if len(self.failures) < 20:
            self.failures.append(f"{self.path}: {kind}: {text}")

    def check(self, both_paths: bool = True) -> None:
        bad = {k: self.counts[k] for k in FAILURES if self.counts[k]}
        assert not bad, f"{bad}; e.g. {self.failures[:5]}"
        assert self.alive_after, f"{self.path} did not answer the valid example after the fuzz"
        if both_paths:  # the accept and the reject path both ran
            assert self.counts["accepted"] and self.counts["refused"], dict(self.counts)


FAILURES = (
    "5xx",
    "dropped",
    "slow",
    "out of protocol",
    "no reason",
    "bug",
    "missed word",
    "accepted oversize",
)


def _record(report: Report, endpoint: Endpoint, resp: httpx.Response, body: Body | None) -> None:
    label = repr(body.content[:120]) if body else resp.request.url.raw_path[:120].decode()
    if resp.status_code >= 500:
        report.fail("5xx", f"HTTP {resp.status_code} for {label}: {resp.text[:200]}")
        return
    try:
        answer = endpoint.judge(resp)
    except (OutOfProtocol, ValueError, KeyError, TypeError, AttributeError) as exc:
        report.fail("out of protocol", f"{exc!s:.200} for {label}: {resp.text[:200]}")
        return
    if answer.accepted:
        report.counts["accepted"] += 1
        if body is not None and body.kind == "oversize":
            report.fail("accepted oversize", label)
        elif body is not None and body.word is not None:
            report.fail("missed word", f"accepted {label}")
        return
    report.counts["refused"] += 1
    if not answer.message.strip():
        report.fail("no reason", f"HTTP {resp.status_code} for {label}")
    elif any(marker in answer.message for marker in endpoint.bug_markers):
        report.fail("bug", f"{answer.message[:200]} for {label}")
    elif body is not None and body.word is not None:
        report.counts["named"] += 1
        if body.word not in answer.message:
            report.fail("missed word", f"{answer.message[:200]!r} lacks {body.word!r}")


def _send(
    client: httpx.Client, report: Report, method: str, url: str, content: bytes
) -> httpx.Response | None:
    start = time.monotonic()
    try:
        resp = client.request(
            method, url, content=content, headers={"Content-Type": "application/json"}
        )
    except httpx.TransportError as exc:
        report.fail("dropped", f"{type(exc).__name__}: {exc} for {url[:120]}")
        return None
    took = time.monotonic() - start
    report.slowest = max(report.slowest, took)
    if took > DEADLINE:
        report.fail("slow", f"{took:.1f}s for {content[:120]!r}")
    return resp


def run(client: httpx.Client, endpoint: Endpoint, rounds: int = ROUNDS, seed: str = "") -> Report:
    """Send ``rounds`` hostile requests to ``endpoint``, then the valid example."""
    rng = random.Random(f"gpulab-fuzz-{seed}-{endpoint.method}-{endpoint.path}")
    report = Report(endpoint.path)
    if endpoint.method == "POST":
        for body in bodies(rng, endpoint, rounds):
            report.counts[body.kind] += 1
            resp = _send(client, report, "POST", endpoint.path, body.content)
            if resp is not None:
                _record(report, endpoint, resp, body)
        resp = _send(client, report, "POST", endpoint.path, json.dumps(endpoint.example).encode())
    else:
        for method, url, content, word in requests(rng, endpoint, rounds):
            report.counts[method] += 1
            resp = _send(client, report, method, url, content)
            if resp is not None:
                named = None if word is None else Body(url.encode(), "extra", word)
                _record(report, endpoint, resp, named)
        resp = _send(client, report, "GET", endpoint.path, b"")
    try:
        answer = endpoint.judge(resp) if resp is not None else None
    except OutOfProtocol:
        answer = None
    report.alive_after = answer is not None and (answer.accepted or not endpoint.example_accepted)
    return report


# -- judges: what each protocol allows ------------------------------------------------------


def _json(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError as exc:
        raise OutOfProtocol(f"not JSON: {exc}") from exc


def _error_body(resp: httpx.Response) -> Answer:
    """A 4xx with ``{"error": "..."}``."""
    body = _json(resp)
    if not isinstance(body, dict) or not isinstance(body.get("error"), str):
        raise OutOfProtocol(f"HTTP {resp.status_code} without an error text")
    return Answer(False, body["error"])


def _review_response(resp: httpx.Response) -> dict[str, Any] | Answer:
    """A review's ``response`` (200), or the Answer of a 400/413 with an error text."""
    if resp.status_code in (400, 413):
        return _error_body(resp)
    if resp.status_code != 200:
        raise OutOfProtocol(f"HTTP {resp.status_code}")
    response = _json(resp).get("response")
    if not isinstance(response, dict) or not isinstance(response.get("uid"), str):
        raise OutOfProtocol("no response with a uid")
    return response


def admission_review(resp: httpx.Response) -> Answer:
    """An AdmissionReview answer (200), or a 400/413 with an error text."""
    response = _review_response(resp)
    if isinstance(response, Answer):
        return response
    if not isinstance(response.get("allowed"), bool):
        raise OutOfProtocol("response.allowed is not a bool")
    if response["allowed"]:
        return Answer(True)
    status = response.get("status") or {}
    # upstream Volcano refuses with a Status that has a message and no code
    if status.get("code") not in (None, 400, 403, 422):
        raise OutOfProtocol(f"a refusal with code {status.get('code')!r}")
    return Answer(False, str(status.get("message") or ""))


def conversion_review(resp: httpx.Response) -> Answer:
    """A ConversionReview answer (200), or a 400/413 with an error text. Kueue's old
    catch-all wrote "malformed <Kind>: ..."; such text counts as a bug."""
    response = _review_response(resp)
    if isinstance(response, Answer):
        return response
    result = response.get("result") or {}
    if result.get("status") == "Success":
        if not isinstance(response.get("convertedObjects"), list):
            raise OutOfProtocol("Success without convertedObjects")
        return Answer(True)
    if result.get("status") != "Failure":
        raise OutOfProtocol(f"result.status {result.get('status')!r}")
    message = str(result.get("message") or "")
    if message.startswith("malformed "):
        message = "malformed object: " + message
    return Answer(False, message)


FILTER_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


def extender_filter(resp: httpx.Response) -> Answer:
    """ExtenderFilterResult, always 200 (HAMi v2.10.0 writes errors into ``Error``)."""
    body = _json(resp)
    if resp.status_code != 200 or not isinstance(body, dict) or set(body) != FILTER_KEYS:
        raise OutOfProtocol(f"HTTP {resp.status_code}, not an ExtenderFilterResult")
    if not isinstance(body["Error"], str):
        raise OutOfProtocol("Error is not a string")
    return Answer(not body["Error"], body["Error"])


def extender_bind(resp: httpx.Response) -> Answer:
    """ExtenderBindingResult, always 200."""
    body = _json(resp)
    if resp.status_code != 200 or not isinstance(body, dict) or set(body) != {"Error"}:
        raise OutOfProtocol(f"HTTP {resp.status_code}, not an ExtenderBindingResult")
    if not isinstance(body["Error"], str):
        raise OutOfProtocol("Error is not a string")
    return Answer(not body["Error"], body["Error"])


def admission_review_200(resp: httpx.Response) -> Answer:
    """HAMi's /webhook: always 200 with an AdmissionReview (controller-runtime's way)."""
    if resp.status_code != 200:
        raise OutOfProtocol(f"HTTP {resp.status_code}")
    return admission_review(resp)


def get(ok: tuple[int, ...] = (200,)) -> Judge:
    """A GET endpoint: ``ok`` statuses answer; a 4xx is a refusal whose reason is its body
    or, for an empty body (HEAD), its reason phrase; a redirect (Starlette's for
    ``/healthz/``) is a refusal that names where to go."""

    def judge(resp: httpx.Response) -> Answer:
        if resp.status_code in ok:
            return Answer(True)
        if resp.status_code in (301, 302, 307, 308):
            if not resp.headers.get("location"):
                raise OutOfProtocol(f"HTTP {resp.status_code} without a Location")
            return Answer(False, f"redirect to {resp.headers['location']}")
        if 400 <= resp.status_code < 500:
            return Answer(False, resp.text or resp.reason_phrase)
        raise OutOfProtocol(f"HTTP {resp.status_code}")

    return judge


# -- gRPC -----------------------------------------------------------------------------------
#
# The same rounds for a gRPC method: raw bytes as the serialized request (sent through a
# generic channel.unary_unary with an identity serializer), the valid example with one
# field set to a hostile value (every field in turn), random hostile messages, and every
# 200th round the example's repeated fields 10,000 long. A refusal is a status with a
# reason; the status grpcio writes for an exception in the servicer ("Exception calling
# application: ...") is a bug, as is one a deserializing exception wrote.

GRPC_BUG_MARKERS = (
    "Exception calling application",
    "Exception iterating responses",
    "Exception deserializing",
    "Exception serializing",
    "Traceback",
)
# codes a refusal may carry: Go's plain error (Unknown, upstream's way), a request grpc
# could not decode (Internal, "grpc: error unmarshalling request"), invalid argument,
# a message over the size limit, a method the server lacks on a dialed socket
GRPC_REFUSALS = {
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
HOSTILE_STRINGS = ["", "\x00", "x" * 5000, "💥", " ", "a\x00b", "../../etc/passwd", "\n"]
HOSTILE_INTS = [0, -1, 1, 2, 7, 2**31 - 1, -(2**31)]
HUGE = 10_000  # items in a repeated field, every 200th round

# a field name -> values it may hold: the valid ones and the hostile ones
Vocabulary = Mapping[str, Sequence[Any]]


@dataclass(frozen=True)
class GrpcMethod:
    service: str  # full service name, "v1beta1.DevicePlugin"
    name: str
    example: Message
    vocabulary: Vocabulary
    # reads an answer to ``request``; raises OutOfProtocol when it is not a protocol answer
    judge: Callable[[Message, Message], None] = lambda _req, _resp: None
    # the word a refusal of ``request`` must carry (None: any reason, or an answer)
    expect: Callable[[Message], str | None] = lambda _req: None
    # called before every request: state a request consumes is put back (HAMi's pending pod)
    before: Callable[[], None] = lambda: None

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"

    @property
    def descriptor(self) -> MethodDescriptor:
        return self.example.DESCRIPTOR.file.services_by_name[
            self.service.rsplit(".", 1)[-1]
        ].methods_by_name[self.name]

    @property
    def streaming(self) -> bool:
        return self.descriptor.server_streaming


def _hostile_value(rng: random.Random, fd: FieldDescriptor, vocabulary: Vocabulary) -> Any:
    if fd.name in vocabulary:
        return rng.choice(vocabulary[fd.name])
    if fd.type == FieldDescriptor.TYPE_BOOL:
        return rng.random() < 0.5
    if fd.type == FieldDescriptor.TYPE_STRING:
        return rng.choice(HOSTILE_STRINGS)
    return rng.choice(HOSTILE_INTS)


def hostile_message(
    rng: random.Random, cls: type[Message], vocabulary: Vocabulary, depth: int = 0
) -> Message:
    """A message of ``cls`` whose every field is left unset or holds a hostile value."""
    msg = cls()
    for fd in cls.DESCRIPTOR.fields:
        if rng.random() < 0.2 or depth > 3:
            continue
        if fd.message_type is not None:
            sub = GetMessageClass(fd.message_type)
            if _is_repeated(fd):
                items = getattr(msg, fd.name)
                for _ in range(rng.choice([0, 1, 1, 2, 3])):
                    items.add().CopyFrom(hostile_message(rng, sub, vocabulary, depth + 1))
            else:
                getattr(msg, fd.name).CopyFrom(hostile_message(rng, sub, vocabulary, depth + 1))
        elif _is_repeated(fd):
            getattr(msg, fd.name).extend(
                _hostile_value(rng, fd, vocabulary) for _ in range(rng.choice([0, 1, 2, 3, 8]))
            )
        else:
            setattr(msg, fd.name, _hostile_value(rng, fd, vocabulary))
    return msg


def _is_repeated(fd: FieldDescriptor) -> bool:
    return fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED


def message_paths(msg: Message) -> list[tuple[str | int, ...]]:
    """Every field path of ``msg`` that holds something (repeated items by index)."""
    out: list[tuple[str | int, ...]] = []
    for fd, value in msg.ListFields():
        out.append((fd.name,))
        if fd.message_type is not None:
            items = list(value) if _is_repeated(fd) else [value]
            for i, item in enumerate(items):
                prefix = (fd.name, i) if _is_repeated(fd) else (fd.name,)
                out += [(*prefix, *rest) for rest in message_paths(item)]
    return out


def with_hostile_field(
    rng: random.Random, example: Message, where: tuple[str | int, ...], vocabulary: Vocabulary
) -> Message:
    """A copy of ``example`` with a hostile value at ``where`` (a scalar field gets one,
    a repeated field a hostile list, a message field a hostile message)."""
    msg = type(example)()
    msg.CopyFrom(example)
    parent: Any = msg
    for step in where[:-1]:
        parent = parent[step] if isinstance(step, int) else getattr(parent, step)
    name = where[-1]
    assert isinstance(name, str)
    fd = parent.DESCRIPTOR.fields_by_name[name]
    parent.ClearField(name)
    if fd.message_type is not None or _is_repeated(fd):
        getattr(parent, name).MergeFrom(
            getattr(hostile_message(rng, type(parent), vocabulary), name)
        )
    else:
        setattr(parent, name, _hostile_value(rng, fd, vocabulary))
    return msg


def huge(example: Message) -> Message:
    """``example`` with each repeated field's first item (or the field's own list) repeated
    to HUGE items."""
    msg = type(example)()
    msg.CopyFrom(example)
    for fd, value in list(msg.ListFields()):
        if not _is_repeated(fd) or not value:
            continue
        first = value[0]
        if fd.message_type is not None:
            for _ in range(HUGE - len(value)):
                value.add().CopyFrom(first)
        else:
            value.extend([first] * (HUGE - len(value)))
    return msg


def raw_request(rng: random.Random, text: bytes) -> bytes:
    roll = rng.randrange(5)
    if roll == 0:
        return bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 300)))
    if roll == 1 and text:
        return text[: rng.randrange(len(text))]  # truncated
    if roll == 2 and text:
        i = rng.randrange(len(text))  # one byte flipped
        return text[:i] + bytes([text[i] ^ (1 << rng.randrange(8))]) + text[i + 1 :]
    if roll == 3:
        return rng.choice([b"\x0a\xff\xff\xff\xff\x0f", b"\xff" * 12, b"\x0a\x05ab", b"\x08"])
    return text + bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 20)))


@dataclass
class Request:
    content: bytes
    kind: str  # raw | wrong-field | hostile | huge
    message: Message | None  # what the server decodes, None where it cannot


def requests_for(rng: random.Random, method: GrpcMethod, rounds: int) -> Iterator[Request]:
    cls = type(method.example)
    text = method.example.SerializeToString()
    where = message_paths(method.example)
    rng.shuffle(where)
    for i in range(rounds):
        if i % 200 == 7:
            msg = huge(method.example)
            yield Request(msg.SerializeToString(), "huge", msg)
        elif i % 5 == 0:
            content = raw_request(rng, text)
            try:
                decoded: Message | None = cls.FromString(content)
            except DecodeError:
                decoded = None
            yield Request(content, "raw", decoded)
        elif i % 5 in (1, 2) and where:
            target = where[(i // 5 * 2 + i % 5 - 1) % len(where)]
            msg = with_hostile_field(rng, method.example, target, method.vocabulary)
            yield Request(msg.SerializeToString(), "wrong-field", msg)
        else:
            msg = hostile_message(rng, cls, method.vocabulary)
            yield Request(msg.SerializeToString(), "hostile", msg)


def _call(channel: grpc.Channel, method: GrpcMethod, report: Report, content: bytes) -> Any:
    """One call; the response message, or the RpcError, or None when it was dropped."""
    response_cls = GetMessageClass(method.descriptor.output_type)
    start = time.monotonic()
    try:
        if method.streaming:
            stream = channel.unary_stream(
                method.path, response_deserializer=response_cls.FromString
            )(content, timeout=10 * GRPC_DEADLINE)
            try:
                response: Any = next(stream)
            finally:
                stream.cancel()
        else:
            response = channel.unary_unary(
                method.path, response_deserializer=response_cls.FromString
            )(content, timeout=10 * GRPC_DEADLINE)
    except grpc.RpcError as exc:
        response = exc
    took = time.monotonic() - start
    report.slowest = max(report.slowest, took)
    if took > GRPC_DEADLINE:
        report.fail("slow", f"{took:.1f}s for {content[:120]!r}")
    if isinstance(response, grpc.Call) and response.code() in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    ):
        report.fail(
            "dropped", f"{response.code().name}: {response.details()} for {content[:120]!r}"
        )
        return None
    return response


def _record_grpc(report: Report, method: GrpcMethod, request: Request, response: Any) -> None:
    label = repr(request.content[:120])
    if isinstance(response, grpc.Call):
        report.counts["refused"] += 1
        details = response.details() or ""
        if response.code() not in GRPC_REFUSALS:
            report.fail("out of protocol", f"{response.code().name}: {details[:200]} for {label}")
        elif not details.strip():
            report.fail("no reason", f"{response.code().name} for {label}")
        elif any(marker in details for marker in GRPC_BUG_MARKERS):
            report.fail("bug", f"{response.code().name}: {details[:300]} for {label}")
        else:
            word = "error unmarshalling request" if request.message is None else None
            if word is None:
                word = method.expect(request.message)  # type: ignore[arg-type]
            if word is not None:
                report.counts["named"] += 1
                if word not in details:
                    report.fail("missed word", f"{details[:200]!r} lacks {word!r}")
        return
    report.counts["accepted"] += 1
    if request.message is None:
        report.fail("missed word", f"accepted undecodable {label}")
        return
    word = method.expect(request.message)
    if word is not None:
        report.fail("missed word", f"accepted {label}, expected a refusal with {word!r}")
        return
    try:
        method.judge(request.message, response)
    except OutOfProtocol as exc:
        report.fail("out of protocol", f"{exc!s:.200} for {label}")


def run_grpc(
    channel: grpc.Channel, method: GrpcMethod, rounds: int = ROUNDS, seed: str = ""
) -> Report:
    """Send ``rounds`` hostile requests to ``method``, then the valid example."""
    rng = random.Random(f"gpulab-fuzz-{seed}-{method.path}")
    report = Report(method.path)
    for request in requests_for(rng, method, rounds):
        report.counts[request.kind] += 1
        method.before()
        response = _call(channel, method, report, request.content)
        if response is not None:
            _record_grpc(report, method, request, response)
    method.before()
    response = _call(channel, method, report, method.example.SerializeToString())
    report.alive_after = response is not None and not isinstance(response, grpc.Call)
    if report.alive_after:
        try:
            method.judge(method.example, response)
        except OutOfProtocol:
            report.alive_after = False
    return report
