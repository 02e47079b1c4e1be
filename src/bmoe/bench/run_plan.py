"""The run's plan: the arguments checked together (:func:`make_plan`: configurations, cache
budgets, routing policies, sequence counts, the context and the tokens each configuration
is fed) and the prompt batch's parse (:func:`parse_batch`). ``BenchConfigError`` says what
is wrong."""

from __future__ import annotations

import argparse

import attrs

from bmoe.bench import configs as cf
from bmoe.bench.prefill import AUTO_BATCH, PREFILL_BATCH


@attrs.frozen
class Plan:
    """The validated arguments."""

    kinds: list[str]
    budgets: list[cf.Budget]
    n_ctx: int
    fed: int  # tokens of the text each configuration takes: prompt, warm-up, measure
    prefetch: tuple[int, ...] = ()
    policies: tuple[cf.Policy, ...] = ()
    parallel: tuple[int, ...] = ()  # sequence counts (--parallel); () : the plain bench
    batch: int | str = PREFILL_BATCH  # the prompt's batch, or AUTO_BATCH (streamed: from the room)
    routing_check: bool = True  # the 25% budget added (off: --no-routing-check)

    @property
    def text_tokens(self) -> int:
        """Tokens of text the run needs: each sequence's fed tokens (``--parallel``'s widest)."""
        return self.fed * max(self.parallel or (1,))

    def n_ctx_for(self, config: cf.BenchConfig) -> int:
        """The context of one configuration: several sequences share one KV cache, each
        holding its fed tokens."""
        n = config.parallel or 1
        return self.n_ctx if n == 1 else max(self.n_ctx, -(-n * self.fed // 256) * 256)


def make_plan(args: argparse.Namespace, n_text_tokens: int | None = None) -> Plan:
    """Check the arguments together; ``BenchConfigError`` says what is wrong."""
    kinds = cf.parse_kinds(args.configs)
    budgets = cf.parse_budgets(args.budgets)
    if args.warmup < 0 or args.tokens < 1:
        raise cf.BenchConfigError("need --warmup >= 0 and --tokens >= 1")
    if args.rounds < 1:
        raise cf.BenchConfigError("need --rounds >= 1")
    if args.mem_limit_mb < 0:
        raise cf.BenchConfigError("--mem-limit-mb must be >= 0")
    if args.disk_mib_s < 0 or args.disk_iops < 0:
        raise cf.BenchConfigError("--disk-mib-s and --disk-iops must be >= 0")
    if args.prompt_tokens < 0:
        raise cf.BenchConfigError(f"--prompt-tokens must be >= 0, not {args.prompt_tokens}")
    batch = parse_batch(args.batch_size)
    fed = args.prompt_tokens + args.warmup + args.tokens
    if n_text_tokens is not None and fed > n_text_tokens:
        raise cf.BenchConfigError(
            f"--prompt-tokens + --warmup + --tokens = {fed}, the text holds {n_text_tokens} tokens"
        )
    n_ctx = args.ctx or max(256, fed)
    if n_ctx < fed:
        raise cf.BenchConfigError(
            f"--ctx {n_ctx} cannot hold {fed} fed tokens (--prompt-tokens + --warmup + --tokens)"
        )
    parallel = cf.parse_parallel(args.parallel) if args.parallel.strip() else ()
    policies = cf.parse_policies(args.policies)
    prefetch = cf.parse_prefetch(args.prefetch)
    routing = [pol for pol in policies if pol.name not in cf.CACHE_RULES]
    if parallel and max(parallel) > 1 and (routing or prefetch):
        raise cf.BenchConfigError(
            "--parallel above 1 does not combine with --policies or --prefetch (routing policies "
            "follow one sequence)"
        )
    if parallel and n_text_tokens is not None:
        cf.sequence_texts(list(range(n_text_tokens)), 1, max(parallel), fed)  # refuses a short text
    return Plan(
        kinds=kinds,
        budgets=budgets,
        n_ctx=n_ctx,
        fed=fed,
        prefetch=prefetch,
        policies=policies,
        parallel=parallel,
        batch=batch,
        routing_check=not getattr(args, "no_routing_check", False),
    )


def parse_batch(text: str) -> int | str:
    """``--batch-size``: a count of tokens (at least 1), or ``auto``."""
    if text.strip() == AUTO_BATCH:
        return AUTO_BATCH
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise cf.BenchConfigError(f"--batch-size is a number of tokens (>= 1) or {AUTO_BATCH}, not {text!r}")
    return n
