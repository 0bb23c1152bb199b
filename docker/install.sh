#!/usr/bin/env bash
# Install the sglang-kimi wheel into an environment that already has SGLang, then run the strict doctor.
#
# usage: docker/install.sh WHEEL_OR_FOLDER
#   WHEEL_OR_FOLDER  the sglang_kimi-*.whl that `python -m build --wheel` writes, or the folder holding it (dist/)
#   PYTHON           the interpreter of the SGLang environment (default: python3)
#
# Both Dockerfiles run this script at build time, and so does tests/e2e/test_fresh_install.py. It
#   1. checks that SGLang is importable and that every runtime requirement of the wheel is already installed
#      (torch, safetensors, transformers, tokenizers, numpy, tqdm, requests: every SGLang image has them);
#   2. installs the wheel with `pip install --no-deps`: SGLang, torch and everything else the environment has
#      stay as they are, and the script fails if pip changed any package other than sglang-kimi;
#   3. runs `sglang-kimi doctor --strict`, which exits 1 naming each problem when this SGLang is outside the
#      plugin's supported range or lacks a hook target, a hook signature or a module the plugin needs: a drifted
#      base image fails the build here instead of losing a hook at serving time.
# Root is not needed: the script writes only where the interpreter's pip installs.
set -euo pipefail

say() { printf 'install.sh: %s\n' "$*"; }
die() {
    printf 'install.sh: error: %s\n' "$*" >&2
    exit 1
}

[[ $# -eq 1 ]] || die "usage: $0 WHEEL_OR_FOLDER (the sglang_kimi-*.whl built by \`python -m build --wheel\`, or dist/)"

# --- the wheel --------------------------------------------------------------------------------------------------
target=$1
if [[ -d $target ]]; then
    shopt -s nullglob
    wheels=("$target"/sglang_kimi-*.whl)
    shopt -u nullglob
    if [[ ${#wheels[@]} -eq 0 ]]; then
        die "$target holds no sglang_kimi-*.whl: build one with \`python -m build --wheel\` in the sglang-kimi checkout"
    fi
    if [[ ${#wheels[@]} -gt 1 ]]; then
        die "$target holds ${#wheels[@]} sglang-kimi wheels (${wheels[*]}): keep only the one to install"
    fi
    wheel=${wheels[0]}
elif [[ -f $target ]]; then
    wheel=$target
else
    die "$target: no such file or folder"
fi
wheel_name=${wheel##*/}
case $wheel_name in
    sglang_kimi-*.whl) ;;
    *) die "$wheel is not an sglang-kimi wheel (sglang_kimi-*.whl)" ;;
esac
wheel_dir=$(cd "${wheel%/*}" 2>/dev/null && pwd) || wheel_dir=$PWD  # a bare file name has no folder part
wheel="$wheel_dir/$wheel_name"

# --- the interpreter --------------------------------------------------------------------------------------------
PYTHON=${PYTHON:-python3}
command -v "$PYTHON" >/dev/null 2>&1 || die "no Python interpreter '$PYTHON': set PYTHON to the one that runs SGLang"
PYTHON=$("$PYTHON" -c 'import sys; print(sys.executable)')

# Python runs from an empty folder: a checkout's sglang_kimi/ in the working directory would shadow the installed one.
workdir=$(mktemp -d)
trap 'rm -rf "$workdir"' EXIT
cd "$workdir"

say "wheel:  $wheel"
say "python: $PYTHON"

# --- 1. SGLang and the wheel's runtime requirements are already there -------------------------------------------
sglang=$("$PYTHON" - <<'PY'
import importlib.util
from importlib.metadata import PackageNotFoundError, version

if importlib.util.find_spec("sglang") is None:
    print("")
else:
    try:
        print(version("sglang"))
    except PackageNotFoundError:
        print("(version unknown: no sglang distribution metadata)")
PY
) || die "$PYTHON could not be run to look for SGLang"
[[ -n $sglang ]] || die "SGLang is not importable with $PYTHON: sglang-kimi installs next to an existing SGLang (an official SGLang image, or \`pip install 'sglang-kimi[sglang]'\`)"
say "sglang: $sglang"

"$PYTHON" -m pip --version >/dev/null 2>&1 || die "$PYTHON has no pip: install pip into this environment first"

say "runtime requirements of the wheel (already installed, none is installed or changed here):"
set +e
"$PYTHON" - "$wheel" <<'PY'
import sys
import zipfile
from email.parser import Parser
from importlib.metadata import PackageNotFoundError, version

try:
    from packaging.requirements import Requirement
except ImportError:  # packaging is vendored by pip when it is not installed on its own
    from pip._vendor.packaging.requirements import Requirement

with zipfile.ZipFile(sys.argv[1]) as wheel:
    metadata = [name for name in wheel.namelist() if name.endswith(".dist-info/METADATA")]
    if len(metadata) != 1:
        print(f"  {sys.argv[1]} has no .dist-info/METADATA: not a wheel")
        sys.exit(2)
    fields = Parser().parsestr(wheel.read(metadata[0]).decode())

problems = []
for line in fields.get_all("Requires-Dist") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue  # an extra (sglang, eval, test) or another platform's requirement
    try:
        have = version(req.name)
    except PackageNotFoundError:
        print(f"  {str(req):<24} MISSING")
        problems.append(f"{req.name} is not installed")
        continue
    ok = req.specifier.contains(have, prereleases=True)
    print(f"  {str(req):<24} {have}" + ("" if ok else f"  does not satisfy {req.specifier}"))
    if not ok:
        problems.append(f"{req.name} {have} does not satisfy {req}")
if problems:
    print("  " + "; ".join(problems))
    sys.exit(1)
PY
status=$?
set -e
case $status in
    0) ;;
    2) die "$wheel is not a valid wheel" ;;
    *) die "the environment lacks a runtime requirement of sglang-kimi (listed above): every SGLang image carries them; install the missing ones into this environment or use an official SGLang image" ;;
esac

# --- 2. pip install --no-deps, and nothing else changes ------------------------------------------------------------
installed_packages() {
    "$PYTHON" - <<'PY'
from importlib.metadata import distributions

rows = {f"{d.metadata['Name']}=={d.version}" for d in distributions() if d.metadata["Name"]}
print("\n".join(sorted(rows, key=str.lower)))
PY
}
plugin_row='^sglang[-_]kimi=='

installed_packages >"$workdir/before.txt"
say "pip install --no-deps $wheel"
PIP_ROOT_USER_ACTION=ignore "$PYTHON" -m pip install --no-deps --no-index --no-cache-dir --force-reinstall \
    --disable-pip-version-check "$wheel"
installed_packages >"$workdir/after.txt"
grep -Eiv "$plugin_row" "$workdir/before.txt" >"$workdir/others-before.txt" || true
grep -Eiv "$plugin_row" "$workdir/after.txt" >"$workdir/others-after.txt" || true
if ! changed=$(diff "$workdir/others-before.txt" "$workdir/others-after.txt"); then
    die "pip changed packages other than sglang-kimi:"$'\n'"$changed"
fi
installed=$(grep -Ei "$plugin_row" "$workdir/after.txt") || die "pip did not install sglang-kimi"
location=$("$PYTHON" -c 'import sglang_kimi; print(sglang_kimi.__file__)') || die "sglang_kimi does not import after the install"
say "installed: $installed, imported from $location"

# --- 3. the gate: sglang-kimi doctor --strict ----------------------------------------------------------------------
say "sglang-kimi doctor --strict"
if ! "$PYTHON" -m sglang_kimi.cli.main doctor --strict; then
    die "sglang-kimi doctor --strict found problems (listed above) with this wheel on this environment's SGLang ($sglang): served as it is, the plugin would miss hooks; use a base image with a supported SGLang, or a wheel built from a clean checkout"
fi
say "done: sglang-kimi is installed and passes the strict doctor"
