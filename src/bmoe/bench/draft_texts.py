"""The transcripts ``bench --draft copy`` feeds: an agent's edit, and prose with no copies.

No model here copies as a real coding model does, so the replies are written out and fed
(teacher-forced): what drafting costs and saves on a reply that copies its context as an
agent's does. Both are built from the bench's own English text (:mod:`bmoe.bench.text`),
whose words the trained bench model learned (it knows English prose, not code: its
tokenizer has no merges for indentation).

- ``agent_edit``: the agent read a file, then edits it: an ``edit_file`` call whose
  ``old_str`` repeats a paragraph of the file and whose ``new_str`` repeats the same with a
  change, then the same for a second passage, as Claude Code's and Codex's edit tools ask.
- ``plain``: a reply of prose that does not repeat its prompt on purpose (the text's later
  last paragraph after its first three): drafting must not cost here.
"""

from __future__ import annotations

import attrs

from bmoe.bench.text import TEXT


@attrs.frozen
class Transcript:
    """A prompt and the reply fed after it."""

    name: str
    prompt: str
    reply: str


def _paragraphs() -> list[str]:
    return [" ".join(p.split()) for p in TEXT.split("\n\n") if p.strip()]


def _edit_call(path: str, old: str, new: str) -> str:
    return f'edit_file(path="{path}", old_str="{old}", new_str="{new}")\n'


def agent_edit() -> Transcript:
    """A file read, then two edits copying its passages (see the module's docstring)."""
    paras = _paragraphs()
    file_text = "\n\n".join(paras[:4])
    prompt = (
        "You are a coding agent. Edit files with edit_file(path, old_str, new_str).\n"
        "User: in harbour.txt, the wall was raised by two metres, not one, and the meeting "
        "ended at one in the morning.\n"
        'Assistant: read_file(path="harbour.txt")\n'
        f"Tool: {file_text}\n"
        "Assistant: "
    )
    plan = paras[3]
    meeting = paras[3].split(". ")
    first = ". ".join(meeting[:3]) + "."
    second = ". ".join(meeting[5:8])
    reply = (
        _edit_call("harbour.txt", first, first.replace("by a metre", "by two metres"))
        + "Tool: ok\nAssistant: "
        + _edit_call("harbour.txt", second, second.replace("until midnight", "until one in the morning"))
        + "Tool: ok\nAssistant: Both changes are made. The paragraph now reads:\n"
        + plan.replace("by a metre", "by two metres").replace("until midnight", "until one in the morning")
    )
    return Transcript("agent edit", prompt, reply)


def plain() -> Transcript:
    """Prose after prose: the text's first three paragraphs, then its last."""
    paras = _paragraphs()
    return Transcript("plain prose", "\n\n".join(paras[:3]) + "\n\n", paras[-1])


def transcripts() -> list[Transcript]:
    return [agent_edit(), plain()]
