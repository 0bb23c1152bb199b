"""``sglang-kimi drafter regenerate`` against a stand-in chat server (the real target's server is the e2e test's):
SpecForge's row format out, every input form in, bad rows skipped with their reason, failures reported and tried
again by --resume, rows in flight at once; ``sglang-kimi drafter config``: SpecForge's draft configs that the plugin's
pairing check accepts for the target, Kimi's mask token and layers."""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sglang_kimi.assets import TINY_MODEL
from sglang_kimi.cli import main as cli
from sglang_kimi.drafters import draft_config
from sglang_kimi.models.kimi_shapes import KIMI_K25_DFLASH, RankShape, rank_target_config
from sglang_kimi.speculators.pairing import validate_pair


@contextmanager
def chat_server(fail_on: str | None = None, delay: float = 0.0):
    """/v1/models and /v1/chat/completions answering ``answer(<last user text>)#<turns so far>``; HTTP 500 for a last
    user text containing ``fail_on``. Records every conversation it was sent and the most requests at once."""
    seen: list[list[dict]] = []
    state = {"now": 0, "most": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: dict):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802
            self._send(200, {"data": [{"id": "tiny"}]}) if self.path == "/v1/models" else self._send(404, {})

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            with lock:
                state["now"] += 1
                state["most"] = max(state["most"], state["now"])
                seen.append(body["messages"])
            time.sleep(delay)
            last = body["messages"][-1]["content"]
            with lock:
                state["now"] -= 1
            if fail_on is not None and fail_on in last:
                self._send(500, {"error": "boom"})
                return
            message = {"role": "assistant", "content": f"answer({last})#{len(body['messages'])}"}
            self._send(200, {"choices": [{"message": message}]})

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen, state
    finally:
        httpd.shutdown()
        httpd.server_close()


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


ROWS = [
    {"id": "a", "conversations": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "dataset answer"}, {"role": "user", "content": "q2"},
    ]},
    {"conversations": [{"from": "human", "value": "sharegpt q"}, {"from": "gpt", "value": "theirs"}], "source": "x"},
    {"prompt": "plain prompt"},
    {"messages": [{"role": "assistant", "content": "starts with an answer"}]},
    {"conversations": [{"role": "user", "content": "  "}]},
    {"question": 3},
]  # fmt: skip


def test_rows_in_every_form_come_out_in_specforges_format(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(json.dumps(r) for r in ROWS) + "\nnot json\n")
    out = tmp_path / "out.jsonl"
    with chat_server() as (url, seen, _):
        code = cli.main(["drafter", "regenerate", "--input", str(source), "--output", str(out), "--base-url", url])
    assert code == 0
    done = {row["id"]: row for row in lines(out)}
    assert set(done) == {"a", "row-1", "row-2"} and all(r["status"] == "success" for r in done.values())
    # the dataset's answer replaced by the target's, the second turn asked after the target's first answer
    assert done["a"]["conversations"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "answer(q1)#2"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "answer(q2)#4"},
    ]
    sent = [[m["content"] for m in conversation] for conversation in seen]
    assert ["be brief", "q1", "answer(q1)#2", "q2"] in sent and ["be brief", "q1"] in sent
    assert done["row-1"]["conversations"][1] == {"role": "assistant", "content": "answer(sharegpt q)#1"}
    assert done["row-1"]["source"] == "x"  # the row's other fields are kept
    assert done["row-2"]["conversations"] == [{"role": "user", "content": "plain prompt"},
                                              {"role": "assistant", "content": "answer(plain prompt)#1"}]  # fmt: skip
    skipped = {row["id"]: row["error"] for row in lines(tmp_path / "out_skipped.jsonl")}
    assert set(skipped) == {"row-3", "row-4", "row-5", "row-6"}
    assert "user turn belongs" in skipped["row-3"] and "no text content" in skipped["row-4"]
    assert "no conversations" in skipped["row-5"] and "not a JSON object" in skipped["row-6"]


def test_a_json_array_input_and_several_rows_in_flight(tmp_path):
    source = tmp_path / "sharegpt.json"
    source.write_text(
        json.dumps([{"id": i, "conversations": [{"from": "human", "value": f"q{i}"}]} for i in range(12)])
    )
    out = tmp_path / "out.jsonl"
    with chat_server(delay=0.2) as (url, _, state):
        args = ["drafter", "regenerate", "--input", str(source), "--output", str(out), "--base-url", url]
        assert cli.main([*args, "--concurrency", "4", "--limit", "10"]) == 0
    assert sorted(int(r["id"]) for r in lines(out)) == list(range(10))
    assert state["most"] >= 2, "rows were not sent concurrently"


def test_failed_rows_are_reported_and_resume_tries_only_them(tmp_path, capsys):
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(json.dumps({"id": f"r{i}", "prompt": f"FAIL {i}" if i % 3 == 0 else f"ok {i}"})
                                for i in range(9)))  # fmt: skip
    out = tmp_path / "out.jsonl"
    args = ["drafter", "regenerate", "--input", str(source), "--output", str(out)]
    with chat_server(fail_on="FAIL") as (url, _, _):
        assert cli.main([*args, "--base-url", url]) == 1
    assert "3 rows failed on the server" in capsys.readouterr().err
    assert {r["id"] for r in lines(tmp_path / "out_error.jsonl")} == {"r0", "r3", "r6"}
    assert all("HTTP 500" in r["error"] for r in lines(tmp_path / "out_error.jsonl"))
    with chat_server() as (url, seen, _):
        assert cli.main([*args, "--base-url", url]) == 2  # OUT exists: refused without --resume
        assert "pass --resume" in capsys.readouterr().err
        assert cli.main([*args, "--base-url", url, "--resume"]) == 0
    assert sorted(m[-1]["content"] for m in seen) == ["FAIL 0", "FAIL 3", "FAIL 6"]  # only the failed rows again
    assert sorted(r["id"] for r in lines(out)) == [f"r{i}" for i in range(9)]
    assert lines(tmp_path / "out_error.jsonl") == []


def test_an_unreachable_or_foreign_server_is_refused(tmp_path, capsys):
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"prompt": "x"}))
    args = ["drafter", "regenerate", "--input", str(source), "--output", str(tmp_path / "o.jsonl"), "--base-url"]
    assert cli.main([*args, "http://127.0.0.1:1"]) == 2
    assert "cannot reach http://127.0.0.1:1" in capsys.readouterr().err


def test_dflash_config_of_the_tiny_target_pairs_with_it(tmp_path):
    path = tmp_path / "draft.json"
    assert (
        cli.main(["drafter", "config", "--algorithm", "dflash", "--target", str(TINY_MODEL), "--output", str(path)])
        == 0
    )
    config = json.loads(path.read_text())
    assert config["dflash_config"]["mask_token_id"] == 4094  # the tiny tokenizer's [UNK]
    assert (
        config["num_target_layers"] == 6 and config["layer_types"] == ["full_attention"] * config["num_hidden_layers"]
    )
    assert config["dflash_config"]["target_layer_ids"] == [1, 2, 3]  # distinct layers of a 6-layer target
    assert config["target_model_name_or_path"] == str(TINY_MODEL.resolve())
    parsed = validate_pair(str(TINY_MODEL), config, expected_algorithm="DFLASH")
    assert parsed.mask_token_id == 4094 and parsed.num_target_layers == 6


def test_dflash_and_eagle3_configs_of_kimi(tmp_path):
    target = tmp_path / "kimi"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(rank_target_config(RankShape(tp=1))))
    config = draft_config.dflash_config(target, target_name="moonshotai/Kimi-K2.6")
    assert config["dflash_config"] == {"mask_token_id": 163838, "target_layer_ids": [1, 12, 24, 35, 47, 58]}
    assert (config["num_target_layers"], config["block_size"], config["num_hidden_layers"]) == (61, 8, 6)
    assert config["intermediate_size"] == KIMI_K25_DFLASH["intermediate_size"]
    assert config["target_model_name_or_path"] == "moonshotai/Kimi-K2.6"
    validate_pair(target, config, expected_algorithm="DFLASH")
    eagle = draft_config.eagle3_config(target)
    assert eagle["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 29, 57]
    assert "norm_output" not in eagle and eagle["draft_vocab_size"] == 163840
    validate_pair(target, eagle, expected_algorithm="EAGLE3")


def test_a_target_without_a_mask_token_is_refused_naming_the_flag(tmp_path, capsys):
    target = tmp_path / "plain"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"num_hidden_layers": 8, "hidden_size": 512, "vocab_size": 1000}))
    assert cli.main(["drafter", "config", "--algorithm", "dflash", "--target", str(target)]) == 2
    assert "pass --mask-token-id" in capsys.readouterr().err
    assert (
        cli.main(["drafter", "config", "--algorithm", "dflash", "--target", str(target), "--mask-token-id", "7"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["dflash_config"]["mask_token_id"] == 7
    with pytest.raises(draft_config.DraftConfigError, match="outside the target's vocabulary"):
        draft_config.dflash_config(target, mask_id=1000)


def test_specforge_exports_the_plugin_cannot_serve_are_refused_naming_the_fix():
    """A SpecForge DFlash config with a sliding-window layer (its Qwen3.6 configs have them), and an export that lost
    the mask token SpecForge resolved at training time: each refused with what to change."""
    from sglang_kimi.speculators.configs import DrafterConfigError, parse_drafter_config

    config = draft_config.dflash_config(TINY_MODEL)
    sliding = {**config, "layer_types": ["sliding_attention"] + config["layer_types"][1:], "sliding_window": 2048}
    with pytest.raises(DrafterConfigError, match="train the drafter with full-attention layers.*drafter config"):
        parse_drafter_config(sliding)
    lost = {**config, "dflash_config": {"target_layer_ids": config["dflash_config"]["target_layer_ids"]}}
    with pytest.raises(DrafterConfigError, match="mask_token_id is missing: add the token id.*export --to hf"):
        parse_drafter_config(lost)
    parse_drafter_config(config)


def test_compare_statistics_from_accepted_paths():
    """Nested budgets: budget b accepts the path's nodes numbered within b; tau(b) = 1 + their mean per step; depth d:
    the share of steps whose path reached d drafts; the best budget per batch by tokens per second."""
    from sglang_kimi.drafters.compare import acceptance, best_budgets, budgets_up_to

    assert budgets_up_to(16) == [0, 1, 2, 4, 8, 16] and budgets_up_to(6) == [0, 1, 2, 4, 6]
    paths = [[1, 2, 5], [1, 3], [], [2, 9, 10, 11]]  # four steps of a budget-16 tree
    stats = acceptance(paths, 16)
    assert stats["steps"] == 4
    assert stats["tau_by_budget"][0] == 1.0
    assert stats["tau_by_budget"][1] == 1 + (1 + 1 + 0 + 0) / 4  # node 1 leads two paths
    assert stats["tau_by_budget"][4] == 1 + (2 + 2 + 0 + 1) / 4
    assert stats["tau_by_budget"][16] == 1 + (3 + 2 + 0 + 4) / 4
    assert stats["accepted_by_depth"] == [0.75, 0.75, 0.5, 0.25]
    seconds = {1: {0: 1.0, 8: 1.2, 16: 2.0}, 64: {0: 1.0, 8: 3.0, 16: 6.0}}
    taus = {0: 1.0, 8: 2.5, 16: 3.0}
    best = best_budgets(taus, seconds)
    assert best[1]["budget"] == 8 and best[1]["speedup"] == pytest.approx(2.5 / 1.2)
    assert best[64]["budget"] == 0 and best[64]["speedup"] == pytest.approx(1.0)  # drafting costs more than it gives


def test_compare_refuses_what_it_cannot_run(tmp_path, capsys):
    base = ["drafter", "compare", "--target", str(TINY_MODEL)]
    assert cli.main([*base, "--drafter", "a=/x"]) == 2
    assert "two or more drafters" in capsys.readouterr().err
    assert cli.main([*base, "--drafter", "a=/x", "--drafter", "a=/y"]) == 2
    assert "given twice" in capsys.readouterr().err
    assert cli.main([*base, "--drafter", "/x", "--drafter", "b=/y"]) == 2
    assert "give NAME=PATH" in capsys.readouterr().err
    bad = tmp_path / "costs.json"
    bad.write_text("{}")
    assert cli.main([*base, "--drafter", "a=/x", "--drafter", "b=/y", "--step-costs", str(bad)]) == 2
    assert "is not sglang-kimi-step-costs" in capsys.readouterr().err


def test_training_reads_regenerated_conversations_one_sequence_per_assistant_turn(tmp_path, monkeypatch):
    """``scripts/train_drafters.py --data``: every assistant turn of SpecForge's rows is one sequence, the
    conversation before it rendered by the target's chat template with the generation prompt (no loss there), then
    the turn as the template closes it; failed rows, rows without a conversation and turns whose context reaches the
    length cap are left out and counted."""
    from support.paths import SCRIPTS

    monkeypatch.syspath_prepend(str(SCRIPTS))
    import _drafter_common
    import train_drafters

    tokenizer = _drafter_common.load_tokenizer()
    long_question = "How many? " * 80
    conversation = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "It is 5."},
                    {"role": "user", "content": "And 2 + 4?"},
                    {"role": "assistant", "content": "It is 6."}]  # fmt: skip
    rows = [{"id": "a", "conversations": conversation, "status": "success"},
            {"id": "b", "conversations": conversation[:2], "status": "error", "error": "HTTP 500"},
            {"id": "c", "text": "no conversation"},
            {"id": "d", "conversations": [{"role": "user", "content": long_question},
                                          {"role": "assistant", "content": "Many."}]}]  # fmt: skip
    path = tmp_path / "regenerated.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    seqs, skipped = train_drafters.conversation_sequences(path, tokenizer, max_len=64)
    assert skipped == {"rows_without_conversation": 2, "turns_not_extending_the_context": 0, "turns_past_max_len": 1}
    assert len(seqs) == 2

    def render(messages, prompt):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=prompt, tokenize=False)

    for seq, k in zip(sorted(seqs, key=lambda s: s["prompt_len"]), (1, 3)):
        context, turn = seq["ids"][: seq["prompt_len"]], seq["ids"][seq["prompt_len"] :]
        assert tokenizer.decode(context) == render(conversation[:k], True)
        assert tokenizer.decode(context + turn) == render(conversation[: k + 1], False)
        assert tokenizer.decode(turn) == conversation[k]["content"] + "<|im_end|>"
    short, _ = train_drafters.conversation_sequences(path, tokenizer, max_len=30)
    assert all(len(s["ids"]) <= 30 for s in short) and len(short) >= 1


def test_compare_refuses_a_dflash2_drafter_before_serving_anything(tmp_path):
    """``drafter compare`` measures DDTree budgets, and DFlash2 drafters are served as chains only."""
    from sglang_kimi.assets import TINY_DFLASH, TINY_DFLASH2
    from sglang_kimi.drafters.compare import CompareError, compare

    with pytest.raises(CompareError, match="is a DFlash2 drafter .*served as chains only"):
        compare(str(TINY_MODEL), {"dflash": str(TINY_DFLASH), "dflash2": str(TINY_DFLASH2)}, {"q": ["hi"]},
                log_dir=tmp_path)  # fmt: skip
    assert not any(tmp_path.iterdir())  # no server was started
