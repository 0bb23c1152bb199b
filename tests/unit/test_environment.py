"""The plugin's environment variables: a misspelt name, a value the reader does not know, or a table folder that is
not there was read as unset and served without a word; ``check_environment`` refuses each, naming the fix."""

import pytest

from sglang_kimi.environment_check import VARIABLES, EnvironmentSettingError, check_environment


@pytest.mark.parametrize(
    "env, words",
    [
        ({"SGLANG_KIMI_KV_SCALE": "kv.json"}, ["SGLANG_KIMI_KV_SCALE is not", "did you mean SGLANG_KIMI_KV_SCALES"]),
        ({"SGLANG_KIMI_DEBUG_GREEDY_VERIFIY": "1"}, ["did you mean SGLANG_KIMI_DEBUG_GREEDY_VERIFY"]),
        ({"SGLANG_KIMI_AITER_OVERIDES": "0"}, ["did you mean SGLANG_KIMI_AITER_OVERRIDES"]),
        ({"SGLANG_KIMI_DEBUG_GREEDY_VERIFY": "true"}, ["=true: only 1 turns it on", "set 1 or 0"]),
        ({"SGLANG_KIMI_DEBUG_GREEDY_VERIFY": " 1"}, ["only 1 turns it on"]),  # read as off
        ({"SGLANG_KIMI_AITER_OVERRIDES": "disable"}, ["=disable: set 0", "1 to keep them"]),
        ({"SGLANG_KIMI_MOE_CONFIG_DIR": "/nonexistent/tables"}, ["/nonexistent/tables is not a folder"]),
        # judged as their readers read them: the overrides stay on for " 0", and the table folder is not expanded
        ({"SGLANG_KIMI_AITER_OVERRIDES": " 0"}, ["= 0: set 0"]),
        ({"SGLANG_KIMI_MOE_CONFIG_DIR": "~"}, ["=~ is not a folder", "no ~"]),
        ({"SGLANG_KIMI_HARDENING": "off"}, ["SGLANG_KIMI_HARDENING=off: set 0", "1 to keep them"]),
        ({"SGLANG_KIMI_HARDNING": "0"}, ["did you mean SGLANG_KIMI_HARDENING"]),
        ({"SGLANG_KIMI_COST_PROBE": "on"}, ["SGLANG_KIMI_COST_PROBE=on: only 1 turns the cost probe on"]),
        ({"SGLANG_KIMI_COST_PROBES": "1"}, ["did you mean SGLANG_KIMI_COST_PROBE"]),
        (
            {"SGLANG_KIMI_ACCEPTANCE_TRACE": "/nonexistent/folder/paths.jsonl"},
            ["/nonexistent/folder/paths.jsonl: its folder does not exist"],
        ),
        (
            {"SGLANG_KIMI_DRAFT_GRAPHS": "off"},
            ["SGLANG_KIMI_DRAFT_GRAPHS=off: set 1", "0 (the drafter eager)"],
        ),
    ],
)
def test_settings_read_as_unset_are_refused(env, words):
    with pytest.raises(EnvironmentSettingError) as refused:
        check_environment(env)
    assert all(w in str(refused.value) for w in words), str(refused.value)


def test_what_the_readers_take_is_accepted(tmp_path):
    check_environment({})
    check_environment(
        {
            "SGLANG_KIMI_KV_SCALES": "observe",  # checked by kv_scales itself
            "SGLANG_KIMI_DEBUG_GREEDY_VERIFY": "0",
            "SGLANG_KIMI_AITER_OVERRIDES": "off",
            "SGLANG_KIMI_MOE_CONFIG_DIR": str(tmp_path),
            "SGLANG_KIMI_HARDENING": "0",
            "SGLANG_KIMI_COST_PROBE": "1",
            "SGLANG_KIMI_DRAFT_GRAPHS": "check",
            "SGLANG_KIMI_ACCEPTANCE_TRACE": str(tmp_path / "paths.jsonl"),
            # SGLang's own variables under the prefix, and names far from any of the plugin's
            "SGLANG_KIMI_K3_VIT_CUDA_GRAPH_MIN_HITS": "3",
            "SGLANG_KIMI_WHEEL": "dist/x.whl",
        }
    )
    for value in ("1", "true", "yes", "on", "0", "FALSE", "No"):
        check_environment({"SGLANG_KIMI_AITER_OVERRIDES": value})


def test_every_variable_is_in_the_operations_table():
    from support.paths import DOCS

    table = (DOCS / "operations.md").read_text()
    assert [name for name in VARIABLES if f"| `{name}` |" not in table] == []
