#!/usr/bin/env bash
# The GPU checks in one run, on an offline machine with a stock PyTorch image (Python 3.12, PyTorch, Triton):
#   install  the bundle from scripts/build_gpu_bundle.py (SGLang and what it imports) and this plugin;
#   pytest   tests/gpu (the Triton kernels at full Kimi shapes against their torch twins);
#   bench    bench/bench_kernels.py copy, attention (vs SGLang's MLA decode kernel), ddtree, verify;
#   moe      bench/bench_kernels.py moe (SGLang's fused MoE with the plugin's tables; sgl_kernel: the plugin's shim);
#   sweep    bench/sweep_tree_attention.py (launch parameters of the tree attention kernel);
#   imports  every SGLang serving module imported on the GPU, each failure listed;
#   serve    the tiny model served autoregressively (triton attention, pytorch sampler), one greedy request.
# STEPS (comma list) picks steps, default all but sweep; install always runs. Each step has its own time limit;
# a failing step does not stop the later ones. Extra arguments go to bench_kernels.py.
#
#   bash scripts/gpu_check.sh OUT_DIR [BENCH_ARGS...]            # from the repository root
#   STEPS=sweep,serve bash scripts/gpu_check.sh OUT_DIR
set -u
OUT=${1:?usage: scripts/gpu_check.sh OUT_DIR [bench_kernels.py args]}
shift
STEPS=,${STEPS:-pytest,bench,moe,imports,serve},
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
python3 -c "import sglang, sglang_kimi; print('sglang', sglang.__version__, 'sglang_kimi', sglang_kimi.__version__)" 2>&1 | tail -2
SHIMS=$(python3 -c "import sglang_kimi.server as s; print(s.SHIMS_DIR)")

if want pytest; then
    step "pytest tests/gpu"
    timeout 140 python3 -m pytest tests/gpu -q -p no:cacheprovider --junitxml="$OUT/pytest_gpu.xml" 2>&1 | tail -25
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

export SGLANG_FORCE_FUSED_OP_BACKEND=native  # SGLang's own switch: every fused op on its torch implementation
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

if want serve; then
    step "serve the tiny model (autoregressive, triton attention, CUDA graphs off)"
    # SGLang asserts the sglang-kernel distribution's version at start-up; the shim stands in for it here
    META=$SITE/sglang_kernel-0.4.10+sglang_kimi_shim.dist-info
    mkdir -p "$META" && printf 'Metadata-Version: 2.1\nName: sglang-kernel\nVersion: 0.4.10+sglang_kimi_shim\n' >"$META/METADATA"
    PYTHONPATH=$SHIMS:$SITE timeout 100 python3 - "$OUT" <<'PY' 2>&1 | tail -60
import json, os, sys, time, urllib.request
from pathlib import Path
from sglang_kimi.server import ServerProcess, launch_command
args = ["--attention-backend", "triton", "--sampling-backend", "pytorch", "--disable-cuda-graph",
        "--mem-fraction-static", "0.3", "--log-level", "info"]
spec = launch_command(args, cpu=False)
spec.env["PYTHONPATH"] = os.environ["PYTHONPATH"]
log = Path(sys.argv[1]) / "serve_ar.log"
server = ServerProcess(spec, log_path=log)
try:
    t0 = time.time()
    server.wait_ready(timeout=80)
    print(f"ready in {time.time() - t0:.0f} s")
    body = {"text": "Question: What is 2 + 3?\nAnswer:", "sampling_params": {"max_new_tokens": 32, "temperature": 0}}
    req = urllib.request.Request(server.base_url + "/generate", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    print(json.loads(urllib.request.urlopen(req, timeout=60).read())["text"])
except BaseException as exc:
    print("serving failed:", type(exc).__name__, str(exc)[:2000])
finally:
    server.stop()
print(open(log).read()[-5000:])
PY
fi
echo; echo "=== done ($(date +%T))"
