"""What the agent asks the person (a permission prompt, a question), asked in Linear: one
`elicitation` at a time, oldest first (the person's answers arrive as follow-ups, in order), with
Linear's `select` where there are options; each is answered by the next follow-up, or is overdue
after `--approval-timeout`. What an answer means to the agent is the runner's."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from orchestrator.runners.narrator import Narrator

ALLOW, DENY = "Allow", "Deny"
YES = {"allow", "yes", "y", "ok", "approve", "approved", "go", "go ahead", "allow it"}
NO = {"deny", "no", "n", "denied", "don't", "do not", "stop", "reject"}

R = TypeVar("R")  # the agent's own request, which the runner answers


def in_words(seconds: float) -> str:
    """A wait, as the person reads it: `2 seconds`, `15 minutes`."""
    return f"{seconds:g} seconds" if seconds < 120 else f"{seconds / 60:.0f} minutes"


def verdict(said: str) -> bool | None:
    """The person's answer to Allow / Deny: True, False, or None (other words)."""
    word = said.lower().strip(" .!")
    return True if word in YES else False if word in NO else None


@dataclass(frozen=True)
class Question:
    body: str
    options: list[str]


def choice(question: str, options: list[Any]) -> Question:
    """A question with options (`label`, `description`) as Linear asks it: the labels as the
    select, the descriptions in the text."""
    given = [o for o in options if isinstance(o, dict)]
    notes = "\n".join(
        f"- **{o.get('label')}**: {o.get('description')}" for o in given if o.get("description")
    )
    return Question(question + (f"\n\n{notes}" if notes else ""), [str(o.get("label")) for o in given])


@dataclass
class Ask(Generic[R]):
    request: R
    questions: list[Question]
    deadline: float
    answers: list[str] = field(default_factory=list)
    posted: bool = False

    @property
    def current(self) -> Question | None:
        return self.questions[len(self.answers)] if len(self.answers) < len(self.questions) else None


class Asks(Generic[R]):
    def __init__(self, narrator: Narrator, timeout: float) -> None:
        self.narrator = narrator
        self.timeout = timeout
        self.waiting: deque[Ask[R]] = deque()

    def __bool__(self) -> bool:
        return bool(self.waiting)

    @property
    def waited(self) -> str:
        """The timeout, as the person reads it."""
        return in_words(self.timeout)

    def add(self, request: R, questions: list[Question]) -> None:
        self.waiting.append(Ask(request, questions, time.monotonic() + self.timeout))
        self.post()

    def withdraw(self, which: Callable[[R], bool]) -> None:
        """The agent no longer waits for these (it withdrew the request)."""
        self.waiting = deque(a for a in self.waiting if not which(a.request))
        self.post()

    def answer(self, said: str) -> Ask[R] | None:
        """The person's answer to the oldest ask's question (an option's label, matched without case,
        or their own words); the ask, once all its questions have answers (the runner answers the
        agent, then `post`s the next)."""
        ask = self.waiting[0]
        question = ask.current
        assert question is not None
        ask.answers.append(next((o for o in question.options if o.lower() == said.lower()), said))
        if ask.current is not None:  # the next question of the same ask
            ask.posted = False
            self.post()
            return None
        return self.waiting.popleft()

    def overdue(self) -> Ask[R] | None:
        """The oldest ask, if Linear has shown it for `timeout` without an answer (taken out)."""
        if self.waiting and self.waiting[0].posted and time.monotonic() >= self.waiting[0].deadline:
            return self.waiting.popleft()
        return None

    def post(self) -> None:
        """Ask the oldest waiting question in Linear, if not yet."""
        if not self.waiting or self.waiting[0].posted:
            return
        ask = self.waiting[0]
        ask.posted = True
        question = ask.current
        assert question is not None
        self.narrator.ask(question.body, question.options)
