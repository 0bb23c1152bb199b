"""Quality gate and serving benchmark of speculative-decoding configurations (installed as ``sglang_kimi.evals``).

- ``sglang-kimi eval gsm8k``: :mod:`.gsm8k` runs lm-eval's ``gsm8k`` task (:mod:`.gsm8k_task`: stock, or the same
  definition on local JSONL) against a baseline and a candidate server, :mod:`.stats` compares them (paired z),
  :mod:`.report` writes JSON / Markdown.
- ``sglang-kimi bench``: :mod:`.bench` sweeps concurrency through SGLang's own benchmark code
  (:mod:`.sglang_bench`), reads acceptance from ``/server_info`` (:mod:`.acceptance`), draws :mod:`.plots`.
- :mod:`.servers`: probing URLs (unreachable / not SGLang / different models) and launching servers;
  :mod:`.parsers`: the argument parsers, wired into ``sglang_kimi.cli.main``; :mod:`.errors`: exit code 2.
"""
