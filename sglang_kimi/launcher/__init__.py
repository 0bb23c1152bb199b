"""Starting SGLang servers and being their client, for the commands, the evals, the kernels' tuner and the tests:
what is checked before a start (:mod:`.checks`: model path, port, hub), the server process and the launch command
(:mod:`.server`), the API key the plugin's clients send (:mod:`.api_key`), reading a server's JSON routes with
one message per failure (:mod:`.client`), the plugin's ``/server_info`` report read over a server's data-parallel
ranks (:mod:`.dp_reports`) and over the workers behind ``sglang-router`` (:mod:`.router`). The ``sglang-kimi``
command line (``cli/``) is built on it; nothing here imports ``cli/``."""
