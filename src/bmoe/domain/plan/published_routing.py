"""Hit rates that real models' routing gave an expert cache, as published: the plan's upper
guess for a model of a family it has such figures for.

A header says nothing of how a model routes; a random router's cache hits its share of the
experts, a real one's far more (consecutive tokens come back to experts used lately). The
figures below are decode routing of real models replayed through an LRU cache, the hit rate
by the share of all the experts the cache holds (boyle 0.2.1, Apache-2.0, its
``boyle/data/curves.json``; ``shared/design/references.md``, "Real routing"). A model of the
same family is read off its family's curve at its own cache share, as the source reads it
(the share, not the bytes: the curve is the same at 4 and 8 bits); between two points the
curve is taken as a straight line, below the first as a line from nothing cached (0 hits),
above the last as its last point.

These are one family member's figures, not this model's: the plan shows them as the upper
end of a range whose lower end is the uniform floor, each named.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class PublishedCurve:
    """A real model's LRU hit rate by the share of the experts cached (``points``: share,
    hit rate; ascending shares)."""

    name: str
    points: tuple[tuple[float, float], ...]

    def hit_rate(self, share: float) -> float:
        """The curve at ``share`` (module docstring: straight lines between the points)."""
        if share <= 0.0:
            return 0.0
        below = (0.0, 0.0)
        for point in self.points:
            if share <= point[0]:
                (s0, h0), (s1, h1) = below, point
                return h0 + (h1 - h0) * (share - s0) / (s1 - s0)
            below = point
        return self.points[-1][1]


QWEN3_235B = PublishedCurve(
    "Qwen3-235B-A22B's decode routing (LRU replay, boyle 0.2.1)",
    (
        (0.05, 0.339),
        (0.08, 0.466),
        (0.12, 0.580),
        (0.16, 0.666),
        (0.20, 0.743),
        (0.25, 0.800),
        (0.30, 0.843),
        (0.36, 0.886),
        (0.45, 0.933),
        (0.55, 0.961),
        (1.00, 0.979),
    ),
)
QWEN35_397B = PublishedCurve(
    "Qwen3.5-397B-A17B's decode routing (LRU replay, boyle 0.2.1)",
    ((0.05, 0.415), (0.12, 0.582), (0.25, 0.755), (0.36, 0.828), (1.00, 0.894)),
)
GLM_52 = PublishedCurve(
    "GLM-5.2's decode routing (LRU replay, boyle 0.2.1)",
    ((0.05, 0.303), (0.12, 0.501), (0.25, 0.667), (0.36, 0.761), (1.00, 0.924)),
)
GEMMA4_26B = PublishedCurve(
    "Gemma-4-26B-A4B's decode routing (measured live, boyle 0.2.1)",
    ((0.125, 0.532), (0.25, 0.761), (0.50, 0.882)),
)

# llama.cpp's architecture name -> the published curve of its family
FAMILY_CURVES: dict[str, PublishedCurve] = {
    "qwen3moe": QWEN3_235B,
    "qwen3vlmoe": QWEN3_235B,
    "qwen2moe": QWEN3_235B,
    "qwen35moe": QWEN35_397B,
    "qwen3next": QWEN35_397B,
    "glm4moe": GLM_52,
    "gemma4": GEMMA4_26B,
}


def family_curve(arch: str) -> PublishedCurve | None:
    """The published curve of ``arch``'s family, where there is one."""
    return FAMILY_CURVES.get(arch)
