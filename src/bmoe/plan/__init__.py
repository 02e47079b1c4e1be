"""``python -m bmoe.plan``: will a MoE model run here, how fast, with which flags, from its
GGUF header and this machine, before it is downloaded (docs/streaming.md, "Before you
download: the plan")."""
