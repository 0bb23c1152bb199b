"""The SGLang side of speculative decoding: the workers SGLang runs (DFLASH trees and adaptive widths, EAGLE3 trees,
exact penalties and lossless sampling hooks), the adaptive runtime, the start-up checks of speculative launches and
the acceptance metrics.

Its twin by name, ``speculators/`` (installed as ``sglang_kimi.speculators``), holds the algorithms themselves in
pure PyTorch with no SGLang import: the DDTree build, verification, the adaptive policy, drafter configs. This
package adapts them to SGLang's batches, KV cache and graphs; the algorithms never import it."""
