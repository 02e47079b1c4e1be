"""``python -m bmoe.bench``: bmoe against stock llama-cpp-python on one model, in one command.

Modules, each one concern: :mod:`~bmoe.bench.configs` (what runs, in which order),
:mod:`~bmoe.bench.model` (the cached synthetic bench model), :mod:`~bmoe.bench.disk`
(page cache, ``O_DIRECT`` bandwidth), :mod:`~bmoe.bench.cgroup` (the memory limit),
:mod:`~bmoe.bench.memory_fit` (what a memory limit rules out), :mod:`~bmoe.bench.prefill`
(the timed prompt), :mod:`~bmoe.bench.decode` (teacher forcing), :mod:`~bmoe.bench.child`
(one configuration in its process), :mod:`~bmoe.bench.runner` (the parent's side of it),
:mod:`~bmoe.bench.report` (medians, ratios, the outcome), :mod:`~bmoe.bench.checks` (the
greedy tokens' and the routing's verdicts), :mod:`~bmoe.bench.report_markdown` (the table,
its legend, the list under it), :mod:`~bmoe.bench.document` (bench.md, bench.json),
:mod:`~bmoe.bench.chart`, :mod:`~bmoe.bench.progress`, :mod:`~bmoe.bench.arguments` (the
command line), :mod:`~bmoe.bench.run_plan` (the arguments checked together),
:mod:`~bmoe.bench.confinement` (the groups each configuration's process runs in) and
:mod:`~bmoe.bench.main` (the command).
"""
