"""The planner's pure part: a model's figures read from its header, this machine's, and the
prediction made from them (``python -m bmoe.plan``; docs/streaming.md, "Before you
download: the plan")."""
