"""`sglang-kimi doctor --model-path P`: the bytes text-only serving does not load, read from safetensors headers."""

import json
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_kimi.assets import TINY_MODEL
from sglang_kimi.cli import doctor
from sglang_kimi.cli import main as cli


def _vision_bytes_by_loading(path) -> tuple[int, int, int]:
    sd = load_file(path / "model.safetensors")
    nbytes = lambda prefix: sum(t.numel() * t.element_size() for n, t in sd.items() if n.startswith(prefix))  # noqa
    return nbytes("vision_tower."), nbytes("mm_projector."), sum(t.numel() * t.element_size() for t in sd.values())


def test_tiny_model_savings_match_the_loaded_tensors():
    saved = doctor.text_only_savings(TINY_MODEL)
    tower, projector, total = _vision_bytes_by_loading(TINY_MODEL)
    assert saved["vision_tower_bytes"] == tower > 0
    assert saved["mm_projector_bytes"] == projector > 0
    assert saved["checkpoint_bytes"] == total
    assert saved["skipped_bytes"] == tower + projector
    assert saved["skipped_fraction"] == pytest.approx((tower + projector) / total)
    assert saved["vision_tower_tensors"] == 5 + 12  # patch embed (3) + final norm (2) + one block (12)
    assert saved["mm_projector_tensors"] == 6


def _truncated_shard(path, tensors: dict[str, torch.Tensor]) -> None:
    """A shard whose header is intact but whose data is cut short: readable only by a header-only reader."""
    save_file(tensors, path)
    raw = path.read_bytes()
    header_len = struct.unpack("<Q", raw[:8])[0]
    path.write_bytes(raw[: 8 + header_len + 4])


def test_sharded_checkpoint_is_read_from_headers_only(tmp_path):
    text = {"language_model.model.embed_tokens.weight": torch.zeros(100, 64, dtype=torch.bfloat16)}
    vision = {
        "vision_tower.encoder.blocks.0.wqkv.weight": torch.zeros(192, 64, dtype=torch.bfloat16),
        "vision_tower.encoder.blocks.0.wqkv.bias": torch.zeros(192, dtype=torch.float32),
        "mm_projector.proj.0.weight": torch.zeros(256, 256, dtype=torch.bfloat16),
    }
    _truncated_shard(tmp_path / "model-00001-of-00002.safetensors", text)
    _truncated_shard(tmp_path / "model-00002-of-00002.safetensors", vision)
    weight_map = {n: "model-00001-of-00002.safetensors" for n in text}
    weight_map.update({n: "model-00002-of-00002.safetensors" for n in vision})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    with pytest.raises(Exception):
        load_file(tmp_path / "model-00002-of-00002.safetensors")  # the data really is missing
    saved = doctor.text_only_savings(tmp_path)
    assert saved["vision_tower_bytes"] == 192 * 64 * 2 + 192 * 4
    assert saved["mm_projector_bytes"] == 256 * 256 * 2
    assert saved["checkpoint_bytes"] == 100 * 64 * 2 + saved["skipped_bytes"]


def _fake_probe(cpu, strict=False):
    return {"plugin": {"registrations": {}, "failed": []}, "kernel_overrides": [],
            "plugin_group": "sglang.srt.plugins"}, ""  # fmt: skip


def test_doctor_reports_the_savings(monkeypatch, capsys):
    # the SGLang probe (a fresh SGLang process) is covered elsewhere; here only the report
    monkeypatch.setattr(doctor, "probe_registration", _fake_probe)
    cli.main(["doctor", "--model-path", str(TINY_MODEL)])
    text = capsys.readouterr().out
    assert "text-only serving (--language-model-only)" in text
    saved = doctor.text_only_savings(TINY_MODEL)
    assert f"({saved['vision_tower_tensors']} tensors)" in text and "% of the" in text

    cli.main(["doctor", "--model-path", str(TINY_MODEL), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["text_only"] == saved


def test_doctor_names_a_bad_model_path(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(doctor, "probe_registration", _fake_probe)
    assert cli.main(["doctor", "--model-path", str(tmp_path / "nope"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert any("not a local checkpoint folder" in p and "--model-path" in p for p in report["problems"])
