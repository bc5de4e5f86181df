"""Fill holes: the plain functions behind the ``diffu.fillHoles`` command and its code action.

A daemon that lists the ``holes`` feature fills every hole of the prompt in one diffusion run
(``/v1/diffu/generate`` with the masks inside the prompt and no canvas; the typed client's ``Done.holes``
carries one fill per hole). An older one is asked once per hole, left to right, each run seeing the fills
before it and the other holes as masks. Either way every hole of the document, selected or not, is a
mask the model sees; only the selection's fills are returned, each through
:func:`assistant.infill.holes.finish_fill` (the hole logic ``diffu fill`` and the chat share).
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from assistant.infill.context import header_line, window
from assistant.infill.holes import MASK, Hole, HolePrompt, finish_fill, masked_prompt, target_fills
from lsp.settings import Settings, context_budget

if TYPE_CHECKING:
    from assistant.client import AsyncClient, Done
    from lsp.daemon_link import DaemonLink


@dataclass(frozen=True)
class HoleDocument:
    """The document whose holes are filled, as the prompt names it."""

    text: str
    path: str
    language: str


@dataclass(frozen=True)
class Filler:
    """One fill-holes run: the daemon (link and connected client), the document, settings and session."""

    link: DaemonLink
    client: AsyncClient
    doc: HoleDocument
    settings: Settings
    session: str

    async def fill(self, targets: list[Hole], others: list[Hole]) -> list[str]:
        """The finished fill of each target, in order ("" where the model gave nothing worth inserting)."""
        if "holes" in self.link.features:
            return await self._one_run(targets, others)
        return await self._in_turn(targets, others)

    def _options(self, tokens: int) -> dict[str, Any]:
        """The typed client's options for a fill of ``tokens`` masks: one step per mask unless set."""
        s = self.settings
        return {
            "sampling": s.request_sampling(s.steps or tokens),
            "session": self.session,
            "max_seconds": s.max_seconds,
        }

    async def _one_run(self, targets: list[Hole], others: list[Hole]) -> list[str]:
        prompts: list[HolePrompt] = []
        doc = self.doc

        def build() -> tuple[int, Awaitable[Done]]:
            budget = self.link.budget_chars(context_budget(self.settings), 0)
            prompt = masked_prompt(
                doc.text, targets, others=others, path=doc.path, language=doc.language, budget_chars=budget
            )
            prompts.append(prompt)
            options = self._options(sum(h.tokens for h in prompt.holes))
            return len(prompt.text), self.client.generate(prompt=prompt.text, max_new_tokens=0, **options)

        done = await self.link.fitting(build)
        return target_fills(doc.text, prompts[-1], targets, done.holes)

    async def _in_turn(self, targets: list[Hole], others: list[Hole]) -> list[str]:
        header = header_line(self.doc.path, self.doc.language)
        holes = sorted({*targets, *others}, key=lambda h: h.start)
        filled: dict[Hole, str] = {}
        for target in targets:
            before, after = _split_at(self.doc.text, holes, target, filled)

            def build(before: str = before, after: str = after, target: Hole = target) -> tuple[int, Any]:
                budget = self.link.budget_chars(context_budget(self.settings), target.tokens) - len(header)
                pre, suf, _ = window(before, after, max(budget, 0), 0.7)
                options = self._options(target.tokens)
                request = self.client.infill(header + pre, suf, canvas_tokens=target.tokens, **options)
                return len(header) + len(pre) + len(suf), request

            done: Done = await self.link.fitting(build)
            filled[target] = finish_fill(done.text, self.doc.text, target)
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
