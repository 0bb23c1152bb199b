"""Request validation (``sglang_kimi/request_validation.py``): what would crash a scheduler is a ValueError (HTTP
400) naming the problem; everything else passes through to SGLang's own checks."""

from types import SimpleNamespace

import pytest

from sglang_kimi.request_validation import validate_request

MANAGER = SimpleNamespace(model_config=SimpleNamespace(vocab_size=100, hidden_size=4))


def request(**fields):
    base = {"input_embeds": None, "image_data": None, "video_data": None, "audio_data": None}
    return SimpleNamespace(**(base | fields))


@pytest.mark.parametrize(
    "input_ids, message",
    [
        ([1, 2, 100], "input_ids[2] is 100, outside the vocabulary: token ids must be in [0, 100)"),
        ([-1], "input_ids[0] is -1, outside the vocabulary"),
        ([1, 2.5], "input_ids[1] is 2.5: token ids must be integers"),
        ([True], "input_ids[0] is True: token ids must be integers"),
        ([], "the prompt has no tokens"),
        ("1 2 3", "input_ids must be a list of integer token ids"),
    ],
)
def test_bad_token_ids_are_refused(input_ids, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        validate_request(MANAGER, request(), input_ids)


def test_good_prompts_pass_through():
    assert validate_request(MANAGER, request(), [0, 5, 99]) is None
    assert validate_request(MANAGER, request(), None) is None  # a multimodal processor fills them in later
    assert validate_request(MANAGER, request(image_data=["img"]), []) is None  # the image expands the prompt


def test_input_embeds_must_have_the_hidden_width():
    assert validate_request(MANAGER, request(input_embeds=[[0.0] * 4, [1.0] * 4]), None) is None
    with pytest.raises(ValueError, match=r"input_embeds\[1\] has width 3: every row must have the model's hidden"):
        validate_request(MANAGER, request(input_embeds=[[0.0] * 4, [1.0] * 3]), None)
    with pytest.raises(ValueError, match="non-empty list of rows"):
        validate_request(MANAGER, request(input_embeds=[]), None)
