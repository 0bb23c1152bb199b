"""Where the embedded assets lie (the one place their paths are written): the tiny Kimi-K2.6, its drafters and the
demo's questions. The folders are package data; ``models/tiny.py`` describes the model and
``docs/cpu.md`` how each was made."""

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent
TINY_MODEL = ASSETS_DIR / "tiny-kimi-k2.6"  # the tiny Kimi-K2.6 in Kimi's checkpoint format
TINY_DFLASH = ASSETS_DIR / "tiny-kimi-k2.6-dflash"  # DFlash drafter (z-lab format) trained for the tiny model
TINY_DFLASH2 = ASSETS_DIR / "tiny-kimi-k2.6-dflash2"  # that drafter with a trained candidate selector (DFlash2)
TINY_EAGLE3 = ASSETS_DIR / "tiny-kimi-k2.6-eagle3"  # EAGLE3 drafter (SpecForge format) trained for the tiny model
TINY_K25_DFLASH = ASSETS_DIR / "tiny-kimi-k2.5-dflash"  # a DFlash drafter trained for another target: mismatched
DEMO_QUESTIONS = ASSETS_DIR / "gsm8k_demo.jsonl"  # GSM8K test questions (MIT, GSM8K_LICENSE)
