"""The HTTP 400 message of a body that fails its route's schema (``sglang_kimi/hardening/schema_errors.py``): each
field and its
problem once, union members the client did not mean left out, no echo of long values, no server paths."""

import sys
import types

import pytest
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest

from sglang_kimi.hardening.schema_errors import MAX_FIELDS, digest, install_schema_error_messages

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def fastapi_errors(model, body) -> list[dict]:
    """pydantic's errors for ``body`` as FastAPI reports them for a request body (locations under ``body``)."""
    with pytest.raises(ValidationError) as info:
        model.model_validate(body)
    return [{**error, "loc": ("body", *error["loc"])} for error in info.value.errors()]


def message_for(model, body) -> str:
    return digest(fastapi_errors(model, body), body)


def test_a_plain_field_names_itself_its_problem_and_the_value():
    message = message_for(CompletionRequest, {"model": "m", "prompt": "hi", "max_tokens": "ten"})
    assert message.startswith("max_tokens: Input should be a valid integer")
    assert message.endswith('(got "ten")')
    assert "body" not in message and "validation error" not in message


def test_a_validators_message_loses_pydantics_prefix():
    message = message_for(CompletionRequest, {"model": "m", "prompt": "hi", "max_tokens": -3})
    assert message.startswith("max_tokens: ") and "Value error" not in message and "(got -3)" in message


def test_a_missing_field_does_not_echo_the_body():
    prompt = "a long prompt " * 2000
    errors = fastapi_errors(ChatCompletionRequest, {"model": "m", "prompt": prompt, "max_tokens": 4})
    assert any(prompt in str(error["input"]) for error in errors)  # what SGLang's message printed, twice
    message = digest(errors, {"model": "m", "prompt": prompt, "max_tokens": 4})
    assert message == "messages: Field required"


def test_a_long_value_is_not_echoed():
    stop = {"x": "y" * 500}
    message = message_for(ChatCompletionRequest, {**CHAT, "stop": stop})
    assert message.startswith("stop: ") and "yyyy" not in message and "got" not in message


def test_the_member_of_a_union_the_client_meant():
    # a user message whose content is a number: SGLang listed 5 errors, among them the generic message's refusal of
    # the role "user", which the user message takes
    body = {**CHAT, "messages": [{"role": "user", "content": 5}]}
    assert len(fastapi_errors(ChatCompletionRequest, body)) > 2
    message = message_for(ChatCompletionRequest, body)
    assert message.startswith("messages.0.content: ") and "(got 5)" in message
    assert "role" not in message and "function-after" not in message and "Param" not in message


def test_an_assistant_message_is_not_told_its_role_should_be_user():
    body = {**CHAT, "messages": [{"role": "assistant", "content": "hi", "tool_calls": [{"id": 1}]}]}
    message = message_for(ChatCompletionRequest, body)
    assert "messages.0.tool_calls.0.id: " in message and "messages.0.tool_calls.0.function: Field required" in message
    assert "'user'" not in message


def test_a_content_part_of_an_unknown_type_lists_the_types_and_nothing_else():
    body = {**CHAT, "messages": [{"role": "user", "content": [{"type": "image", "url": "x"}]}]}
    message = message_for(ChatCompletionRequest, body)
    assert message.startswith("messages.0.content.0.type: ") and message.endswith('(got "image")')
    for part_type in ("'text'", "'image_url'", "'video_url'"):
        assert part_type in message
    assert ";" not in message  # the fields each part type wants are not listed


def test_a_text_part_without_its_text():
    body = {**CHAT, "messages": [{"role": "user", "content": [{"type": "text"}]}]}
    assert message_for(ChatCompletionRequest, body) == "messages.0.content.0.text: Field required"


def test_a_value_no_member_takes_lists_what_each_wants():
    message = message_for(ChatCompletionRequest, {**CHAT, "stop": 5})
    assert message.startswith("stop: ") and "valid list" in message and "valid string" in message
    assert message.count("stop") == 1 and message.endswith("(got 5)")


def test_a_dictionary_key_that_looks_like_a_type_is_still_a_key():
    message = message_for(CompletionRequest, {"model": "m", "prompt": "hi", "logit_bias": {"Str": "x"}})
    assert message.startswith("logit_bias.Str: ")


def test_several_fields_each_once():
    message = message_for(CompletionRequest, {"model": "m", "prompt": "hi", "temperature": "hot", "top_p": "x"})
    assert message.count("temperature: ") == 1 and message.count("top_p: ") == 1 and "; " in message


def test_at_most_max_fields_then_how_many_more():
    errors = [{"type": "int_type", "loc": ("body", f"f{i}"), "msg": "bad", "input": i} for i in range(MAX_FIELDS + 3)]
    message = digest(errors, {f"f{i}": i for i in range(MAX_FIELDS + 3)})
    assert message.count(": bad") == MAX_FIELDS and message.endswith("; and 3 more")


def test_a_header_error_without_a_body():
    errors = [{"loc": ["header", "content-type"], "msg": "Only 'application/json' is allowed", "type": "value_error"}]
    assert digest(errors) == "header 'content-type': Only 'application/json' is allowed"


def test_a_body_that_is_not_an_object():
    errors = fastapi_errors(CompletionRequest, [1, 2])
    assert digest(errors, [1, 2]).startswith("body: ")


# -- the handler, installed on an app shaped like SGLang's -------------------------------------------------------


def sglang_like_module(name: str) -> types.ModuleType:
    """A module holding ``app`` and its ``validation_exception_handler``, as SGLang's ``http_server`` does."""
    module = types.ModuleType(name)
    app = FastAPI()

    @app.exception_handler(RequestValidationError)
    async def validation_exception_handler(request, exc: RequestValidationError):
        return JSONResponse(status_code=400, content={"sglang": True})

    async def completions(request: CompletionRequest):
        return {"ok": True}

    for path in ("/v1/completions", "/v1/responses", "/v1/messages"):
        app.post(path)(completions)
    module.app, module.validation_exception_handler = app, validation_exception_handler
    return module


@pytest.fixture
def app_module(monkeypatch):
    name = "sglang_like_http_server"
    module = sglang_like_module(name)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def test_the_handler_answers_in_sglangs_shapes(app_module):
    assert install_schema_error_messages(f"{app_module.__name__}.validation_exception_handler") is None
    client = TestClient(app_module.app)
    bad = {"model": "m", "prompt": "hi", "max_tokens": "ten"}
    answer = client.post("/v1/completions", json=bad)
    assert answer.status_code == 400
    body = answer.json()
    assert body["object"] == "error" and body["code"] == 400 and body["type"] == "Bad Request"
    assert body["message"].startswith("max_tokens: ") and "File" not in body["message"]
    nested = client.post("/v1/responses", json=bad).json()
    assert nested["error"]["message"] == body["message"] and nested["error"]["code"] == 400
    assert client.post("/v1/messages", json=bad).json() == {"sglang": True}  # SGLang's own answer there
    assert client.post("/v1/completions", json={"model": "m", "prompt": "hi"}).json() == {"ok": True}


def test_install_leaves_a_handler_that_is_not_sglangs(app_module):
    async def another(request, exc):
        return JSONResponse(status_code=422, content={})

    app_module.app.exception_handlers[RequestValidationError] = another
    reason = install_schema_error_messages(f"{app_module.__name__}.validation_exception_handler")
    assert reason and "not SGLang's" in reason
    assert app_module.app.exception_handlers[RequestValidationError] is another


def test_install_leaves_an_app_that_already_serves(app_module):
    TestClient(app_module.app).post("/v1/completions", json={})  # builds the middleware stack
    reason = install_schema_error_messages(f"{app_module.__name__}.validation_exception_handler")
    assert reason and "already serves" in reason
