"""`devpilot-agent NAME [AGENT_ARG]...`: the coding agents' CLIs run as a COMMAND, their work
streamed into the Linear agent session.

A runner is a COMMAND like any other: it reads its message on stdin and uses only what the
orchestrator gives every COMMAND (the `DEVPILOT_*` environment, the inbox, the transcript, the
`activity` and `plan` routes). Each agent is one module of `orchestrator.runners` with a
`run(agent_args, options) -> exit code`; what every agent shares is a module of one job each:

- `narrator`: what Linear is told, within its budget (thoughts merged, progress `ephemeral`,
  results bounded), through `orchestrator.voice`;
- `inbox`: the follow-ups that arrive while the agent works, oldest first, removed once taken in;
- `store`: the agent's own session (or thread) id and state, kept in the conversation's folder;
- `child`: the agent's CLI as a child that dies with the runner, in a process group of its own
  (Linear's stop reaches the runner, which interrupts the agent and lets it end cleanly);
- `asks`: what the agent asks the person, one `elicitation` at a time, answered by follow-ups;
- `lines`: the CLI as a child that speaks JSON lines (its stderr kept to name a crash's cause);
- `runner`: what every runner does around its CLI (`Runner`, subclassed by each agent).

`claude` (Claude Code) is `orchestrator.runners.claude` (the process and the conversation) with
`orchestrator.runners.claude_stream` (its stream-json events, mapped); `codex` (Codex) is
`orchestrator.runners.codex` (its app-server, spoken to in JSON-RPC) with
`orchestrator.runners.codex_events` (its notifications, mapped).
"""

from __future__ import annotations

# NAME -> its module; each has `run(agent_args: list[str], options: runner.Options) -> int`.
AGENTS = {"claude": "orchestrator.runners.claude", "codex": "orchestrator.runners.codex"}
