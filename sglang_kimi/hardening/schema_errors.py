"""The HTTP 400 message of a request body that fails its route's schema: one line naming each field and the problem.

SGLang answers FastAPI's ``RequestValidationError`` with HTTP 400 (``http_server.validation_exception_handler``). On
every route but ``/v1/messages`` (which it scrubs) and ``/v1/systemone`` (which documents FastAPI's 422 list) the
message is ``str(exc)`` followed by ``str(exc.errors())``: each pydantic error's dict printed twice, the offending
input echoed with it (for a missing field, the whole request body, prompt included), and the server's own source
file, line and function. For a union field it lists every member's failure, so a chat message whose ``content`` is a
number is 5 errors, 3 of them about the member types the client never meant.

:func:`digest` turns pydantic's error list into ``"messages.0.content: Input should be a valid string or Input should
be a valid list (got 5)"``:

- a location is the path of keys and list indices into the body; the components pydantic adds to name the member of
  a union (``'str'``, ``'list[int]'``, ``'function-after[validate(), Model]'``, a model class) are left out. They are
  told apart from keys by walking the body the client sent: a component that is not a key (or index) of the value
  at that point names a union member (a missing field, the last component, is always a key);
- of a union's members, those the client's value was meant for are kept: a member is ruled out when it refuses a
  value another member takes (first a literal such as a ``type`` or ``role`` naming another member, then any
  refused value; a missing field does not rule a member out); of several members kept, the places every one of
  them refuses are named (a content part of an unknown ``type``: that field, not what each part type wants);
- each location once, its distinct messages joined with "or", the value given when its JSON is short;
- at most :data:`MAX_FIELDS` locations, then how many more there are.

:func:`install_schema_error_messages` puts a handler giving this message in front of SGLang's, in the shapes SGLang
answers (OpenAI's error object; ``/v1/responses``' nested ``error``). ``/v1/messages`` and ``/v1/systemone`` keep
SGLang's own answer.
"""

from __future__ import annotations

import json

MAX_FIELDS = 8  # locations named in one message
MAX_VALUE_CHARS = 60  # a value's JSON longer than this is not echoed
REQUEST_PARTS = ("body", "query", "header", "path", "cookie")  # FastAPI's first location component
MESSAGE_PREFIXES = ("Value error, ", "Assertion failed, ")  # pydantic's wording around a validator's own message
LITERAL_ERRORS = ("literal_error", "enum", "union_tag_invalid")  # a value naming another union member
KEEP_SGLANG_ANSWER = ("/v1/messages", "/v1/systemone")  # routes whose own error shape SGLang documents


def _steps(loc: tuple, body, missing: bool) -> list[tuple[bool, object]]:
    """``loc`` after its request part as ``(is_key, component)`` pairs: keys and indices into ``body``, or union
    member names. Without a body to walk (a header, a query), every component counts as a key."""
    steps = []
    value, walkable = body, body is not None
    for position, part in enumerate(loc):
        last = position == len(loc) - 1
        if not walkable:
            steps.append((True, part))
        elif isinstance(value, dict) and part in value:
            steps.append((True, part))
            value = value[part]
        elif isinstance(value, list) and isinstance(part, int) and -len(value) <= part < len(value):
            steps.append((True, part))
            value = value[part]
        elif missing and last:
            steps.append((True, part))
        else:
            steps.append((False, part))  # a union member: the value stays where it is
    return steps


def _keys(steps: list[tuple[bool, object]]) -> tuple:
    """The location ``steps`` lead to: their keys and indices, union members left out."""
    return tuple(component for is_key, component in steps if is_key)


def _accepts(member: list[tuple[list, dict]], location: tuple) -> bool:
    """Whether a union member has no error at ``location`` or on the way to it."""
    return not any(location[: len(at)] == at for at in (_keys(steps[1:]) for steps, _ in member))


def _ruled_out(members: dict, refusals) -> dict:
    """``members`` less those with an error in ``refusals`` at a place where another member takes the value; all of
    them when that would leave none."""
    meant = {
        name: member
        for name, member in members.items()
        if not any(
            refusals(error)
            and any(_accepts(other, _keys(steps[1:])) for other_name, other in members.items() if other_name != name)
            for steps, error in member
        )
    }
    return meant or members


def _members_meant(members: dict) -> dict:
    """The union members the client's value was meant for. A member is ruled out when it refuses a value at a place
    where another member takes it: first for a literal (a ``type`` or ``role`` that names another member), then for
    any refused value (a missing field does not count). A chat message ``{"role": "user", "content": 5}`` rules out
    the generic message, whose role check refuses "user", and keeps the user message, whose content is the problem;
    an assistant message with a bad ``tool_calls`` rules out the user message (its role literal) and keeps the
    generic one; a content part ``{"type": "text"}`` keeps the text part (its ``text`` is missing)."""
    members = _ruled_out(members, lambda error: error.get("type") in LITERAL_ERRORS)
    return _ruled_out(members, lambda error: error.get("type") != "missing")


def _in_every_member(members: dict) -> dict:
    """Of several members meant, the errors at the places every one of them refuses (a content part of an unknown
    ``type``: that field, not the other fields each part type wants), or all of them when there is no such place."""
    if len(members) < 2:
        return members
    places = [{_keys(steps[1:]) for steps, _ in member} for member in members.values()]
    common = set.intersection(*places)
    if not common:
        return members
    return {name: [(s, e) for s, e in member if _keys(s[1:]) in common] for name, member in members.items()}


def _kept(errors: list[tuple[list, dict]]) -> list[tuple[list, dict]]:
    """Of ``errors`` (``(steps, error)``, steps relative to one place in the body), those that name the problem: at
    each union met on the way, the errors of the members meant (pydantic reports every member's), in its order."""
    kept: list[tuple[list, dict]] = []
    groups: dict[tuple[bool, object], list[tuple[list, dict]]] = {}
    for steps, error in errors:
        if not steps:
            kept.append((steps, error))
        else:
            groups.setdefault(steps[0], []).append((steps, error))
    members = {step: group for step, group in groups.items() if not step[0]}
    members = _in_every_member(_members_meant(members)) if members else {}
    for step, group in groups.items():
        if not step[0]:
            if step not in members:
                continue
            group = members[step]
        kept.extend(([step, *rest], error) for rest, error in _kept([(s[1:], e) for s, e in group]))
    return kept


def _message(error: dict) -> str:
    message = str(error.get("msg") or "invalid").strip()
    for prefix in MESSAGE_PREFIXES:
        message = message.removeprefix(prefix)
    return message


def _shown_value(error: dict) -> str | None:
    if error.get("type") == "missing" or "input" not in error:
        return None
    try:
        text = json.dumps(error["input"], ensure_ascii=False, allow_nan=True)
    except (TypeError, ValueError):
        return None
    return text if len(text) <= MAX_VALUE_CHARS else None


def _where(part: str, steps: list[tuple[bool, object]]) -> str:
    path = ".".join(str(component) for is_key, component in steps if is_key)
    if part == "body":
        return path or "body"
    return f"{part} {path!r}" if path else part


def digest(errors, body=None) -> str:
    """One line naming each location of pydantic's ``errors`` for ``body`` and its problem (see the module)."""
    by_part: dict[str, list[tuple[list, dict]]] = {}
    for error in errors or []:
        loc = tuple(error.get("loc") or ())
        part = loc[0] if loc and loc[0] in REQUEST_PARTS else "body"
        rest = loc[1:] if loc and loc[0] in REQUEST_PARTS else loc
        walked = body if part == "body" else None
        by_part.setdefault(part, []).append((_steps(rest, walked, error.get("type") == "missing"), error))
    fields: dict[str, tuple[list[str], str | None]] = {}
    for part, part_errors in by_part.items():
        for steps, error in _kept(part_errors):
            messages, value = fields.setdefault(_where(part, steps), ([], _shown_value(error)))
            message = _message(error)
            if message not in messages:
                messages.append(message)
    if not fields:
        return "the request does not match the route's schema"
    shown = [
        f"{where}: {' or '.join(messages)}" + (f" (got {value})" if value is not None else "")
        for where, (messages, value) in list(fields.items())[:MAX_FIELDS]
    ]
    more = len(fields) - MAX_FIELDS
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def install_schema_error_messages(target: str):
    """Put :func:`answer_with_digest` in front of SGLang's handler of ``RequestValidationError`` on its app
    (``target``: the handler), before the app builds its middleware stack at its first request."""
    import pkgutil

    from fastapi.exceptions import RequestValidationError

    from sglang_kimi.hardening.route_validation import route_path

    module_name, handler_name = target.rsplit(".", 1)
    module = pkgutil.resolve_name(module_name)
    app = module.app
    sglang_handler = getattr(module, handler_name)
    if app.exception_handlers.get(RequestValidationError) is not sglang_handler:
        return "the app's handler of RequestValidationError is not SGLang's; left as it is"
    if app.middleware_stack is not None:
        return "the app already serves; its handlers are fixed"

    async def answer_with_digest(request, exc):
        route = route_path(request)
        if route.startswith(KEEP_SGLANG_ANSWER):
            return await sglang_handler(request, exc)
        return _answer(route, digest(exc.errors(), getattr(exc, "body", None)))

    app.exception_handlers[RequestValidationError] = answer_with_digest
    return None


def _answer(route: str, message: str):
    """SGLang's HTTP 400 shapes: ``/v1/responses``' nested error, elsewhere OpenAI's error object."""
    from http import HTTPStatus

    from fastapi.responses import JSONResponse
    from sglang.srt.entrypoints.openai.protocol import ErrorResponse

    status = HTTPStatus.BAD_REQUEST
    if route.startswith("/v1/responses"):
        error = {"message": message, "type": status.phrase, "param": None, "code": status.value}
        return JSONResponse(status_code=status.value, content={"error": error})
    content = ErrorResponse(message=message, type=status.phrase, code=status.value).model_dump()
    return JSONResponse(status_code=status.value, content=content)
