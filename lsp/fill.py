"""Fill holes: the plain functions behind the ``diffu.fillHoles`` command and its code action.

A daemon that lists the ``holes`` feature fills every hole of the prompt in one diffusion run
(``/v1/diffu/generate`` with the masks inside the prompt and no canvas; the typed client's ``Done.holes``
carries one fill per hole). An older one is asked once per hole, left to right, each run seeing the fills
before it and the other holes as masks. Either way every hole of the document, selected or not, is a
mask the model sees; only the selection's fills are returned, each through :func:`holes.finish_fill`.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lsp.context import header_line, window
from lsp.holes import MASK, Hole, HoleError, HolePrompt, finish_fill, masked_prompt
from lsp.settings import Settings

if TYPE_CHECKING:
    from assistant.client import AsyncClient, Done
    from lsp.daemon_link import DaemonLink


@dataclass(frozen=True)
class HoleDocument:
    """The document whose holes are filled, as the prompt names it."""

    text: str
    path: str
    language: str


def _request_options(settings: Settings, tokens: int, session: str) -> dict[str, Any]:
    """The typed client's options for a fill of ``tokens`` masks: one step per mask unless set."""
    from assistant.client import SamplingOptions

    return {
        "sampling": SamplingOptions(steps=settings.steps or tokens, temperature=settings.temperature),
        "session": session,
        "max_seconds": settings.max_seconds,
    }


async def fill_holes(
    link: DaemonLink,
    client: AsyncClient,
    doc: HoleDocument,
    targets: list[Hole],
    others: list[Hole],
    settings: Settings,
    session: str,
) -> list[str]:
    """The finished fill of each target, in order ("" where the model gave nothing worth inserting)."""
    if "holes" in link.features:
        raw = await _one_run(link, client, doc, targets, others, settings, session)
        return [finish_fill(text, doc.text, hole) for text, hole in zip(raw, targets, strict=True)]
    return await _in_turn(link, client, doc, targets, others, settings, session)


async def _one_run(
    link: DaemonLink,
    client: AsyncClient,
    doc: HoleDocument,
    targets: list[Hole],
    others: list[Hole],
    settings: Settings,
    session: str,
) -> list[str]:
    prompts: list[HolePrompt] = []

    def build() -> tuple[int, Awaitable[Done]]:
        prompt = masked_prompt(
            doc.text,
            targets,
            others=others,
            path=doc.path,
            language=doc.language,
            budget_chars=link.budget_chars(settings.context_tokens, 0),
        )
        prompts.append(prompt)
        total = sum(h.tokens for h in prompt.holes)
        request = client.generate(
            prompt=prompt.text, max_new_tokens=0, **_request_options(settings, total, session)
        )
        return len(prompt.text), request

    done = await link.fitting(build)
    holes = prompts[-1].holes
    if done.holes is None or len(done.holes) != len(holes):
        got = "none" if done.holes is None else str(len(done.holes))
        raise HoleError(
            f"the daemon filled {got} holes of the {len(holes)} sent; holes that touch are one run of "
            "masks to the model: put a space or a line between them"
        )
    fills = dict(zip(holes, done.holes, strict=True))
    return [fills[h] for h in targets]


async def _in_turn(
    link: DaemonLink,
    client: AsyncClient,
    doc: HoleDocument,
    targets: list[Hole],
    others: list[Hole],
    settings: Settings,
    session: str,
) -> list[str]:
    header = header_line(doc.path, doc.language)
    holes = sorted({*targets, *others}, key=lambda h: h.start)
    filled: dict[Hole, str] = {}
    for target in targets:
        before, after = _split_at(doc.text, holes, target, filled)

        def build(before: str = before, after: str = after, target: Hole = target) -> tuple[int, Any]:
            budget = link.budget_chars(settings.context_tokens, target.tokens) - len(header)
            pre, suf, _ = window(before, after, max(budget, 0), 0.7)
            request = client.infill(
                header + pre,
                suf,
                canvas_tokens=target.tokens,
                **_request_options(settings, target.tokens, session),
            )
            return len(header) + len(pre) + len(suf), request

        done: Done = await link.fitting(build)
        filled[target] = finish_fill(done.text, doc.text, target)
    return [filled[t] for t in targets]


def _split_at(text: str, holes: list[Hole], target: Hole, filled: dict[Hole, str]) -> tuple[str, str]:
    """The text before and after ``target``: earlier fills applied, every other hole a run of masks."""
    before: list[str] = []
    after: list[str] = []
    side, pos = before, 0
    for hole in holes:
        side.append(text[pos : hole.start])
        if hole == target:
            side = after
        elif filled.get(hole):
            side.append(filled[hole])
        else:
            side.append(MASK * hole.tokens)
        pos = hole.end
    side.append(text[pos:])
    return "".join(before), "".join(after)
