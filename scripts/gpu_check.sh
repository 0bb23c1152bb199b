#!/usr/bin/env bash
# The GPU checks in one run, on an offline machine with a stock PyTorch image (Python 3.12, PyTorch, Triton):
#   1. install the bundle from scripts/build_gpu_bundle.py (SGLang and what it imports) and this plugin;
#   2. pytest tests/gpu (the Triton kernels at full Kimi shapes against their torch twins);
#   3. bench/bench_kernels.py (copy ceiling, tree MLA attention vs SGLang's MLA decode kernel, DDTree build,
#      verify, fused MoE tables), JSON into the output folder;
#   4. SGLang on the GPU: every serving module imported (each failure listed), then the tiny model served
#      autoregressively with the triton attention backend and the pytorch sampler, one greedy request.
# Each step has its own time limit and log; a failing step does not stop the later ones.
#
#   bash scripts/gpu_check.sh OUT_DIR [BENCH_ARGS...]     # from the repository root
set -u
OUT=${1:?usage: scripts/gpu_check.sh OUT_DIR [bench_kernels.py args]}
shift
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
step() { echo; echo "=== $1 ($(date +%T))"; }

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

step "pytest tests/gpu"
timeout 140 python3 -m pytest tests/gpu -q -p no:cacheprovider --junitxml="$OUT/pytest_gpu.xml" 2>&1 | tail -25

step "bench_kernels.py --sections copy,attention,ddtree,verify $*"
timeout 140 python3 bench/bench_kernels.py --sections copy,attention,ddtree,verify --out-dir "$OUT" "$@" 2>&1 | tail -60

SHIMS=$(python3 -c "import sglang_kimi.server as s; print(s.SHIMS_DIR)")
step "bench_kernels.py --sections moe $* (sgl_kernel: the plugin's shim)"
PYTHONPATH=$SHIMS:$SITE timeout 80 python3 bench/bench_kernels.py --sections moe --out-dir "$OUT" "$@" 2>&1 | tail -45

step "SGLang serving modules on the GPU (sgl_kernel: the plugin's shim)"
export SGLANG_FORCE_FUSED_OP_BACKEND=native
PYTHONPATH=$SHIMS:$SITE timeout 50 python3 - <<'EOF' 2>&1 | grep -v Warning | tail -30
import importlib, traceback
for name in """sglang.srt.entrypoints.http_server sglang.srt.managers.scheduler sglang.srt.model_executor.model_runner
sglang.srt.layers.attention.triton_backend sglang.srt.layers.sampler sglang.srt.speculative.dflash_worker_v2
sglang.srt.speculative.eagle_worker_v2 sglang.srt.layers.moe.fused_moe_triton.layer sglang_kimi.plugin""".split():
    try:
        importlib.import_module(name)
        print("ok  ", name)
    except BaseException as exc:
        print("FAIL", name, type(exc).__name__, str(exc)[:300])
EOF

step "serve the tiny model (autoregressive, triton attention, CUDA graphs off)"
PYTHONPATH=$SHIMS:$SITE timeout 110 python3 - "$OUT" <<'EOF' 2>&1 | tail -60
import json, sys, time, urllib.request
from pathlib import Path
from sglang_kimi.server import ServerProcess, launch_command
args = ["--attention-backend", "triton", "--sampling-backend", "pytorch", "--disable-cuda-graph",
        "--mem-fraction-static", "0.3", "--log-level", "info"]
spec = launch_command(args, cpu=False)
spec.env["PYTHONPATH"] = __import__("os").environ["PYTHONPATH"]
log = Path(sys.argv[1]) / "serve_ar.log"
server = ServerProcess(spec, log_path=log)
try:
    t0 = time.time()
    server.wait_ready(timeout=90)
    print(f"ready in {time.time() - t0:.0f} s")
    body = {"text": "Question: What is 2 + 3?\nAnswer:", "sampling_params": {"max_new_tokens": 32, "temperature": 0}}
    req = urllib.request.Request(server.base_url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"})
    print(json.loads(urllib.request.urlopen(req, timeout=60).read())["text"])
except BaseException as exc:
    print("serving failed:", type(exc).__name__, str(exc)[:2000])
finally:
    server.stop()
print(open(log).read()[-6000:])
EOF
echo; echo "=== done ($(date +%T))"
