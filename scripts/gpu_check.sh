#!/usr/bin/env bash
# The GPU checks in one run, on an offline machine with a stock PyTorch image (Python 3.12, PyTorch, Triton):
#   install  the bundle from scripts/build_gpu_bundle.py (SGLang and what it imports) and this plugin;
#   pytest   tests/gpu (the Triton kernels at full Kimi shapes against their torch twins; PYTEST_PATHS: other paths);
#   bench    bench/bench_kernels.py copy, attention (vs SGLang's MLA decode kernel), ddtree, verify;
#   moe      bench/bench_kernels.py moe (SGLang's fused MoE with the plugin's tables; sgl_kernel: the plugin's shim);
#   sweep    bench/sweep_tree_attention.py (launch parameters of the tree attention kernel);
#   imports  every SGLang serving module imported on the GPU, each failure listed;
#   serving  the torch stand-ins for sgl_kernel's ops on the GPU, then the tiny model served in every mode
#            (scripts/gpu_serve_check.py, SERVE_ARGS: its arguments): parity with autoregressive, tokens/s, tau.
#   decide   the planned run that decides tree against chain (scripts/gpu_decide.py, DECIDE_ARGS: its arguments):
#            servers side by side with CUDA graphs, parity, 3 interleaved rounds of >= 5 s levels, JSON each round;
#            run it alone (STEPS=decide): its plan takes the command's time;
#   stepcost one rank of Kimi-K2.6 at TP 8 (RANK_LAYERS deep, random weights) served at fixed widths:
#            bench/bench_step_cost.py (STEPCOST_ARGS: its arguments), then bench/project_kimi.py --measured.
# STEPS (comma list) picks steps, default all but sweep and stepcost; install always runs. Each step has its own
# time limit; a failing step does not stop the later ones. Extra arguments go to bench_kernels.py.
#
#   bash scripts/gpu_check.sh OUT_DIR [BENCH_ARGS...]            # from the repository root
#   STEPS=serving SERVE_ARGS='--graphs eager' bash scripts/gpu_check.sh OUT_DIR
#   STEPS=stepcost bash scripts/gpu_check.sh OUT_DIR
#   STEPS=decide bash scripts/gpu_check.sh OUT_DIR                # the one run that decides (docs/gpu.md)
set -u
OUT=${1:?usage: scripts/gpu_check.sh OUT_DIR [bench_kernels.py args]}
shift
STEPS=,${STEPS:-pytest,bench,moe,imports,serving},
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
step() { echo; echo "=== $1 ($(date +%T))"; }
want() { [[ $STEPS == *",$1,"* ]]; }

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
python3 -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"

step "install"
SITE=/tmp/sglang_kimi_site
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .gpu-bundle/*.whl 2>&1 | tail -3
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | tail -3
export PYTHONPATH=$SITE
if ! python3 -c "import sglang_kimi.kernels" 2>/dev/null; then  # no editable install: the package laid out by hand
    echo "editable install failed: sglang_kimi from /tmp/sglang_kimi_pkg (no entry point: SGLang will not load it)"
    mkdir -p /tmp/sglang_kimi_pkg && cp -r sglang_kimi /tmp/sglang_kimi_pkg/
    for d in kernels speculators evals; do ln -sfn "$PWD/$d" "/tmp/sglang_kimi_pkg/sglang_kimi/$d"; done
    export PYTHONPATH=$SITE:/tmp/sglang_kimi_pkg
    SITE=$PYTHONPATH
fi
if ! PYTHONPATH=$SITE python3 -c "import IPython.display" 2>/dev/null; then  # not carried: scripts/gpu_shims stands in
    export PYTHONPATH=$PYTHONPATH:$PWD/scripts/gpu_shims
    SITE=$SITE:$PWD/scripts/gpu_shims
fi
python3 -c "import sglang, sglang_kimi; print('sglang', sglang.__version__, 'sglang_kimi', sglang_kimi.__version__)" 2>&1 | tail -2
SHIMS=$(python3 -c "import sglang_kimi.launcher.server as s; print(s.SHIMS_DIR)")

if want pytest; then
    step "pytest ${PYTEST_PATHS:-tests/gpu}"
    timeout 140 python3 -m pytest ${PYTEST_PATHS:-tests/gpu} -q -p no:cacheprovider --junitxml="$OUT/pytest_gpu.xml" 2>&1 | tail -25
fi

if want sweep; then
    step "sweep_tree_attention.py"
    timeout 260 python3 bench/sweep_tree_attention.py --out-dir "$OUT" --budget-s "${SWEEP_BUDGET_S:-180}" 2>&1 |
        tail -${SWEEP_TAIL:-60}
fi

if want bench; then
    step "bench_kernels.py --sections copy,attention,ddtree,verify $*"
    timeout 140 python3 bench/bench_kernels.py --sections copy,attention,ddtree,verify --out-dir "$OUT" "$@" 2>&1 |
        tail -60
fi

if want moe; then
    step "bench_kernels.py --sections moe $* (sgl_kernel: the plugin's shim)"
    PYTHONPATH=$SHIMS:$SITE timeout 80 python3 bench/bench_kernels.py --sections moe --out-dir "$OUT" "$@" 2>&1 |
        tail -45
fi

export SGLANG_FORCE_FUSED_OP_BACKEND=torch  # SGLang's own switch: every fused op on its torch implementation
if want imports; then
    step "SGLang serving modules on the GPU (sgl_kernel: the plugin's shim)"
    PYTHONPATH=$SHIMS:$SITE timeout 50 python3 - <<'PY' 2>&1 | grep -v Warning | tail -30
import importlib
for name in """sglang.srt.entrypoints.http_server sglang.srt.managers.scheduler sglang.srt.model_executor.model_runner
sglang.srt.layers.attention.triton_backend sglang.srt.layers.sampler sglang.srt.speculative.dflash_worker_v2
sglang.srt.speculative.eagle_worker_v2 sglang.srt.layers.moe.fused_moe_triton.layer sglang_kimi.plugin""".split():
    try:
        importlib.import_module(name)
        print("ok  ", name)
    except BaseException as exc:
        print("FAIL", name, type(exc).__name__, str(exc)[:300])
PY
fi

serving_env() {
    # SGLang asserts the sglang-kernel distribution's version at start-up; the shim stands in for it here
    META=$SITE/sglang_kernel-0.4.10+sglang_kimi_shim.dist-info
    mkdir -p "$META" && printf 'Metadata-Version: 2.1\nName: sglang-kernel\nVersion: 0.4.10+sglang_kimi_shim\n' >"$META/METADATA"
    # SGLang logs each kernel it compiles at run time; the compiled modules are listed after the run
    export SGLANG_JIT_CACHE_DEBUG=1 SGLANG_JIT_CACHE_DIR=/tmp/sglang_jit
}

if want serving; then
    [ "${STANDIN:-1}" = 1 ] && step "stand-in ops on the GPU (tests/gpu/test_cuda_stand_in_gpu.py)" &&
    PYTHONPATH=$SHIMS:$SITE timeout 60 python3 -m pytest tests/gpu/test_cuda_stand_in_gpu.py -q -p no:cacheprovider 2>&1 |
        tail -15
    step "serve the tiny model: every mode, parity, tokens/s, tau (scripts/gpu_serve_check.py $SERVE_ARGS)"
    serving_env
    # shellcheck disable=SC2086
    PYTHONPATH=$SHIMS:$SITE timeout "${SERVE_TIMEOUT_S:-560}" python3 scripts/gpu_serve_check.py --out "$OUT/serve" \
        ${SERVE_ARGS:-} 2>&1 | tail -${SERVE_TAIL:-80}
    echo "compiled at run time:"; ls /tmp/sglang_jit/* 2>/dev/null | head -30
fi
if want decide; then
    step "the deciding run: tree against chain (scripts/gpu_decide.py $DECIDE_ARGS)"
    serving_env
    # shellcheck disable=SC2086
    PYTHONPATH=$SHIMS:$SITE timeout "${DECIDE_TIMEOUT_S:-560}" python3 scripts/gpu_decide.py --out "$OUT/decide" \
        ${DECIDE_ARGS:-} 2>&1 | tail -${DECIDE_TAIL:-60}
fi
if want stepcost; then
    step "one rank of Kimi-K2.6 at TP 8, ${RANK_LAYERS:-12} layers, random weights: t(B, w) (bench/bench_step_cost.py)"
    serving_env
    python3 scripts/make_rank_shaped.py --out /tmp/kimi_rank --layers "${RANK_LAYERS:-12}" 2>&1 | tail -10
    # shellcheck disable=SC2086
    PYTHONPATH=$SHIMS:$SITE timeout "${STEPCOST_TIMEOUT_S:-430}" python3 bench/bench_step_cost.py \
        --model /tmp/kimi_rank/target --dflash /tmp/kimi_rank/dflash --eagle3 /tmp/kimi_rank/eagle3 \
        --out-dir "$OUT" --name step_cost --log-dir /tmp/kimi_rank/logs --start-timeout 300 \
        --server-args "--load-format dummy --attention-backend triton --mem-fraction-static 0.8 --cuda-graph-max-bs-decode 64" \
        ${STEPCOST_ARGS:---modes ar,tree-16,chain-7,tree-4,tree-32,chain-1,eagle3-3 --input-len 256 --output-len 96 --deadline-s 390 --min-left-s 110} 2>&1 |
        tail -"${STEPCOST_TAIL:-60}"
    [ -f "$OUT/step_cost.json" ] && PYTHONPATH=$SITE timeout 60 python3 bench/project_kimi.py --measured "$OUT/step_cost.json" \
        --devices H200 --context 256 --out-dir "$OUT" --name project_measured --step-costs "$OUT/h200-tp8.step_costs.json" \
        2>&1 | tail -70
    for f in /tmp/kimi_rank/logs/*.log; do [ -f "$f" ] && echo "--- $f" && grep -E "Error|error|Traceback" "$f" | tail -5; done
fi
echo; echo "=== done ($(date +%T))"
