"""Compile the kernels offline for a GPU target and report registers, spills and shared memory: no GPU needed.

Triton compiles for any target it has a backend for (the pip wheel carries the NVIDIA and AMD backends, ``ptxas``
and ``cuobjdump``), so the resource questions of ``docs/kernels.md`` ("are there spills, how much shared memory, are the
matrix instructions there") are answered on a CPU box before any device time is spent.

The launches are the wrappers' own: each wrapper runs on small CPU tensors with ``interpret.launch`` replaced by a
recorder, so the kernel arguments, constexprs and ``num_warps`` are exactly what the wrapper passes on a GPU
(tensor dtypes switched to what serving uses: bf16 q, cache, logits). Run as::

    python -m sglang_kimi.kernels.resource_report --targets sm_90,gfx942,gfx950

It must run in a process where Triton was imported *without* ``TRITON_INTERPRET`` (the interpreter replaces the
compiler). CUDA reports come from ``cuobjdump --dump-resource-usage`` and the SASS (HMMA/HGMMA, local-memory
LDL/STL); AMD reports from the ``.amdhsa`` metadata of the generated assembly.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

TARGETS = {
    "sm_90": ("cuda", 90, 32),  # H100 / H200
    "gfx942": ("hip", "gfx942", 64),  # MI300X / MI325X
    "gfx950": ("hip", "gfx950", 64),  # MI350X / MI355X
}


@dataclass
class Launch:
    name: str
    kernel: object
    args: tuple
    kwargs: dict
    dtypes: dict = field(default_factory=dict)  # argument name -> torch dtype on the GPU


def recorded_launches(hip: bool = False) -> list[Launch]:
    """Run every wrapper once on CPU tensors with the launcher recording instead of launching, with the launch
    parameters the wrappers choose on the vendor (``hip``: AMD) the launches are compiled for."""
    import torch

    from sglang_kimi.kernels import ddtree_build as dd
    from sglang_kimi.kernels import interpret
    from sglang_kimi.kernels import tree_mla_attention as tm
    from sglang_kimi.kernels import tree_verify as tv
    from sglang_kimi.speculators.trees import DraftTree

    launches: list[Launch] = []
    current = {"name": "", "dtypes": {}}

    def record(kernel, grid, *args, **kwargs):
        launches.append(Launch(current["name"], kernel, args, kwargs, dict(current["dtypes"])))

    saved = interpret.launch
    interpret.launch = record
    try:
        bf16 = torch.bfloat16
        B, N, H, slots = 2, 8, 8, 64
        q = torch.randn(B * N, H, 576)
        kv = torch.randn(slots, 1, 576)
        r2t = torch.randint(0, slots, (B, 32), dtype=torch.int32)
        pool, prefix = torch.arange(B), torch.tensor([10, 20], dtype=torch.int32)
        mask = torch.ones(B, N, N, dtype=torch.bool).tril()
        tile = tm.HIP_TILE if hip else tm.CUDA_TILE
        current.update(name="tree_mla fused", dtypes={"q_ptr": bf16, "kv_ptr": bf16, "out_ptr": bf16})
        tm.tree_mla_attention(q, kv, r2t, pool, prefix, mask, 0.1, **{**tile, "num_kv_splits": 1})
        current.update(name="tree_mla split+merge", dtypes={"q_ptr": bf16, "kv_ptr": bf16})
        tm.tree_mla_attention(q, kv, r2t, pool, prefix, mask, 0.1, **{**tile, "num_kv_splits": 4})
        launches[-1].dtypes = {"out_ptr": bf16}  # the merge kernel writes the bf16 output
        launches[-1].name = "tree_mla merge"

        parents = torch.full((2, 64), -1, dtype=torch.long)
        parents[:, 1:] = torch.arange(63) // 2
        tree = DraftTree.from_parents(torch.randint(2048, (2, 64)), parents)
        args = (tree.tokens, tree.retrieve_index(), tree.retrieve_next_token(), tree.retrieve_next_sibling())
        logits = torch.randn(2, 64, 2048)
        spec = tree.max_depth + 1
        current.update(name="tree_verify greedy (argmax given)", dtypes={})
        tv.tree_verify(*args, num_spec_tokens=spec, target_predict=logits.argmax(-1))
        current.update(name="tree_verify greedy (bf16 logits)", dtypes={"target_ptr": bf16})
        tv.tree_verify(*args, num_spec_tokens=spec, target_logits=logits)
        current.update(name="tree_verify sampled", dtypes={})
        tv.tree_verify(
            *args,
            num_spec_tokens=spec,
            target_probs=logits.softmax(-1),
            uniform_samples=torch.rand(2, 64),
            uniform_samples_for_final_sampling=torch.rand(2),
        )
        current.update(name="ddtree_build (budget 64, depth 7)", dtypes={})
        from sglang_kimi.speculators.ddtree import rank_draft_logits

        lp, ids = rank_draft_logits(torch.randn(2, 7, 500), 64)
        dd.ddtree_build(torch.tensor([1, 2]), lp, ids, 64)
    finally:
        interpret.launch = saved
    return launches


_TORCH_TO_TRITON = {
    "torch.float32": "fp32",
    "torch.bfloat16": "bf16",
    "torch.float16": "fp16",
    "torch.int32": "i32",
    "torch.int64": "i64",
    "torch.bool": "i1",
}


def signature(launch: Launch) -> tuple[dict, dict, dict]:
    """(signature, constexprs, options) for ``triton.compile`` from a recorded launch."""
    import torch

    fn = launch.kernel
    fn = getattr(fn, "fn", fn)
    import inspect

    names = list(inspect.signature(fn).parameters)
    options = {k: launch.kwargs[k] for k in ("num_warps", "num_stages") if k in launch.kwargs}
    constexprs = {k: v for k, v in launch.kwargs.items() if k not in options}
    sig = {}
    for name, value in zip(names, launch.args):
        if isinstance(value, torch.Tensor):
            dtype = launch.dtypes.get(name, value.dtype)
            sig[name] = "*" + _TORCH_TO_TRITON[str(dtype)]
        elif isinstance(value, bool):
            sig[name] = "i1"
        elif isinstance(value, int):
            sig[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        elif isinstance(value, float):
            sig[name] = "fp32"
        else:
            raise TypeError(f"{launch.name}: cannot type argument {name}={value!r}")
    for name in constexprs:
        sig[name] = "constexpr"
    return sig, constexprs, options


def _tool(name: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def compile_launch(launch: Launch, target_name: str) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    kernel = launch.kernel
    if not isinstance(kernel, JITFunction):
        raise RuntimeError("resource_report needs Triton's compiler: run it without TRITON_INTERPRET")
    sig, constexprs, options = signature(launch)
    backend, arch, warp = TARGETS[target_name]
    compiled = triton.compile(
        ASTSource(kernel, sig, constexprs), target=GPUTarget(backend, arch, warp), options=options
    )
    row = {
        "kernel": launch.name,
        "target": target_name,
        "num_warps": options.get("num_warps"),
        "constexprs": {k: v for k, v in constexprs.items()},
        "shared_bytes": compiled.metadata.shared,
    }
    if backend == "cuda":
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(compiled.asm["cubin"])
            path = f.name
        try:
            usage = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", path], capture_output=True, text=True)
            sass = subprocess.run([_tool("cuobjdump"), "-sass", path], capture_output=True, text=True).stdout
        finally:
            os.unlink(path)
        found = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", usage.stdout))
        if "REG" not in found:
            raise RuntimeError(f"cuobjdump gave no resource usage: {usage.stdout[-300:]} {usage.stderr[-300:]}")
        row.update(
            registers=int(found["REG"]),
            spill_bytes=int(found.get("STACK", 0)) + int(found.get("LOCAL", 0)),
            local_loads=sass.count("LDL"),
            local_stores=sass.count("STL"),
            hmma=sass.count("HMMA"),
            hgmma=sass.count("HGMMA"),
        )
    else:
        asm = compiled.asm["amdgcn"]

        def meta(key):
            m = re.search(rf"\.{key}:\s*(\d+)", asm)
            return int(m.group(1)) if m else None

        row.update(
            registers=meta("vgpr_count"),
            agprs=meta("agpr_count"),
            spill_bytes=(meta("vgpr_spill_count") or 0) + (meta("sgpr_spill_count") or 0),
            mfma=asm.count("v_mfma"),
        )
    return row


def report(targets: list[str]) -> list[dict]:
    return [compile_launch(launch, t) for t in targets for launch in recorded_launches(TARGETS[t][0] == "hip")]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default="sm_90,gfx942", help=f"comma list of {sorted(TARGETS)}")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("error: unset TRITON_INTERPRET (the interpreter replaces the compiler)", file=sys.stderr)
        return 2
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, without its warning
    rows = report([t for t in args.targets.split(",") if t])
    if args.json:
        print(json.dumps(rows))
        return 0
    cols = ["target", "kernel", "num_warps", "registers", "spill_bytes", "shared_bytes", "hmma", "hgmma", "mfma"]
    print("  ".join(cols))
    for r in rows:
        print("  ".join(str(r.get(c, "")) for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
