"""Reference code, not imported by serving: the decode loop that is the oracle of every lossless test
(:mod:`.loop`), the DFlash and EAGLE3 drafter modules used for training and tau benchmarks (:mod:`.dflash`,
:mod:`.eagle3`, their shared :mod:`.layers`), and the compact DeepSeek-V3 (Kimi-K2.6) text model that runs the
tiny target in scripts, benchmarks and tests (:mod:`.deepseek_v3`)."""
