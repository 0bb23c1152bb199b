"""The ``sglang-kimi`` command: serve, demo, doctor, audit, and the eval / bench / tuning commands. It sits on top of
every area and no area imports it: the launch machinery it shares with the evals and the tests is ``launcher/``."""
