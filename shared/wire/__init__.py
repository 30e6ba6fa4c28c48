"""The wire: what the service and the machines both read, so that both sides agree on what crosses
between them. `messages` (the messages the contract fixes, and the names and reasons it fixes);
`agent_tokens` (the token a machine makes for its COMMAND, which the service checks). It imports
nothing of the service, and the orchestrator imports nothing of `shared/` but this.

May import: nothing else of `shared`.
"""
