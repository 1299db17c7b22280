"""Just enough of a Dockerfile reader for the tests: stages, their base, COPY sources,
and what a target inherits (USER, ENTRYPOINT, CMD) from the stage it is built FROM."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Stage:
    name: str
    base: str  # an image reference, or the name of an earlier stage
    parent: Stage | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def last(self, instruction: str) -> str | None:
        """The argument of the last `instruction` here or in the stages it builds on."""
        for name, argument in reversed(self.instructions):
            if name == instruction:
                return argument
        return self.parent.last(instruction) if self.parent else None

    def image(self) -> str:
        """The external image this stage ultimately starts from."""
        return self.parent.image() if self.parent else self.base

    def entry_command(self) -> list[str]:
        """ENTRYPOINT followed by CMD, both in exec (JSON) form: what the container runs.
        A CMD in a stage of its own replaces an inherited one; an ENTRYPOINT resets CMD."""
        entrypoint = _exec_form(self.last("ENTRYPOINT"))
        cmd = _exec_form(self._cmd())
        return entrypoint + cmd

    def _cmd(self) -> str | None:
        for name, argument in reversed(self.instructions):
            if name == "CMD":
                return argument
            if name == "ENTRYPOINT":
                return None
        return self.parent._cmd() if self.parent else None

    def copy_sources(self) -> list[str]:
        """Build-context paths of this stage's COPY instructions (not --from=...)."""
        sources: list[str] = []
        for name, argument in self.instructions:
            if name != "COPY":
                continue
            words = argument.split()
            if any(word.startswith("--from=") for word in words):
                continue
            paths = [word for word in words if not word.startswith("--")]
            sources.extend(path.rstrip("/") for path in paths[:-1])
        return sources


def _exec_form(argument: str | None) -> list[str]:
    if argument is None:
        return []
    parsed = json.loads(argument)
    assert isinstance(parsed, list), f"expected exec form (a JSON array): {argument}"
    return [str(word) for word in parsed]


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, argument) pairs, comments dropped and continuations joined."""
    joined = re.sub(
        r"\\\n",
        " ",
        "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")),
    )
    pairs = []
    for line in joined.splitlines():
        if line.strip():
            name, _, argument = line.strip().partition(" ")
            pairs.append((name.upper(), " ".join(argument.split())))
    return pairs


def stages(path: Path) -> dict[str, Stage]:
    by_name: dict[str, Stage] = {}
    current: Stage | None = None
    for name, argument in instructions(path.read_text()):
        if name == "FROM":
            words = [word for word in argument.split() if not word.startswith("--")]
            base = words[0]
            stage_name = words[2] if len(words) == 3 and words[1].upper() == "AS" else ""
            current = Stage(stage_name or str(len(by_name)), base, by_name.get(base))
            by_name[current.name] = current
        else:
            assert current is not None, f"{name} before FROM in {path}"
            current.instructions.append((name, argument))
    return by_name
