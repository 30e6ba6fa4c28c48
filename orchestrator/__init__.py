"""The reference orchestrator: takes this machine's work from devpilot-dispatch over HTTP only.

Delivery over the network is at-least-once; this process makes the *start* exactly-once on one
machine with a small journal in its state directory (see journal.py). Start reading at `cli` (the
command line and its table of subcommands) and `loop` (the run, and the rooms it is made of). Of
the service, it imports only the wire (`shared.wire`).
"""
