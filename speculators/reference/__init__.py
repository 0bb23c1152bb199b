"""Reference code, not imported by serving: the decode loop that is the oracle of every lossless test
(:mod:`.loop`), the DFlash and EAGLE3 drafter modules used for training and tau benchmarks (:mod:`.dflash`,
:mod:`.eagle3`, their shared :mod:`.layers`)."""
