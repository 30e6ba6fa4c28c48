"""What the person in Linear is told while an agent works, agent-neutral, within Linear's budget.

Linear allows a workspace about 5,000 requests an hour, shared by every session; an agent that
posts each step can spend 150-200 of them on one session. So:
- consecutive texts of the agent are one `thought` (posted when the agent does something else);
  its last text is the `response`;
- a tool call is one `action` with its result (the first lines, bounded), posted when the result
  is in; only a call still running after a few seconds is shown meanwhile, `ephemeral` (Linear
  replaces it with the next activity);
- the plan is posted once per change the agent makes in one go (when it next does something
  else), and notices that a later activity replaces (the model's API retrying) are `ephemeral`.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from orchestrator.client import Rejected, Unreachable
from orchestrator.voice import Voice

THOUGHT_CHARS = 2_000
RESPONSE_CHARS = 20_000
RESULT_LINES = 6
RESULT_CHARS = 600
PARAMETER_CHARS = 200
RUNNING_AFTER = 3.0  # seconds before a tool call without a result is shown as running


def bounded(text: str, chars: int) -> str:
    text = text.strip()
    return text if len(text) <= chars else text[: chars - 1].rstrip() + "…"


def one_line(text: str, chars: int = PARAMETER_CHARS) -> str:
    """A parameter as Linear shows it beside the action: its first line, bounded."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    first = lines[0].strip() if lines else ""
    return bounded(first + (" …" if len(lines) > 1 else ""), chars)


def first_lines(text: str) -> str:
    """A result as Linear shows it under the action: its first lines, bounded."""
    lines = text.strip("\n").splitlines()
    head = "\n".join(lines[:RESULT_LINES])
    more = len(lines) - RESULT_LINES
    cut = bounded(head, RESULT_CHARS)
    return cut + (f"\n… ({more} more line{'s' if more > 1 else ''})" if more > 0 else "")


@dataclass
class Running:
    name: str
    parameter: str
    since: float
    shown: bool = False  # posted as running (ephemeral)
    held: bool = False  # waiting for the person's approval: not shown as running meanwhile


class Narrator:
    def __init__(self, speaker: Voice | None) -> None:
        """`speaker` None: nobody to tell (no agent session): everything goes to stderr only."""
        self.speaker = speaker
        self.texts: list[str] = []
        self.running: dict[str, Running] = {}
        self.steps: list[dict[str, str]] | None = None  # a plan not yet posted
        self.posted: Counter[str] = Counter()  # what went to Linear, by kind (measured)

    # --- the agent's stream ---------------------------------------------------------------------
    def text(self, text: str) -> None:
        if text.strip():
            self.texts.append(text.strip())

    def action_started(self, key: str, name: str, parameter: str) -> None:
        self._thought()
        self._plan()
        self.running[key] = Running(name, one_line(parameter), time.monotonic())

    def action_finished(self, key: str, result: str, is_error: bool = False) -> None:
        run = self.running.pop(key, None)
        if run is None:
            return
        self._plan()
        shown = first_lines(result) if result.strip() else "(no output)"
        content = {"type": "action", "action": run.name, "parameter": run.parameter, "result": shown}
        if is_error:
            content["result"] = "Error: " + shown
        self._say(content)

    def hold(self, key: str) -> None:
        """The action waits for the person's approval (asked in an elicitation)."""
        if key in self.running:
            self.running[key].held = True

    def plan(self, steps: list[dict[str, str]]) -> None:
        self.steps = steps

    def tick(self) -> None:
        """Show the tool calls that have run a while without a result (once each, ephemeral)."""
        now = time.monotonic()
        for run in self.running.values():
            if not run.shown and not run.held and now - run.since >= RUNNING_AFTER:
                run.shown = True
                self._thought()
                self._plan()
                content = {"type": "action", "action": run.name, "parameter": run.parameter}
                self._say(content, ephemeral=True)

    # --- telling the person ---------------------------------------------------------------------
    def note(self, body: str, ephemeral: bool = False) -> None:
        """A thought of the runner's own (an approval's outcome, the model's API retrying)."""
        self._thought()
        self._plan()
        self._say({"type": "thought", "body": bounded(body, THOUGHT_CHARS)}, ephemeral=ephemeral)

    def ask(self, body: str, options: list[str]) -> None:
        """An elicitation; with options, Linear's `select` (the person's pick comes as a follow-up)."""
        self._thought()
        self._plan()
        signal = "select" if options else None
        metadata = {"options": [{"label": o, "value": o} for o in options]} if options else None
        self._say(
            {"type": "elicitation", "body": bounded(body, THOUGHT_CHARS)}, signal=signal, metadata=metadata
        )

    def turn_done(self, last: str) -> None:
        """A turn ended and another follows at once (a follow-up came meanwhile): its last text is a
        thought, not the response that would complete the session in Linear."""
        if not self.texts and last.strip():
            self.texts.append(last.strip())
        self._thought()

    def finish(self, last: str) -> None:
        """The agent's answer: its last texts (or the result's), as the `response`."""
        self._plan()
        body = "\n\n".join(self.texts) or last.strip() or "Done."
        self.texts = []
        self._say({"type": "response", "body": bounded(body, RESPONSE_CHARS)})

    def fail(self, reason: str) -> None:
        """The run failed: an `error` naming the cause (what the agent had said goes first, as a thought)."""
        self._thought()
        self._plan()
        self._say({"type": "error", "body": bounded(reason, RESPONSE_CHARS)})

    def flush(self) -> None:
        """What is still unsaid (the agent stopped mid-way): its texts and its plan."""
        self._thought()
        self._plan()

    # --- posting --------------------------------------------------------------------------------
    def _thought(self) -> None:
        if self.texts:
            body = bounded("\n\n".join(self.texts), THOUGHT_CHARS)
            self.texts = []
            self._say({"type": "thought", "body": body})

    def _plan(self) -> None:
        if self.steps is None:
            return
        steps, self.steps = self.steps, None
        self.posted["plan"] += 1
        if self.speaker is None:
            print(f"devpilot-agent: plan {steps}", file=sys.stderr)
            return
        try:
            status = self.speaker.plan(steps)
        except (Unreachable, Rejected) as exc:
            status = str(exc)
        if status != "queued":
            print(f"devpilot-agent: the plan was not posted: {status}", file=sys.stderr)

    def _say(
        self,
        content: dict[str, Any],
        ephemeral: bool = False,
        signal: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.posted[content["type"] + (" (ephemeral)" if ephemeral else "")] += 1
        if self.speaker is None:
            print(f"devpilot-agent: {content}", file=sys.stderr)
            return
        try:
            status = self.speaker.say(content, signal=signal, signal_metadata=metadata, ephemeral=ephemeral)
        except (Unreachable, Rejected) as exc:
            status = str(exc)
        if status != "queued":
            print(f"devpilot-agent: a {content['type']} was not posted: {status}", file=sys.stderr)

    def summary(self) -> str:
        """What went to Linear (for the log): counts by kind."""
        total = sum(self.posted.values())
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(self.posted.items()))
        return f"posted {total} update(s) to Linear ({kinds or 'none'})"
