"""The ``sglang-kimi`` command: serve launcher, demo, doctor, audit, and the eval / bench / tuning commands."""
